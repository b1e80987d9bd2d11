import { UsageError } from './output.js';
import { down, status, up } from './stack/commands.js';

/** `cairn stack up|down|status`: the same as `npm run stack:*`. */
export async function stackCommand(argv: string[]): Promise<number> {
  const sub = argv[0];
  if (sub === 'up') await up();
  else if (sub === 'down') await down();
  else if (sub === 'status') return status();
  else throw new UsageError('usage: cairn stack up|down|status');
  return 0;
}
