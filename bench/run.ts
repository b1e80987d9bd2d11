/** `npm run bench -- <name> [--quick] [flags]`: runs one benchmark, prints figures and a final JSON line. */
import { benchCas } from './cas.js';
import { benchChangelog } from './changelog.js';
import { benchInbox } from './inbox.js';
import { benchLanggraph } from './langgraph.js';
import { benchRelay } from './relay.js';
import { benchWakeup } from './wakeup.js';

const benches: Record<string, (args: string[]) => Promise<Record<string, unknown>>> = {
  cas: benchCas,
  changelog: benchChangelog,
  relay: benchRelay,
  inbox: benchInbox,
  wakeup: benchWakeup,
  langgraph: benchLanggraph,
};

const [name, ...args] = process.argv.slice(2);
const bench = name ? benches[name] : undefined;
if (!bench) {
  console.error(`usage: npm run bench -- <${Object.keys(benches).join('|')}> [--quick]`);
  process.exit(2);
}
const result = await bench(args);
console.log(JSON.stringify(result));
process.exit(0);
