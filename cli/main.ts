#!/usr/bin/env node
/**
 * `cairn <command>`: operator commands. Each command lives in its own module under cli/ and
 * is loaded when it runs: loading every command's dependencies (kafkajs, pg, the console's
 * server, the crypto providers) for each one cost each invocation about a second of CPU.
 */
import { ExitCode } from '../src/exitCodes.js';
import { printResult, reportError, UsageError, wantsJson } from './output.js';
import { packageInfo, packageVersion } from './version.js';

interface Command {
  run(argv: string[]): Promise<number>;
  help: string;
}

type Run = (argv: string[]) => Promise<number>;
/** The command `name` exported by a module of cli/, imported when the command runs. */
function lazy<M>(load: () => Promise<M>, pick: (m: M) => Run): Run {
  return async (argv) => pick(await load())(argv);
}
const tenancy = () => import('./tenancy.js');
const inspect = () => import('./inspect.js');

const commands: Record<string, Command> = {
  migrate: {
    run: lazy(
      () => import('./migrate.js'),
      (m) => m.migrateCommand,
    ),
    help: `  migrate [--status] [--json]                  run pending migrations (prints what ran); --status lists them`,
  },
  stack: {
    run: lazy(
      () => import('./stack.js'),
      (m) => m.stackCommand,
    ),
    help: `  stack up|down|status [--json]                the local Postgres check and Kafka broker (see README)`,
  },
  relay: {
    run: async () => (await import('../relay/main.js')).runRelayProcess(),
    help: `  relay                                        publish the outbox to Kafka until SIGTERM
                                               (CAIRN_RELAY_BATCH, CAIRN_RELAY_LEASE_TTL_MS, CAIRN_RELAY_MAX_IDLE_MS;
                                               CAIRN_RELAY_MODE=wal [CAIRN_RELAY_WAL_SLOT]: read the WAL, docs/relay-modes.md)`,
  },
  task: {
    run: lazy(inspect, (m) => m.taskCommand),
    help: `  task show|history <id> [--json]              state and a timeline from the audit log`,
  },
  checkpoint: {
    run: lazy(inspect, (m) => m.checkpointCommand),
    help: `  checkpoint list|verify <task> [--json]       checkpoints; verify checks digest, signature, chain
                                               (CAIRN_CHECKPOINT_KEYS=kid:secret,... to check signatures)`,
  },
  resume: {
    run: lazy(
      () => import('./resume.js'),
      (m) => m.resumeCommand,
    ),
    help: `  resume <task> --workflow F --policy F --agent ID [--json]
                                               verify, re-authorize, reconcile receipts, reacquire the lease`,
  },
  outbox: {
    run: lazy(
      () => import('./outbox.js'),
      (m) => m.outboxCommand,
    ),
    help: `  outbox status [--json]                       backlog, oldest unpublished, parked keys, lanes owned
  outbox parked [--json]                       keys held back by a message the broker refused
  outbox release <key> --topic T --reason R    let a parked key flow again (audited)
  outbox skip <message_id> --reason R          drop one message (audited)`,
  },
  inbox: {
    run: lazy(
      () => import('./inbox.js'),
      (m) => m.inboxCommand,
    ),
    help: `  inbox dlq [--group G] [--json]               dead letters
  inbox replay <message_id> --group G          send a dead letter back to its topic
  inbox prune [--older-than-hours 168]         delete old inbox rows in batches`,
  },
  console: {
    run: lazy(
      () => import('./console.js'),
      (m) => m.consoleCommand,
    ),
    help: `  console [--host 127.0.0.1] [--port 7070] [--users F]
                                               the operator console in a browser (users: --users F or
                                               CAIRN_CONSOLE_USERS; see README "Operator console")`,
  },
  failover: {
    run: lazy(
      () => import('./failover.js'),
      (m) => m.failoverCommand,
    ),
    help: `  failover check --topics T1,T2 [--group G=T1,T2] [--hold] [--json]
                                               after promoting a standby: what did it lose? (exit 1 if anything)
  failover replay [--from-topic cairn.changelog] [--hold] [--json]
                                               before the check: rebuild lost versions from the changelog`,
  },
  tenant: {
    run: lazy(tenancy, (m) => m.tenantCommand),
    help: `  tenant add <tenant> [--keyring F]            register a tenant and give it a data key (CAIRN_KEYRING)
  tenant shred <tenant> --yes                  destroy its data keys (crypto-shredding)`,
  },
  keys: {
    run: lazy(tenancy, (m) => m.keysCommand),
    help: `  keys init|rotate --file F                    a keyring file / a new current key-encryption key
  keys rewrap [--keyring F]                    rewrap tenant data keys under the current KEK`,
  },
  retention: {
    run: lazy(tenancy, (m) => m.retentionCommand),
    help: `  retention policy --tenant X --class C --days N
  retention run [--tenant X] [--dry-run]       delete expired tasks with everything they hold; certificates
  retention certificates [--run ID] [--json]`,
  },
  hold: {
    run: lazy(tenancy, (m) => m.holdCommand),
    help: `  hold place|release (--task T | --tenant X) [--reason R]
  hold list [--tenant X] [--all] [--json]      legal holds: retention never deletes held data`,
  },
  annotate: {
    run: lazy(tenancy, (m) => m.annotateCommand),
    help: `  annotate <task> --body "..."                 an append-only correction to a task's record`,
  },
  state: {
    run: lazy(
      () => import('./state.js'),
      (m) => m.stateCommand,
    ),
    help: `  state upgrade [--actor spiffe://...]         rewrite tasks stored as oaies.task-state.v1 as v2, through CAS`,
  },
};

const usage = `usage: cairn <command> [options]      (cairn <command> --help for one command)
       cairn --version                       the package name and version

commands:
${Object.values(commands)
  .map((c) => c.help)
  .join('\n')}

--json (on every command that prints something): the result as JSON on stdout; an error as
  one JSON object {"error":{"code","message","retriable"}} on stderr, with the same exit code.
exit codes: 0 ok, 1 failure (or a violation found), 2 usage, 75 unavailable (checkpoint verify),
  78 configuration.

environment:
  DATABASE_URL       Postgres (default postgres://postgres@127.0.0.1:5432/test)
  KAFKA_BROKERS      Kafka bootstrap servers (default 127.0.0.1:19092)
  CAIRN_METRICS_PORT serve /metrics, /healthz, /readyz (cairn relay) on this port
  CAIRN_METRICS_HOST the address they bind to (default 127.0.0.1; 0.0.0.0 for every interface)`;

async function main(argv: string[]): Promise<number> {
  const name = argv[0];
  if (!name || name === '--help' || name === '-h' || name === 'help') {
    console.log(usage);
    return name ? ExitCode.ok : ExitCode.usage;
  }
  if (name === '--version' || name === '-v' || name === 'version') {
    printResult(wantsJson(argv), packageInfo() ?? null, () => console.log(packageVersion()));
    return ExitCode.ok;
  }
  const command = commands[name];
  if (!command) throw new UsageError(`unknown command "${name}"\n\n${usage}`);
  if (argv.includes('--help') || argv.includes('-h')) {
    console.log(`usage:\n${command.help}`);
    return 0;
  }
  return command.run(argv.slice(1));
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    process.exitCode = reportError(err, wantsJson(process.argv.slice(2)));
  },
);
