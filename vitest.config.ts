import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    reporters: ['default'],
    projects: [
      {
        test: {
          name: 'unit',
          include: ['test/**/*.unit.test.ts'],
          sequence: { groupOrder: 0 },
        },
      },
      {
        test: {
          name: 'int',
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
          // Chaos tests kill processes and restart the broker: one file at a time, after the rest.
          name: 'chaos',
          sequence: { groupOrder: 2 },
          include: ['test/**/*.chaos.test.ts'],
          globalSetup: ['test/support/globalSetup.ts'],
          testTimeout: 600_000,
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
                sequence: { groupOrder: 3 },
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
