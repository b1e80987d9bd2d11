import { type Logger, pino } from 'pino';

export type { Logger };

/**
 * The root logger. Components take a child (`logger.child({ component: 'relay' })`).
 * Fields that could hold secrets are redacted wherever they appear.
 */
export function createLogger(opts: { level?: string; name?: string } = {}): Logger {
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
