import { type Kysely, type RawBuilder, sql } from 'kysely';
import { ConfigurationError } from '../src/errors.js';

/**
 * The schema a migration creates its objects in, as an identifier for SQL text: the first
 * schema on the migrating connection's search_path, which is Cairn's (createDb's `schema`).
 * Functions that pin their search_path, and the names they qualify, use it, so one set of
 * migrations installs Cairn in any schema.
 */
export async function targetSchema(db: Kysely<unknown>): Promise<RawBuilder<unknown>> {
  const { rows } = await sql<{ schema: string | null }>`SELECT current_schema() AS schema`.execute(db);
  const schema = rows[0]?.schema;
  if (!schema) throw new ConfigurationError("no schema on the migrating connection's search_path exists");
  return sql.id(schema);
}
