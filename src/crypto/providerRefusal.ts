/**
 * Error names of a KMS that answered and refused: AWS KMS's AccessDeniedException,
 * NotFoundException, DisabledException, InvalidCiphertextException, IncorrectKeyException,
 * InvalidKeyUsageException, KMSInvalidStateException; HTTP clients' Forbidden.
 */
const REFUSAL_NAME =
  /AccessDenied|Forbidden|PermissionDenied|NotFound|Disabled|InvalidCiphertext|IncorrectKey|InvalidKeyUsage|KMSInvalidState/;

/** Names of a provider that answered "later" (throttled, over a quota): an outage, not a refusal. */
const BUSY_NAME = /Throttl|LimitExceeded|TooManyRequests|RequestLimit/;

/**
 * This process's own credentials refused (expired, unknown, a signature off by a skewed clock,
 * an OAuth refresh refused): every tenant's key fails alike, so it says nothing of one key: an
 * outage of this process's access, waited out (they were dead-lettered, every message that
 * needed a key, within the consumer's bound).
 */
const CREDENTIALS =
  /ExpiredToken|UnrecognizedClient|InvalidClientTokenId|InvalidSignature|IncompleteSignature|SignatureDoesNotMatch|CredentialsProvider|Unauthenticated|UNAUTHENTICATED|invalid_grant|TokenRefreshRequired/;

/** gRPC status codes (Google Cloud KMS) of a refusal: INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, FAILED_PRECONDITION. */
const REFUSAL_GRPC = new Set([3, 5, 7, 9]);

/**
 * Whether a key provider's error says it answered and refused (access denied, a key it does not
 * have or that is disabled, a ciphertext it rejects) rather than that it did not answer (a
 * timeout, a refused connection, a name that does not resolve, a server error, throttling).
 * Read from the HTTP status the error carries (AWS SDK v3 `$metadata.httpStatusCode`, Azure's
 * `statusCode`, `status`, `response.status`: 4xx but 401, 408 and 429), a numeric gRPC code, or its
 * name; looks through `cause`.
 *
 * What it cannot place counts as not answered: an outage taken for a refusal dead-letters
 * healthy messages once the inbox consumer's bound runs out, whereas a refusal taken for an
 * outage holds its partition only while nothing is applied anywhere, and says so.
 */
export function refusedByProvider(err: unknown, depth = 0): boolean {
  if (err === null || typeof err !== 'object' || depth > 4) return false;
  const e = err as {
    name?: unknown;
    code?: unknown;
    status?: unknown;
    statusCode?: unknown;
    $metadata?: { httpStatusCode?: unknown };
    response?: { status?: unknown; statusCode?: unknown };
    cause?: unknown;
  };
  const name = typeof e.name === 'string' ? e.name : '';
  if (BUSY_NAME.test(name)) return false;
  if (CREDENTIALS.test(name) || (err instanceof Error && CREDENTIALS.test(err.message))) return false;
  const status = [
    e.$metadata?.httpStatusCode,
    e.statusCode,
    e.status,
    e.response?.status,
    e.response?.statusCode,
  ].find((s) => typeof s === 'number') as number | undefined;
  if (status !== undefined)
    return status >= 400 && status < 500 && status !== 401 && status !== 408 && status !== 429;
  if (typeof e.code === 'number') return REFUSAL_GRPC.has(e.code);
  if (REFUSAL_NAME.test(name)) return true;
  return refusedByProvider(e.cause, depth + 1);
}
