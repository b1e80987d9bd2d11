/**
 * `@cairn-state/cairn/langgraph`: a LangGraph JS checkpoint saver on Cairn's Postgres. Needs
 * `@langchain/langgraph-checkpoint` (an optional peer dependency of Cairn) installed beside it.
 */
export {
  type BoundaryRule,
  CairnSaver,
  type CairnSaverOptions,
  createCairnSaver,
  DEFAULT_BOUNDARY,
  type SkippedCheckpoint,
} from './cairnSaver.js';
