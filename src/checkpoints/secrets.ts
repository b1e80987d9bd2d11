import { ValidationError } from '../errors.js';

/**
 * Values that look like credentials. A checkpoint that contains one is refused: secrets are
 * never stored in checkpoints (or anywhere in task state). Patterns for common formats.
 */
const CREDENTIAL_PATTERNS: ReadonlyArray<[string, RegExp]> = [
  ['AWS access key id', /\b(AKIA|ASIA)[0-9A-Z]{16}\b/],
  ['GitHub token', /\bgh[pousr]_[A-Za-z0-9]{36,}\b/],
  ['GitHub fine-grained token', /\bgithub_pat_[A-Za-z0-9_]{40,}\b/],
  ['Slack token', /\bxox[abposr]-[A-Za-z0-9-]{10,}\b/],
  ['OpenAI-style secret key', /\bsk-(proj-|live-|test-)?[A-Za-z0-9_-]{20,}\b/],
  ['Anthropic API key', /\bsk-ant-[A-Za-z0-9_-]{20,}\b/],
  ['Google API key', /\bAIza[0-9A-Za-z_-]{35}\b/],
  ['Stripe key', /\b(sk|rk)_(live|test)_[0-9A-Za-z]{16,}\b/],
  ['private key', /-----BEGIN [A-Z ]*PRIVATE KEY-----/],
  ['JSON Web Token', /\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}/],
  ['bearer token', /\bBearer\s+[A-Za-z0-9._~+/-]{20,}=*/i],
  ['password in a URL', /[a-z][a-z0-9+.-]*:\/\/[^/\s:@]+:[^/\s@]+@/i],
];

/** Throws ValidationError naming the field and the kind of credential (never echoing the value). */
export function assertNoCredentials(what: string, value: unknown): void {
  const issues: Array<{ path: string; message: string }> = [];
  const walk = (v: unknown, path: string) => {
    if (typeof v === 'string') {
      for (const [kind, re] of CREDENTIAL_PATTERNS) {
        if (re.test(v)) {
          issues.push({
            path,
            message: `looks like a ${kind}; secrets are never stored in task state or checkpoints (store a reference to a secret manager instead)`,
          });
          break;
        }
      }
    } else if (Array.isArray(v)) {
      for (const [i, x] of v.entries()) walk(x, `${path}[${i}]`);
    } else if (v && typeof v === 'object') {
      for (const [k, x] of Object.entries(v)) walk(x, path ? `${path}.${k}` : k);
    }
  };
  walk(value, '');
  if (issues.length > 0) throw new ValidationError(what, issues);
}
