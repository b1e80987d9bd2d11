// The HTTP effect sink the crash tests and the demo count side effects with.
export { callSink, type Sink, startSink } from '../../scripts/lib/effectSink.js';
