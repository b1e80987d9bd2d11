import type { TestProject } from 'vitest/node';
import { resolveStack, type Stack } from '../../cli/stack/resolve.js';

declare module 'vitest' {
  export interface ProvidedContext {
    databaseUrl: string;
    kafkaBrokers: string;
    /** True when the broker is the local one this run may stop and restart. */
    kafkaLocal: boolean;
  }
}

let stack: Stack | undefined;

/** Finds (or starts) Postgres and Kafka once for the whole run: see cli/stack/resolve.ts. */
export async function setup(project: TestProject): Promise<void> {
  stack = await resolveStack((line) => console.log(`[cairn stack] ${line}`));
  console.log(`[cairn stack] postgres from ${stack.source.postgres}, kafka from ${stack.source.kafka}`);
  project.provide('databaseUrl', stack.databaseUrl);
  project.provide('kafkaBrokers', stack.kafkaBrokers);
  project.provide('kafkaLocal', stack.source.kafka.startsWith('local'));
}

export async function teardown(): Promise<void> {
  await stack?.stop();
}
