// Child processes for crash tests: the same helper the demo uses.
export { type Child, sigkill, sigterm, spawnTs } from '../../scripts/lib/spawnTs.js';
