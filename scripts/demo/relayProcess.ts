/** The demo's relay: `cairn relay` with the demo's tracing registered first (DEMO_TRACES). */
import { runRelayProcess } from '../../relay/main.js';
import { exitCodeFor } from '../../src/exitCodes.js';
import { startDemoTracing } from './tracing.js';

if (process.env.DEMO_TRACES) startDemoTracing(process.env.DEMO_TRACES, 'relay');
runRelayProcess().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`cairn relay: ${(err as Error).message}\n`);
    process.exit(exitCodeFor(err));
  },
);
