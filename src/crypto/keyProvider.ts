import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { closeSync, fstatSync, openSync, readFileSync } from 'node:fs';
import { z } from 'zod';
import { CairnError, ValidationError } from '../errors.js';
import { zodIssues } from '../schemas/zodIssues.js';
import { assertOwnerOnly, replaceKeyringFile } from './keyringFile.js';

/**
 * Key-encryption keys (KEKs): they wrap and unwrap tenants' data keys and never leave the
 * provider. A cloud KMS fits the same three calls (Encrypt/Decrypt with a key id).
 *
 * A provider that answers "no" (access denied, a disabled or unknown key) throws an error that
 * says so: its HTTP status (4xx, as `status`, `statusCode` or AWS's `$metadata.httpStatusCode`),
 * or a name such as `AccessDeniedError` or `KeyNotFoundError`. Any other error is taken to mean
 * that the provider did not answer: an outage, which an inbox consumer waits out.
 */
export interface KeyProvider {
  /** The KEK new data keys are wrapped with, and that rotation rewraps to. */
  currentKekId(): Promise<string>;
  /** Encrypts a data key under a KEK, bound to `context`. */
  wrap(kekId: string, dataKey: Buffer, context: string): Promise<Buffer>;
  /** Decrypts a data key wrapped by wrap() with the same KEK and context. */
  unwrap(kekId: string, wrapped: Buffer, context: string): Promise<Buffer>;
}

const VERSION = 1;
const IV = 12;
const TAG = 16;

/** AES-256-GCM: [version][iv 12][tag 16][ciphertext], `aad` bound to the ciphertext. */
export function seal(key: Buffer, plaintext: Buffer, aad: string): Buffer {
  const iv = randomBytes(IV);
  const c = createCipheriv('aes-256-gcm', key, iv);
  c.setAAD(Buffer.from(aad));
  const body = Buffer.concat([c.update(plaintext), c.final()]);
  return Buffer.concat([Buffer.from([VERSION]), iv, c.getAuthTag(), body]);
}

export function open(key: Buffer, sealed: Buffer, aad: string, what: string): Buffer {
  if (sealed.length < 1 + IV + TAG || sealed[0] !== VERSION) {
    throw new CairnError(
      'decryption_failed',
      `${what}: not a Cairn ciphertext (version ${sealed[0]}, ${sealed.length} bytes)`,
    );
  }
  try {
    const d = createDecipheriv('aes-256-gcm', key, sealed.subarray(1, 1 + IV));
    d.setAAD(Buffer.from(aad));
    d.setAuthTag(sealed.subarray(1 + IV, 1 + IV + TAG));
    return Buffer.concat([d.update(sealed.subarray(1 + IV + TAG)), d.final()]);
  } catch (err) {
    throw new CairnError(
      'decryption_failed',
      `${what}: authentication failed (a wrong key, another tenant's key, or altered bytes); nothing was returned`,
      { cause: err },
    );
  }
}

const Keyring = z
  .object({
    version: z.literal(1),
    current: z.string().min(1),
    keys: z.record(
      z.string().regex(/^[A-Za-z0-9_.-]{1,64}$/, 'key ids are 1-64 of A-Z a-z 0-9 _ . -'),
      z.string().refine((v) => /^[A-Za-z0-9+/]+={0,2}$/.test(v) && Buffer.from(v, 'base64').length === 32, {
        message: 'must be 32 bytes, base64',
      }),
    ),
  })
  .strict()
  .refine((k) => k.current in k.keys, { message: 'names a key that is not in keys', path: ['current'] });

type KeyringData = z.infer<typeof Keyring>;

/** Reads and validates a keyring file; refuses one that group or others may read. */
function readKeyring(path: string): KeyringData {
  let text: string;
  try {
    const fd = openSync(path, 'r');
    try {
      assertOwnerOnly(path, fstatSync(fd).mode);
      text = readFileSync(fd, 'utf8');
    } finally {
      closeSync(fd);
    }
  } catch (err) {
    if (err instanceof CairnError) throw err;
    throw new CairnError(
      'keyring_unreadable',
      `keyring file ${path} cannot be read (${(err as NodeJS.ErrnoException).code ?? (err as Error).message}); create one with \`cairn keys init --file ${path}\``,
      { cause: err },
    );
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new ValidationError(`keyring file ${path}`, [
      { path: '(root)', message: `is not JSON: ${(err as Error).message}` },
    ]);
  }
  const parsed = Keyring.safeParse(json);
  if (!parsed.success) {
    // Never echo key material: report the field, not the value.
    const issues = zodIssues(parsed.error, json).map(({ value: _v, ...i }) => i);
    throw new ValidationError(`keyring file ${path}`, issues);
  }
  return parsed.data;
}

/**
 * KEKs from a local JSON file: `{"version":1,"current":"kek-1","keys":{"kek-1":"<32 bytes base64>"}}`.
 * For development and single-host deployments; keep the file out of the database's backups.
 * The file must be mode 600 (or narrower).
 */
export function localKeyring(path: string): KeyProvider {
  const data = readKeyring(path);
  const keys = new Map(Object.entries(data.keys).map(([id, b64]) => [id, Buffer.from(b64, 'base64')]));
  const kek = (id: string) => {
    const k = keys.get(id);
    if (!k) {
      throw new CairnError(
        'key_missing',
        `key-encryption key ${id} is not in keyring ${path} (it has ${[...keys.keys()].join(', ')}); restore it or rewrap with it present`,
      );
    }
    return k;
  };
  return {
    currentKekId: async () => data.current,
    wrap: async (id, dataKey, context) => seal(kek(id), dataKey, `kek:${id}:${context}`),
    unwrap: async (id, wrapped, context) => {
      const key = kek(id);
      try {
        return open(key, wrapped, `kek:${id}:${context}`, `data key ${context}`);
      } catch (err) {
        throw keyUnavailable(`key-encryption key ${id} of keyring ${path}`, context, err);
      }
    },
  };
}

/**
 * A data key that does not unwrap: the key-encryption key under its id is not the one that
 * wrapped it (a keyring of another region or deployment), or its wrapped bytes were altered.
 * Either way nothing is known of the data it protects, so it is an outage (`key_unavailable`,
 * retriable), never `decryption_failed`: readers would take every row of the tenant for corrupt.
 */
export function keyUnavailable(kek: string, context: string, cause: unknown): CairnError {
  return new CairnError(
    'key_unavailable',
    `data key ${context} does not unwrap under ${kek}: it holds another key under that id (a keyring ` +
      'of another region or deployment?), or the wrapped key was altered. Nothing was decrypted and the data it protects was not judged: use the keyring (KMS key) that wrapped it',
    { retriable: true, cause },
  );
}

/**
 * Writes a keyring with a fresh KEK (`rotate`: keeps every old one and makes the new one
 * current). Old KEKs are never dropped: data keys stay wrapped under them until a rewrap,
 * and nothing here can tell whether that rewrap has run.
 */
export function writeKeyring(path: string, opts: { rotate?: boolean } = {}): string {
  let id = '';
  replaceKeyringFile(
    path,
    () => {
      const previous = opts.rotate ? readKeyring(path).keys : {};
      do {
        id = `kek-${new Date().toISOString().replace(/[-:]/g, '').slice(0, 15)}-${randomBytes(3).toString('hex')}`;
      } while (id in previous); // a new id must never overwrite an old key
      const next: KeyringData = {
        version: 1,
        current: id,
        keys: { ...previous, [id]: randomBytes(32).toString('base64') },
      };
      return `${JSON.stringify(next, null, 2)}\n`;
    },
    { create: !opts.rotate },
  );
  return id;
}
