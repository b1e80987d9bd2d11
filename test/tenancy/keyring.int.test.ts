import { execFile } from 'node:child_process';
import { chmodSync, mkdtempSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { beforeEach, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { localKeyring, writeKeyring } from '../../src/crypto/keyProvider.js';

const exec = promisify(execFile);
let dir: string;
let path: string;

/**
 * `cairn keys ...` as an operator runs it, in a shell whose files may grow to `blocks` KiB
 * (`ulimit -f`): a write past it fails with EFBIG after a partial write, as on a full disk.
 * Node ignores SIGXFSZ, so the CLI sees the error instead of being killed by the signal.
 */
async function cairnKeys(
  args: string[],
  blocks: number | 'unlimited' = 'unlimited',
): Promise<{ code: number; signal: string | null; err: string }> {
  try {
    await exec(
      'bash',
      [
        '-c',
        `ulimit -f ${blocks}; exec "$@"`,
        'bash',
        'node_modules/.bin/tsx',
        'cli/main.ts',
        'keys',
        ...args,
      ],
      // No tsx cache: its files must not be what hits the limit.
      { cwd: repoRoot, env: { ...process.env, TSX_DISABLE_CACHE: '1' } },
    );
    return { code: 0, signal: null, err: '' };
  } catch (e) {
    const x = e as { code: number; signal: string | null; stderr: string };
    return { code: x.code, signal: x.signal, err: x.stderr };
  }
}

const keysOf = (p: string) => JSON.parse(readFileSync(p, 'utf8')).keys as Record<string, string>;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'cairn-keyring-'));
  path = join(dir, 'keyring.json');
});

describe('keyring file (cairn keys init | rotate)', () => {
  it('a rotation interrupted by a full disk leaves the old keyring byte-identical, readable, and no temp file', async () => {
    writeKeyring(path);
    while (statSync(path).size < 1100) writeKeyring(path, { rotate: true });
    const before = readFileSync(path);
    const current = await localKeyring(path).currentKekId();

    const r = await cairnKeys(['rotate', '--file', path], 1); // 1 KiB: the new file cannot fit
    expect(r.signal).toBeNull(); // not killed by SIGXFSZ: the write failed with EFBIG
    expect(r.code).toBe(1);
    expect(readFileSync(path, 'utf8')).toBe(before.toString('utf8'));
    expect(await localKeyring(path).currentKekId()).toBe(current);
    expect(readdirSync(dir)).toEqual(['keyring.json']);
    expect(r.err).toMatch(/\[keyring_write_failed\] writing keyring file .* failed \(EFBIG\)/);
    expect(r.err).toMatch(/was not changed and still holds every key/);
  });

  it('every rotation keeps every earlier KEK (same id, same bytes) and writes mode 600', async () => {
    writeKeyring(path);
    const seen: Record<string, string> = { ...keysOf(path) };
    for (let i = 0; i < 3; i++) {
      const id = writeKeyring(path, { rotate: true });
      const keys = keysOf(path);
      expect(keys).toMatchObject(seen);
      expect(Object.keys(keys)).toHaveLength(Object.keys(seen).length + 1);
      expect(await localKeyring(path).currentKekId()).toBe(id);
      seen[id] = keys[id]!;
    }
    expect(statSync(path).mode & 0o777).toBe(0o600);
  });

  it('refuses a keyring group or others may read, naming the file, the mode and the chmod; rotate leaves it alone', async () => {
    writeKeyring(path);
    chmodSync(path, 0o644);
    const before = readFileSync(path);
    expect(() => localKeyring(path)).toThrow(
      `keyring file ${path} has mode 0644: group or others may read its key-encryption keys; run \`chmod 600 ${path}\``,
    );
    const r = await cairnKeys(['rotate', '--file', path]);
    expect(r.code).toBe(1);
    expect(r.err).toMatch(/\[keyring_mode\] .* has mode 0644/);
    expect(readFileSync(path).equals(before)).toBe(true);
    expect(readdirSync(dir)).toEqual(['keyring.json']);

    chmodSync(path, 0o600);
    expect(await localKeyring(path).currentKekId()).toMatch(/^kek-/);
  });

  it('a temp file left by a killed rotation is never read as the keyring and blocks the next write until deleted', async () => {
    writeKeyring(path);
    const before = readFileSync(path);
    writeFileSync(`${path}.tmp`, '{"version":1,"cur', { mode: 0o600 }); // cut off mid-write
    expect(await localKeyring(path).currentKekId()).toMatch(/^kek-/);
    expect(() => writeKeyring(path, { rotate: true })).toThrow(
      `${path}.tmp exists: another \`cairn keys\` is writing ${path}, or one was killed half-way; if none is running, delete ${path}.tmp`,
    );
    expect(readFileSync(path).equals(before)).toBe(true);
  });

  it('init never overwrites an existing keyring', async () => {
    writeKeyring(path);
    const before = readFileSync(path);
    expect(() => writeKeyring(path)).toThrow(/keyring file .* already exists; `cairn keys rotate --file/);
    expect(readFileSync(path).equals(before)).toBe(true);
    expect(readdirSync(dir)).toEqual(['keyring.json']);
  });
});
