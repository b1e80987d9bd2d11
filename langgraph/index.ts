/**
 * `@cairn-state/cairn/langgraph`: a LangGraph JS checkpoint saver on Cairn's Postgres. Needs
 * `@langchain/langgraph-checkpoint` (an optional peer dependency of Cairn) installed beside it.
 */
export { CairnSaver, createCairnSaver } from './cairnSaver.js';
export { type BoundaryRule, type CairnSaverOptions, DEFAULT_BOUNDARY } from './options.js';
export type { ThreadEvent, ThreadEventKind } from './sql/threadMaintenance.js';
