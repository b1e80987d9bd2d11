import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { TENANT_ID } from '../src/db/tenant.js';
import { ConfigurationError, ValidationError } from '../src/errors.js';
import { SpiffeId } from '../src/schemas/taskState.js';
import { zodIssues } from '../src/schemas/zodIssues.js';

/** `read` sees; `operator` also acts (resolve gates, release keys, replay dead letters, holds). */
export type Role = 'read' | 'operator';

/** A console user as configured: who, how they prove it, what they may do and for which tenant. */
export interface ConsoleUser {
  name: string;
  role: Role;
  /** Bound to this tenant: every read goes through the tenant's row-level security. */
  tenant?: string;
  /** Who the audit says acted: a SPIFFE id (default spiffe://cairn.console/operator/<name>). */
  id: string;
  /** sha256 of the user's token (the password of basic auth, or a bearer token). */
  tokenSha256: Buffer;
}

const UserEntry = z
  .strictObject({
    name: z.string().regex(/^[A-Za-z0-9_.@-]{1,64}$/, { message: 'must be 1-64 of A-Z a-z 0-9 _ . @ -' }),
    role: z.enum(['read', 'operator']),
    tenant: z.string().regex(TENANT_ID, { message: 'must be a tenant id' }).optional(),
    id: SpiffeId.optional(),
    token: z.string().min(16, { message: 'must be at least 16 characters' }).optional(),
    token_sha256: z
      .string()
      .regex(/^[0-9a-f]{64}$/, { message: 'must be 64 lower-case hex digits' })
      .optional(),
  })
  .refine((u) => (u.token === undefined) !== (u.token_sha256 === undefined), {
    message: 'give exactly one of token and token_sha256',
  });
const UserList = z.array(UserEntry).min(1, { message: 'must name at least one user: no anonymous access' });

const sha256 = (s: string) => createHash('sha256').update(s, 'utf8').digest();

/**
 * Parses the console's users: a JSON array of `{ name, role, tenant?, id?, token | token_sha256 }`.
 * Names, ids and tokens must be unique; a user without a tenant sees every tenant.
 */
export function parseUsers(input: unknown, source = 'console users'): ConsoleUser[] {
  const parsed = UserList.safeParse(input);
  if (!parsed.success) throw new ValidationError(source, zodIssues(parsed.error, input));
  const users: ConsoleUser[] = parsed.data.map((u) => ({
    name: u.name,
    role: u.role,
    ...(u.tenant ? { tenant: u.tenant } : {}),
    id: u.id ?? `spiffe://cairn.console/operator/${u.name}`,
    tokenSha256: u.token_sha256 ? Buffer.from(u.token_sha256, 'hex') : sha256(u.token!),
  }));
  // Two users with one name, one audit identity or one token could not be told apart.
  const unique = (field: string, of: (u: ConsoleUser) => string, shown: (u: ConsoleUser) => unknown) => {
    const seen = new Set<string>();
    users.forEach((u, i) => {
      if (seen.has(of(u)))
        throw new ValidationError(source, [
          { path: `${i}.${field}`, message: 'is given twice', value: shown(u) },
        ]);
      seen.add(of(u));
    });
  };
  unique(
    'name',
    (u) => u.name,
    (u) => u.name,
  );
  unique(
    'id',
    (u) => u.id,
    (u) => u.id,
  );
  unique(
    'token',
    (u) => u.tokenSha256.toString('hex'),
    () => '(a token another user has)',
  );
  return users;
}

/** Reads users from a file (`--users F`) or from CAIRN_CONSOLE_USERS (the JSON itself). */
export function usersFromFileOrEnv(file: string | undefined, env = process.env): ConsoleUser[] {
  const [text, source] = file
    ? [readFileSync(file, 'utf8'), `console users (${file})`]
    : [env.CAIRN_CONSOLE_USERS, 'CAIRN_CONSOLE_USERS'];
  if (!text) {
    throw new ConfigurationError(
      'cairn console needs users (no anonymous access): --users FILE or CAIRN_CONSOLE_USERS, a JSON array of ' +
        '{ "name", "role": "read"|"operator", "tenant"?, "token" | "token_sha256" }',
    );
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new ValidationError(source, [
      { path: '(file)', message: `is not JSON: ${(err as Error).message}` },
    ]);
  }
  return parseUsers(json, source);
}

/**
 * Who sent a request: `Authorization: Basic name:token` (what a browser sends) or
 * `Authorization: Bearer token`. Tokens are compared by their sha256 in constant time.
 */
export function authenticate(
  users: readonly ConsoleUser[],
  header: string | undefined,
): { user: ConsoleUser; basic: boolean } | undefined {
  if (!header) return undefined;
  const [scheme, value = ''] = header.split(' ', 2);
  if (scheme?.toLowerCase() === 'basic') {
    const decoded = Buffer.from(value, 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    if (colon < 0) return undefined;
    const user = users.find((u) => u.name === decoded.slice(0, colon));
    const digest = sha256(decoded.slice(colon + 1));
    return user && timingSafeEqual(user.tokenSha256, digest) ? { user, basic: true } : undefined;
  }
  if (scheme?.toLowerCase() === 'bearer') {
    const digest = sha256(value);
    const user = users.find((u) => timingSafeEqual(u.tokenSha256, digest));
    return user ? { user, basic: false } : undefined;
  }
  return undefined;
}

/**
 * Form tokens against cross-site requests: a browser sends basic-auth credentials with any
 * form another site makes it post, so every form carries an HMAC of the user under a key
 * only this process knows, and an action without it is refused.
 */
export function formTokens(key: Buffer = randomBytes(32)) {
  const of = (user: ConsoleUser) => createHmac('sha256', key).update(user.name).digest('base64url');
  return {
    of,
    check(user: ConsoleUser, token: unknown): boolean {
      if (typeof token !== 'string') return false;
      const want = Buffer.from(of(user));
      const got = Buffer.from(token);
      return want.length === got.length && timingSafeEqual(want, got);
    },
  };
}
