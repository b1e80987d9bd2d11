import { ConfigurationError } from '../errors.js';

/**
 * `@confluentinc/kafka-javascript` is an optional peer dependency: its install builds
 * librdkafka (a prebuilt binary, or minutes of C compiling), so `npm ci` never needs it and
 * nothing here names its types (they are not there to check against without it). These are
 * the few parts of its API the adapters use.
 */
export type RdKafkaError = Error & {
  code: number;
  origin?: string;
};

export interface DeliveryReport {
  topic: string;
  partition: number;
  offset: number;
  opaque: unknown;
}

export interface RdKafkaProducer {
  connect(options: { timeout: number }, cb: (err: RdKafkaError | null) => void): void;
  setPollInBackground(on: boolean): void;
  on(event: 'delivery-report', cb: (err: RdKafkaError | null, report: DeliveryReport) => void): void;
  on(event: 'event.error', cb: (err: RdKafkaError) => void): void;
  produce(
    topic: string,
    partition: number,
    value: Buffer,
    key: string,
    timestamp: number,
    opaque: unknown,
    headers: Array<Record<string, string>>,
  ): void;
  flush(timeoutMs: number, cb: (err: RdKafkaError | null) => void): void;
  disconnect(timeoutMs: number, cb: (err: RdKafkaError | null) => void): void;
}

export interface KafkaJsBatchPayload {
  batch: {
    topic: string;
    partition: number;
    messages: Array<{
      key: Buffer | null;
      value: Buffer | null;
      offset: string;
      timestamp: string;
      headers?: Record<string, Buffer | string | Array<Buffer | string>>;
    }>;
  };
  isRunning(): boolean;
  isStale(): boolean;
  resolveOffset(offset: string): void;
}

export interface KafkaJsConsumer {
  connect(): Promise<void>;
  subscribe(s: { topics: string[] }): Promise<void>;
  run(c: {
    eachBatch: (payload: KafkaJsBatchPayload) => Promise<void>;
    eachBatchAutoResolve: boolean;
    partitionsConsumedConcurrently: number;
  }): Promise<void>;
  commitOffsets(offsets: Array<{ topic: string; partition: number; offset: string }>): Promise<void>;
  assignment(): Array<{ topic: string; partition: number }>;
  disconnect(): Promise<void>;
}

export interface ConfluentModule {
  Producer: new (config: Record<string, unknown>) => RdKafkaProducer;
  KafkaJS: {
    Kafka: new (
      config: Record<string, unknown>,
    ) => {
      consumer(config: Record<string, unknown>): KafkaJsConsumer;
    };
  };
}

export const CONFLUENT_MODULE = '@confluentinc/kafka-javascript';

let loaded: Promise<ConfluentModule> | undefined;

/**
 * Imports the client the first time an adapter needs it. Without it, a ConfigurationError that
 * says how to install it (an install that will never appear by waiting).
 */
export function loadConfluent(specifier: string = CONFLUENT_MODULE): Promise<ConfluentModule> {
  const load = async () => {
    try {
      const mod = (await import(specifier)) as { default?: ConfluentModule } & ConfluentModule;
      return mod.default ?? mod;
    } catch (err) {
      throw new ConfigurationError(
        `the Kafka client "confluent" needs ${specifier}, which could not be loaded ` +
          `(${(err as Error).message.split('\n')[0]}): install it beside Cairn with ` +
          `\`npm install ${CONFLUENT_MODULE}@1\` (it builds librdkafka when no prebuilt binary can be ` +
          'downloaded: Python, make and a C++ compiler, a few minutes), or choose another client ' +
          '(client option or CAIRN_KAFKA_CLIENT: kafkajs, platformatic)',
        err,
      );
    }
  };
  if (specifier !== CONFLUENT_MODULE) return load();
  loaded ??= load().catch((err: unknown) => {
    loaded = undefined;
    throw err;
  });
  return loaded;
}

/** True when the module can be loaded here (tests skip the confluent cases without it). */
export async function confluentInstalled(): Promise<boolean> {
  return loadConfluent().then(
    () => true,
    () => false,
  );
}
