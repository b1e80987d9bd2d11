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
          testTimeout: 120_000,
          hookTimeout: 120_000,
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
          testTimeout: 240_000,
          hookTimeout: 120_000,
          maxWorkers: 1,
          fileParallelism: false,
        },
      },
    ],
  },
});
