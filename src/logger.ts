import { type Logger, pino } from 'pino';
import { z } from 'zod';
import { optionsSchema, parseOptions } from './options.js';

export type { Logger };

/** What createLogger takes. */
export interface LoggerOptions {
  /** The lowest level written (default `info`, or `CAIRN_LOG_LEVEL`). */
  level?: 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';
  /** The `name` on every line (default `cairn`). */
  name?: string;
}

const LoggerOptionsSchema = optionsSchema<LoggerOptions>()(
  z.strictObject({
    level: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).optional(),
    name: z.string().min(1).optional(),
  }),
);

/**
 * The root logger. Components take a child (`logger.child({ component: 'relay' })`).
 * Fields that could hold secrets are redacted wherever they appear.
 */
export function createLogger(options: LoggerOptions = {}): Logger {
  const opts = parseOptions('logger options', LoggerOptionsSchema, options);
  return pino({
    name: opts.name ?? 'cairn',
    level: opts.level ?? process.env.CAIRN_LOG_LEVEL ?? 'info',
    redact: {
      paths: [
        'password',
        '*.password',
        'secret',
        '*.secret',
        'token',
        '*.token',
        'authorization',
        '*.authorization',
        'connectionString',
        '*.connectionString',
      ],
      censor: '[redacted]',
    },
  });
}

/** A logger that writes nothing, for tests and embedders that bring none. */
export const silentLogger: Logger = pino({ level: 'silent' });
