import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { cairnBundle } from '../support/cli.js';
import { createTestDatabase, type TestDatabase, uniqueTopic } from '../support/testDatabase.js';

const exec = promisify(execFile);
let t: TestDatabase;
let messageId: string;

async function cairn(...args: string[]): Promise<{ code: number; out: string; err: string }> {
  try {
    const r = await exec(process.execPath, [cairnBundle(), ...args], {
      cwd: repoRoot,
      env: { ...process.env, DATABASE_URL: t.url },
    });
    return { code: 0, out: r.stdout, err: r.stderr };
  } catch (e) {
    const x = e as { code: number; stdout: string; stderr: string };
    return { code: x.code, out: x.stdout, err: x.stderr };
  }
}

const counts = async () => ({
  outbox: (await t.db.selectFrom('outbox').select('message_id').execute()).length,
  audit: (await t.db.selectFrom('outbox_operator_audit').select('id').execute()).length,
  dlq: (await t.db.selectFrom('inbox_dlq').select('id').execute()).length,
});

beforeAll(async () => {
  t = await createTestDatabase('operator_input');
  const outbox = createOutbox({});
  const ids = await t.db
    .transaction()
    .execute((trx) =>
      outbox.enqueue(trx, [{ topic: uniqueTopic('operator-input'), key: 'k', payload: { n: 1 } }]),
    );
  messageId = ids[0]!;
});
afterAll(async () => {
  await t?.drop();
});

describe('cairn outbox | inbox: bad operator input', () => {
  it('is refused with exit 2, naming the field and the value, and nothing is written', async () => {
    const before = await counts();
    const refused: Array<[string[], RegExp]> = [
      [
        ['outbox', 'skip', 'not-a-uuid', '--reason', 'poison'],
        /invalid arguments to cairn outbox skip: message_id: must be an outbox message id: a UUID.*\(got "not-a-uuid"\)/,
      ],
      [['outbox', 'skip', messageId], /outbox skip: reason: is required: say why/],
      [
        ['outbox', 'release', 'k', '--topic', 'no such/topic', '--reason', 'retry'],
        /outbox release: topic: must be 1-249 characters .* \(got "no such\/topic"\)/,
      ],
      [
        ['outbox', 'skip', messageId, '--reason', 'r', '--actor', 'bob'],
        /actor: must be a SPIFFE ID .*\(got "bob"\)/,
      ],
      [
        ['inbox', 'replay', '', '--group', 'g'],
        /inbox replay: message_id: must be a message id .*\(got ""\)/,
      ],
      [
        ['inbox', 'dlq', '--group', 'g', '--older-than-hours', '1'],
        /inbox dlq: .*unknown key\(s\) "older-than-hours"/,
      ],
      [
        ['inbox', 'prune', '--older-than-hours', '0'],
        /inbox prune: older-than-hours: must be a positive number \(got "0"\)/,
      ],
    ];
    for (const [args, message] of refused) {
      const r = await cairn(...args);
      expect({ args, code: r.code }).toEqual({ args, code: 2 });
      expect(r.err).toMatch(message);
      expect(r.err).not.toMatch(/invalid input syntax|syntax error/); // no raw Postgres error
    }
    expect(await counts()).toEqual(before);

    // The same command with good input goes through (and is audited).
    const ok = await cairn('outbox', 'skip', messageId, '--reason', 'poison');
    expect(ok).toMatchObject({ code: 0, out: `skipped ${messageId}\n` });
    expect(await counts()).toEqual({ ...before, outbox: before.outbox - 1, audit: 1 });
  });
});
