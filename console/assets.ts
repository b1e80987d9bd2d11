/** The console's stylesheet and script, served from the process itself: no CDN, nothing fetched at runtime. */
export const CONSOLE_CSS = `
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
header { display: flex; gap: 1.5em; align-items: center; padding: .6em 1em; background: #1d2330; color: #fff; }
header a { color: #cfe0ff; margin-right: 1em; } .who { margin-left: auto; opacity: .8; }
#live { padding: .4em 1em; background: #e8edf5; font-size: 13px; }
main { padding: 0 1em 2em; } h2 { margin-top: 1.4em; font-size: 1.1em; }
table { border-collapse: collapse; background: #fff; } td, th { border: 1px solid #d8dce3; padding: .25em .5em; text-align: left; vertical-align: top; }
code { font-size: 12px; } .ok { color: #17692b; } .warn { color: #8a5a00; } .bad { color: #a31515; font-weight: 600; }
ul.gates { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: .3em 1.2em; }
form.action { display: inline-flex; gap: .3em; margin: .2em .4em .2em 0; } form.filters { margin: 1em 0; display: flex; gap: 1em; }
article.gated { background: #fff; border: 1px solid #d8dce3; padding: .2em 1em .8em; margin-bottom: 1em; }
`;

/** Live numbers from /live (server-sent events) into every element marked data-live. */
export const CONSOLE_JS = `
(() => {
  const source = new EventSource('/live');
  source.addEventListener('numbers', (e) => {
    const n = JSON.parse(e.data);
    for (const el of document.querySelectorAll('[data-live]')) {
      const v = n[el.dataset.live];
      el.textContent = v === null || v === undefined ? '-' : String(v);
    }
    document.body.dataset.liveAt = n.at;
  });
})();
`;
