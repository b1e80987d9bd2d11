import type { EventEmitter } from 'node:events';
import type pg from 'pg';
import { LogicalReplicationService, PgoutputPlugin } from 'pg-logical-replication';

/**
 * The relay's replication connection (relay/wal/walStream.ts decodes what it hands on): the
 * pgoutput plugin as the relay starts it, and the library's service with its per-message path
 * replaced.
 */

/** pgoutput with `binary 'true'` (Postgres 14+): columns in their send format, the payload as its bytes; and the logical messages. */
export class BinaryPgoutput extends PgoutputPlugin {
  constructor(private readonly publication: string) {
    super({ protoVersion: 1, publicationNames: [publication] });
  }
  override start(client: pg.Client, slot: string, lastLsn: string): Promise<unknown> {
    return client.query(
      `START_REPLICATION SLOT "${slot}" LOGICAL ${lastLsn} (proto_version '1', publication_names '${this.publication}', binary 'true', messages 'true')`,
    );
  }
}

/** The service's members its copyData handler used, which WalReplication takes over. */
interface ServiceInternals {
  _stop: boolean;
  client(): Promise<[pg.Client, EventEmitter]>;
}

/** An LSN's text ("1a/b374d848", which lsnOf and Postgres read in either case) from its two halves. */
export function lsnTextOf(hi: number, lo: number): string {
  return `${hi.toString(16)}/${lo.toString(16)}`;
}

/**
 * pg-logical-replication's service with its copyData handler replaced. For each XLogData message
 * the library made an LSN string, emitted an event and started an acknowledgement promise (empty
 * with automatic acknowledgement off); this handler hands the message's bytes on as they are.
 * The connection, `stop` and `acknowledge` stay the library's.
 */
export class WalReplication extends LogicalReplicationService {
  constructor(
    config: pg.ClientConfig,
    private readonly handlers: {
      /** One XLogData message (its pgoutput message from byte 25), in the socket's read buffer. */
      xlog(chunk: Buffer): void;
      keepalive(lsn: bigint, respond: boolean): void;
    },
  ) {
    // Never acknowledge on its own: its timer would confirm what was received, not what the broker acked.
    super(config, { acknowledge: { auto: false, timeoutSeconds: 0 }, flowControl: { enabled: false } });
  }

  /** Resolves when the stream ends (the server closed it, or stop()), as the library's does. */
  override async subscribe(
    plugin: Parameters<LogicalReplicationService['subscribe']>[0],
    slot: string,
  ): Promise<this> {
    const self = this as unknown as ServiceInternals;
    try {
      const [client, connection] = await self.client();
      connection.once('replicationStart', () => {
        self._stop = false; // the library's acknowledge() sends nothing while it is set
        this.emit('start');
      });
      connection.on('copyData', ({ chunk }: { chunk: Buffer }) => {
        if (chunk[0] === 0x77) this.handlers.xlog(chunk);
        else if (chunk[0] === 0x6b)
          this.handlers.keepalive(
            (BigInt(chunk.readUInt32BE(1)) << 32n) | BigInt(chunk.readUInt32BE(5)),
            chunk[17] !== 0,
          );
      });
      await plugin.start(client, slot, '0/00000000').catch((e: unknown) => {
        if (!self._stop || !/Connection\s+terminated/i.test(String(e))) throw e;
      });
      return this;
    } catch (e) {
      await this.stop();
      this.emit('error', e);
      throw e;
    }
  }
}
