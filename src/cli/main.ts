#!/usr/bin/env node
/** `cairn <command>`: operator commands. Each command lives in its own module under src/cli/. */
import { parseArgs } from 'node:util';
import { CairnError } from '../errors.js';
import { inboxCommand } from './inbox.js';
import { checkpointCommand, taskCommand } from './inspect.js';
import { migrateCommand } from './migrate.js';
import { outboxCommand } from './outbox.js';
import { stateCommand } from './state.js';

const commands: Record<string, (argv: string[]) => Promise<number>> = {
  migrate: migrateCommand,
  state: stateCommand,
  outbox: outboxCommand,
  inbox: inboxCommand,
  task: taskCommand,
  checkpoint: checkpointCommand,
  relay: async () => (await import('../../relay/main.js')).runRelayProcess(),
};

const usage = `usage: cairn <command> [options]

commands:
  migrate            run pending migrations (prints what ran)
  migrate --status   list migrations and whether they ran
  relay              publish the outbox to Kafka until SIGTERM (see relay/main.ts for settings)
  outbox parked      keys held back by a message the broker refused
  outbox release <key> --topic T --reason R    let a parked key flow again
  outbox skip <message_id> --reason R          drop one message (audited)
  inbox dlq [--group G]                        dead letters
  inbox replay <message_id> --group G          send a dead letter back to its topic
  inbox prune [--older-than-hours 168]         delete old inbox rows in batches
  task show|history <id> [--json]              state and timeline from the audit log
  checkpoint list|verify <task> [--json]       checkpoints; verify checks digest, signature, chain
  state upgrade      rewrite tasks stored under an older schema as oaies.task-state.v2 (through CAS)

environment:
  DATABASE_URL       Postgres (default postgres://postgres@127.0.0.1:5432/test)
  KAFKA_BROKERS      Kafka bootstrap servers (default 127.0.0.1:19092)`;

async function main(argv: string[]): Promise<number> {
  const { positionals } = parseArgs({ args: argv.slice(0, 1), allowPositionals: true, strict: false });
  const name = positionals[0];
  const command = name ? commands[name] : undefined;
  if (!command) {
    console.error(name ? `cairn: unknown command "${name}"\n\n${usage}` : usage);
    return 2;
  }
  return command(argv.slice(1));
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    const e = err as Error;
    console.error(`cairn: ${e instanceof CairnError ? `[${e.code}] ` : ''}${e.message}`);
    process.exitCode = 1;
  },
);
