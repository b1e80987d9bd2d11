import type { KeyProvider } from '../../src/crypto/keyProvider.js';

/**
 * A key provider that can go down: then every unwrap throws as a KMS out of reach does (its
 * connection refused: it did not answer). `failures` counts those throws, `downSince` is when
 * the first of them came (performance.now()).
 */
export function switchableProvider(inner: KeyProvider) {
  const s = { down: false, failures: 0, downSince: 0 };
  const provider: KeyProvider = {
    currentKekId: () => inner.currentKekId(),
    wrap: (id, key, context) => inner.wrap(id, key, context),
    unwrap: async (id, wrapped, context) => {
      if (s.down) {
        if (s.failures++ === 0) s.downSince = performance.now();
        throw Object.assign(new Error('connect ECONNREFUSED 10.0.0.7:443 (KMS unreachable)'), {
          code: 'ECONNREFUSED',
        });
      }
      return inner.unwrap(id, wrapped, context);
    },
  };
  return { provider, s };
}

/**
 * A key provider that answers, and answers no, for one tenant's keys: its KMS key was disabled
 * by that tenant's admin (AWS KMS: AccessDeniedException).
 */
export function refusingTenant(inner: KeyProvider, tenantId: string): KeyProvider {
  return {
    currentKekId: () => inner.currentKekId(),
    wrap: (id, key, context) => inner.wrap(id, key, context),
    unwrap: async (id, wrapped, context) => {
      if (context.startsWith(`${tenantId}/`))
        throw Object.assign(new Error('AccessDeniedException: the key is disabled'), {
          name: 'AccessDeniedException',
        });
      return inner.unwrap(id, wrapped, context);
    },
  };
}
