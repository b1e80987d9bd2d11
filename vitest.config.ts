import { defineConfig } from 'vitest/config';
import { STOP_THE_BROKER } from './test/support/brokerFaults.js';

export default defineConfig({
  test: {
    reporters: ['default'],
    projects: [
      {
        test: {
          name: 'unit',
          env: { CAIRN_BROKER_FAULTS: '0' }, // even when the shell exports it: only broker-faults may
          include: ['test/**/*.unit.test.ts'],
          sequence: { groupOrder: 0 },
        },
      },
      {
        test: {
          name: 'int',
          env: { CAIRN_BROKER_FAULTS: '0' }, // even when the shell exports it: only broker-faults may
          sequence: { groupOrder: 1 },
          include: ['test/**/*.int.test.ts'],
          globalSetup: ['test/support/globalSetup.ts'],
          // Deadlines, not measures: with two CPU hogs competing for the two cores, a test that
          // spawns a dozen CLI processes (each a Node start and a TypeScript load) or races 50
          // writers took up to 120 s.
          testTimeout: 300_000,
          hookTimeout: 300_000,
          // Two cores shared with Postgres and the broker: two files at a time.
          maxWorkers: 2,
          fileParallelism: true,
        },
      },
      {
        test: {
          // Crash tests that kill their own processes and fail over their own servers, after the
          // rest: two files at a time, as the integration tests (they must hold on a busy machine).
          name: 'chaos',
          env: { CAIRN_BROKER_FAULTS: '0' }, // even when the shell exports it: only broker-faults may
          sequence: { groupOrder: 2 },
          include: ['test/**/*.chaos.test.ts'],
          exclude: STOP_THE_BROKER,
          globalSetup: ['test/support/globalSetup.ts'],
          testTimeout: 900_000, // two at a time: receiptCrash alone once took 240 s
          hookTimeout: 120_000,
          maxWorkers: 2,
          fileParallelism: true,
        },
      },
      {
        test: {
          // Those that stop the shared broker: one at a time, last.
          name: 'broker-faults',
          sequence: { groupOrder: 3 },
          include: STOP_THE_BROKER,
          // The only tests allowed to (cli/stack/brokerGuard.ts assertMayStopTheSharedBroker).
          env: { CAIRN_BROKER_FAULTS: '1' },
          globalSetup: ['test/support/globalSetup.ts'],
          testTimeout: 900_000,
          hookTimeout: 120_000,
          maxWorkers: 1,
          fileParallelism: false,
        },
      },
      // Broker failure on a three-node cluster (`npm run test:cluster`): kept out of `npm test`.
      // The order violation it found once under two brokers down is explained in the README.
      ...(process.env.CAIRN_CLUSTER_TESTS === '1'
        ? [
            {
              test: {
                name: 'cluster',
                env: { CAIRN_BROKER_FAULTS: '0' }, // even when the shell exports it: only broker-faults may
                sequence: { groupOrder: 4 },
                include: ['test/**/*.cluster.test.ts'],
                globalSetup: ['test/support/globalSetup.ts'],
                testTimeout: 600_000,
                hookTimeout: 300_000,
                maxWorkers: 1,
                fileParallelism: false,
              },
            },
          ]
        : []),
    ],
  },
});
