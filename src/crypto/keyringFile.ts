import {
  closeSync,
  existsSync,
  fchmodSync,
  fsyncSync,
  openSync,
  renameSync,
  rmSync,
  writeSync,
} from 'node:fs';
import { dirname } from 'node:path';
import { CairnError } from '../errors.js';

/**
 * A keyring readable by anyone but its owner is refused, not warned about: the file holds
 * every KEK, so whoever can read it can read every tenant's data; a warning goes to a log
 * while the process carries on as if nothing were wrong (ssh refuses a private key at 0644
 * for the same reason).
 */
export function assertOwnerOnly(path: string, mode: number): void {
  if ((mode & 0o077) === 0) return;
  const octal = (mode & 0o777).toString(8).padStart(4, '0');
  throw new CairnError(
    'keyring_mode',
    `keyring file ${path} has mode ${octal}: group or others may read its key-encryption keys; ` +
      `run \`chmod 600 ${path}\` (and if anyone else did read it, rotate and rewrap)`,
  );
}

/**
 * Replaces the keyring at `path` with `build()`'s text so that a reader, and a crash at any
 * point, sees the whole old file or the whole new one: the text goes to `<path>.tmp` (mode
 * 600), is fsynced, renamed over `path`, and the folder is fsynced so the rename itself
 * survives a power loss before anyone rewraps data keys under the new KEK.
 *
 * `<path>.tmp` is created exclusively and is also the lock: `build` reads the current file
 * while it is held, so two rotations cannot each add a key and drop the other's. A failed
 * write removes it; one left by a killed process blocks the next write until deleted.
 */
export function replaceKeyringFile(path: string, build: () => string, o: { create: boolean }): void {
  const tmp = `${path}.tmp`;
  let fd: number;
  try {
    fd = openSync(tmp, 'wx', 0o600);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new CairnError(
      code === 'EEXIST' ? 'keyring_busy' : 'keyring_write_failed',
      code === 'EEXIST'
        ? `${tmp} exists: another \`cairn keys\` is writing ${path}, or one was killed half-way; ` +
            `if none is running, delete ${tmp} (${path} itself is whole)`
        : `cannot create ${tmp} (${code}); ${path} was not changed`,
      { cause: err },
    );
  }
  try {
    if (o.create && existsSync(path)) {
      throw new CairnError(
        'keyring_exists',
        `keyring file ${path} already exists; \`cairn keys rotate --file ${path}\` adds a key to it`,
      );
    }
    const bytes = Buffer.from(build());
    fchmodSync(fd, 0o600);
    for (let at = 0; at < bytes.length; ) at += writeSync(fd, bytes, at);
    fsyncSync(fd);
    closeSync(fd);
    fd = -1;
    renameSync(tmp, path);
  } catch (err) {
    if (fd >= 0) closeSync(fd);
    rmSync(tmp, { force: true });
    if (err instanceof CairnError) throw err;
    throw new CairnError(
      'keyring_write_failed',
      `writing keyring file ${path} failed (${(err as NodeJS.ErrnoException).code ?? (err as Error).message}); ` +
        `${o.create ? 'nothing was created' : `${path} was not changed and still holds every key`}`,
      { cause: err },
    );
  }
  try {
    const dir = openSync(dirname(path), 'r');
    try {
      fsyncSync(dir);
    } finally {
      closeSync(dir);
    }
  } catch (err) {
    throw new CairnError(
      'keyring_write_failed',
      `the new keyring is in place at ${path}, but its folder could not be synced ` +
        `(${(err as NodeJS.ErrnoException).code}); run \`sync\` before rewrapping`,
      { cause: err },
    );
  }
}
