import { sql } from 'kysely';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { CairnSaver } from '../../langgraph/index.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

/**
 * LangGraph's own conformance suite for checkpoint savers
 * (@langchain/langgraph-checkpoint-validation, run unmodified) against CairnSaver on a real
 * Postgres, with Cairn's defaults: forks refused, every row signed.
 */
// The suite calls vitest's functions as globals.
Object.assign(globalThis, { describe, it, expect, beforeAll, afterAll, beforeEach, afterEach });
const { validate, deltaChannelHistoryTests } = await import('@langchain/langgraph-checkpoint-validation');

let t: TestDatabase;
const initializer = {
  checkpointerName: 'CairnSaver',
  beforeAllTimeout: 120_000,
  async beforeAll() {
    t = await createTestDatabase('langgraph_validation');
  },
  async afterAll() {
    await t?.drop();
  },
  createCheckpointer() {
    return new CairnSaver({ db: t.db, keyRing: { current: 'k1', keys: { k1: Buffer.alloc(32, 7) } } });
  },
  async destroyCheckpointer() {
    await sql`DELETE FROM lg_write; DELETE FROM lg_blob; DELETE FROM lg_checkpoint; DELETE FROM lg_event`.execute(
      t.db,
    );
  },
};
validate<CairnSaver>(initializer);
// Opt-in in the suite (LangGraph's own savers run it too): the walk that rebuilds delta channels.
deltaChannelHistoryTests<CairnSaver>(initializer);
