/**
 * Under vitest, the broker this stack started is every test file's: only the files that run
 * alone (the `broker-faults` project, which sets CAIRN_BROKER_FAULTS=1; test/support/brokerFaults.ts)
 * may stop, pause or restart it. Anything else doing so through these functions, a child script
 * it runs included (children inherit VITEST), fails here, naming what it tried, rather than
 * failing the files beside it. (A process sent a signal by hand is not caught here: the unit test
 * of test/support/brokerFaults.ts looks for that in the test files' text.)
 */
export function assertMayStopTheSharedBroker(what: string, env: NodeJS.ProcessEnv = process.env): void {
  if (env.VITEST && env.CAIRN_BROKER_FAULTS !== '1') {
    throw new Error(
      `${what}: under vitest only the broker-faults project may stop, pause or restart the shared broker; ` +
        'list the test file in STOP_THE_BROKER (test/support/brokerFaults.ts), which that project runs alone, last',
    );
  }
}
