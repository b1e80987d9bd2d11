/**
 * The test files that stop, pause or restart the Kafka broker every test shares: they run last,
 * one at a time (vitest.config.ts), never beside another file. test/support/brokerFaults.unit
 * fails when a test file does any of that and is not listed here.
 */
export const STOP_THE_BROKER = [
  'test/chaos/soak.chaos.test.ts',
  'test/relay/relayCrash.chaos.test.ts',
  'test/inbox/replayDeadline.chaos.test.ts',
];

/** What, in a test file's source, stops, pauses or restarts the shared broker. */
export function stopsTheBroker(source: string): boolean {
  return (
    /\b(stopLocalKafka|startLocalKafka|signalLocalKafka)\(/.test(source) ||
    /\brestartBroker\(/.test(source) ||
    /canRestartBroker:\s*(inject|true)/.test(source) ||
    // The local stack's broker pid (readPid), sent a signal.
    (/\breadPid\(/.test(source) && /\bprocess\.kill\(/.test(source))
  );
}
