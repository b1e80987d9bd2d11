import { describe, expect, it } from 'vitest';
import { refusedByProvider } from '../../src/crypto/providerRefusal.js';

/** An error as the named client throws it. */
const err = (message: string, fields: Record<string, unknown>) => Object.assign(new Error(message), fields);

describe('a key provider that answered and refused is told from one that did not answer', () => {
  it.each([
    [
      'AWS KMS AccessDeniedException',
      err('denied', { name: 'AccessDeniedException', $metadata: { httpStatusCode: 400 } }),
    ],
    [
      'AWS KMS DisabledException',
      err('disabled', { name: 'DisabledException', $metadata: { httpStatusCode: 400 } }),
    ],
    ['a name alone', err('the key is disabled', { name: 'AccessDeniedException' })],
    ['Azure Key Vault 403', err('Forbidden', { name: 'RestError', statusCode: 403 })],
    ['an HTTP 404 in a response', err('no such key', { response: { status: 404 } })],
    ['gRPC PERMISSION_DENIED', err('7 PERMISSION_DENIED', { code: 7 })],
    ['gRPC FAILED_PRECONDITION (a disabled key version)', err('9 FAILED_PRECONDITION', { code: 9 })],
    [
      'a refusal wrapped in a cause',
      new Error('unwrap failed', { cause: err('x', { name: 'KeyNotFoundError' }) }),
    ],
  ])('refused: %s', (_, e) => {
    expect(refusedByProvider(e)).toBe(true);
  });

  it.each([
    ['a refused connection', err('connect ECONNREFUSED', { code: 'ECONNREFUSED' })],
    [
      'fetch failing on DNS',
      new TypeError('fetch failed', { cause: err('getaddrinfo ENOTFOUND kms', { code: 'ENOTFOUND' }) }),
    ],
    ['a timeout', err('timed out', { name: 'TimeoutError' })],
    [
      'AWS KMS throttling (a 400)',
      err('slow down', { name: 'ThrottlingException', $metadata: { httpStatusCode: 400 } }),
    ],
    [
      'AWS KMS KeyUnavailableException (a 500)',
      err('later', { name: 'KeyUnavailableException', $metadata: { httpStatusCode: 500 } }),
    ],
    ['HTTP 429', err('Too Many Requests', { status: 429 })],
    ['HTTP 503 whatever its name', err('x', { name: 'AccessDeniedException', statusCode: 503 })],
    ['gRPC UNAVAILABLE', err('14 UNAVAILABLE', { code: 14 })],
    ['an error that says nothing', new Error('KMS unreachable')],
    // This process's own credentials failing (expired, unknown, a skewed clock) say nothing of
    // one tenant's key: every key fails alike, waited out like an outage, never dead-lettered.
    [
      'AWS expired STS token (a 400)',
      err('expired', { name: 'ExpiredTokenException', $metadata: { httpStatusCode: 400 } }),
    ],
    [
      'AWS unknown access key (a 400)',
      err('x', { name: 'UnrecognizedClientException', $metadata: { httpStatusCode: 400 } }),
    ],
    [
      'AWS signature refused (clock skew, a 400)',
      err('x', { name: 'InvalidSignatureException', $metadata: { httpStatusCode: 400 } }),
    ],
    ['HTTP 401', err('Unauthorized', { name: 'RestError', statusCode: 401 })],
    ['gRPC UNAUTHENTICATED', err('16 UNAUTHENTICATED', { code: 16 })],
    ['an OAuth token refresh refused', err('invalid_grant', { response: { status: 400 } })],
    ['a thrown string', 'boom'],
  ])('did not answer: %s', (_, e) => {
    expect(refusedByProvider(e)).toBe(false);
  });
});
