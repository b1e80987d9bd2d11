/**
 * `@cairn-state/cairn/console`: the operator console (`cairn console`) as a library, to mount
 * in your own process or start on its own port.
 *
 * @module @cairn-state/cairn/console
 */
export { type ConsoleUser, parseUsers, type Role, usersFromFileOrEnv } from './auth.js';
export {
  type ConsoleApp,
  type ConsoleOptions,
  createConsoleApp,
  type RunningConsole,
  startConsole,
} from './server.js';
