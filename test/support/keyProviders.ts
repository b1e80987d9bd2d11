import type { KeyProvider } from '../../src/crypto/keyProvider.js';

/** A key provider that can go down: then every unwrap throws, as a KMS out of reach does. */
export function switchableProvider(inner: KeyProvider) {
  const s = { down: false };
  const provider: KeyProvider = {
    currentKekId: () => inner.currentKekId(),
    wrap: (id, key, context) => inner.wrap(id, key, context),
    unwrap: async (id, wrapped, context) => {
      if (s.down) throw new Error('KMS unreachable');
      return inner.unwrap(id, wrapped, context);
    },
  };
  return { provider, s };
}
