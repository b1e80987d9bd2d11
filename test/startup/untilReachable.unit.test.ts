import { describe, expect, it } from 'vitest';
import { isConfigurationSqlError } from '../../src/db/sqlstate.js';
import { databaseUrlFromEnv, kafkaBrokersFromEnv } from '../../src/env.js';
import { ConfigurationError, TopicMissingError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { untilReachable } from '../../src/startup/untilReachable.js';

const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:1'), { code: 'ECONNREFUSED' });
const base = {
  dependency: 'postgres' as const,
  address: 'postgres://u@h:1/d',
  logger: silentLogger,
  isConfigurationError: isConfigurationSqlError,
  minDelayMs: 1,
  maxDelayMs: 4,
};

describe('untilReachable', () => {
  it('retries an outage until the step succeeds, and reports waiting then not waiting', async () => {
    let n = 0;
    const seen: boolean[] = [];
    const r = await untilReachable(
      async () => {
        if (++n < 4) throw refused;
      },
      { ...base, onWaiting: (w) => seen.push(w) },
    );
    expect({ r, n, seen }).toEqual({ r: 'reached', n: 4, seen: [true, false] });
  });

  it('throws a configuration error (28P01) at once, naming the address', async () => {
    let n = 0;
    const auth = Object.assign(new Error('password authentication failed for user "u"'), { code: '28P01' });
    const p = untilReachable(async () => {
      n++;
      throw auth;
    }, base);
    await expect(p).rejects.toBeInstanceOf(ConfigurationError);
    await expect(p).rejects.toThrow(
      /postgres at postgres:\/\/u@h:1\/d refused the configuration: password authentication/,
    );
    expect(n).toBe(1);
  });

  it('throws a TopicMissingError at once as it is (code topic_missing), not waited on as an outage', async () => {
    let n = 0;
    const seen: boolean[] = [];
    const missing = new TopicMissingError(['t1'], 'topic "t1" does not exist on the broker');
    const p = untilReachable(
      async () => {
        n++;
        throw missing;
      },
      { ...base, dependency: 'kafka', onWaiting: (w) => seen.push(w) },
    );
    await expect(p).rejects.toBe(missing);
    expect({ n, seen }).toEqual({ n: 1, seen: [false] });
  });

  it('ends the wait with "stopped" when aborted', async () => {
    const stop = new AbortController();
    const p = untilReachable(
      async () => {
        throw refused;
      },
      { ...base, minDelayMs: 60_000, maxDelayMs: 60_000, signal: stop.signal },
    );
    setTimeout(() => stop.abort(), 10);
    expect(await p).toBe('stopped');
  });
});

describe('connection settings from the environment', () => {
  const withEnv = <T>(env: Record<string, string>, f: () => T): T => {
    const saved = { ...process.env };
    Object.assign(process.env, env);
    try {
      return f();
    } finally {
      process.env = saved;
    }
  };

  it('KAFKA_BROKERS: host:port entries, IPv6 in brackets; anything else names the bad entry', () => {
    expect(withEnv({ KAFKA_BROKERS: 'a.example:9092, [::1]:19092' }, kafkaBrokersFromEnv)).toEqual([
      'a.example:9092',
      '[::1]:19092',
    ]);
    expect(() => withEnv({ KAFKA_BROKERS: 'a:9092,b' }, kafkaBrokersFromEnv)).toThrow(/cannot use "b"/);
    expect(() => withEnv({ KAFKA_BROKERS: 'a:70000' }, kafkaBrokersFromEnv)).toThrow(ConfigurationError);
  });

  it('DATABASE_URL: a postgres:// URL; anything else is named with its password masked', () => {
    expect(withEnv({ DATABASE_URL: 'postgresql://u:p@h:5/d' }, databaseUrlFromEnv)).toBe(
      'postgresql://u:p@h:5/d',
    );
    expect(() => withEnv({ DATABASE_URL: 'mysql://u:pw@h/d' }, databaseUrlFromEnv)).toThrow(
      'DATABASE_URL is not a postgres:// URL: "mysql://u:***@h/d"',
    );
  });
});
