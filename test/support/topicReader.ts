import { randomUUID } from 'node:crypto';
import type { Kafka } from 'kafkajs';

export interface ReadMessage {
  key: string;
  value: string;
  headers: Record<string, string>;
  partition: number;
  offset: string;
}

/**
 * Reads a topic from the beginning with a fresh group until `done(messages)` holds or the
 * deadline passes (then it returns what it has; the caller's assertions say what was missing).
 */
export async function readTopic(
  kafka: Kafka,
  topic: string,
  done: (messages: ReadMessage[]) => boolean,
  deadlineMs = 60_000,
): Promise<ReadMessage[]> {
  const consumer = kafka.consumer({ groupId: `reader-${randomUUID()}`, maxWaitTimeInMs: 100 });
  const messages: ReadMessage[] = [];
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let resolve!: () => void;
  const finished = new Promise<void>((r) => {
    resolve = r;
  });
  await consumer.run({
    eachMessage: async ({ message, partition }) => {
      const headers: Record<string, string> = {};
      for (const [k, v] of Object.entries(message.headers ?? {})) headers[k] = String(v);
      messages.push({
        key: message.key?.toString() ?? '',
        value: message.value?.toString() ?? '',
        headers,
        partition,
        offset: message.offset,
      });
      if (done(messages)) resolve();
    },
  });
  const timer = setTimeout(resolve, deadlineMs);
  await finished;
  clearTimeout(timer);
  await consumer.disconnect();
  return messages;
}

/** Waits until `check()` is true, polling; throws with `what` after the deadline. */
export async function waitFor(
  what: string,
  check: () => Promise<boolean> | boolean,
  deadlineMs = 60_000,
): Promise<void> {
  const until = Date.now() + deadlineMs;
  while (Date.now() < until) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out after ${deadlineMs} ms waiting for ${what}`);
}
