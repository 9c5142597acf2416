// The browser side of tests/tests/browser.rs: a page served from its own origin (this
// script's HTTP server) consumes a unimesh group in a real headless Chromium, by
// EventSource or by WebSocket, with the token in the `access_token` query parameter (the
// two APIs cannot send headers), and ACKs what it receives (SSE: `fetch` to `/ack` with
// `Authorization`, a CORS request with a preflight; WebSocket: ack frames).
//
//   node consume.mjs '{"pageUrl":"http://localhost:PORT/","base":"http://127.0.0.1:PORT",
//                      "group":"g","token":"...","count":N,"mode":"sse"|"ws","timeoutMs":T}'
//
// Prints one JSON line: {"opened", "received": [event ids], "acked", "errors": [...]}.
// Exit 0 when the page ran (whatever it got: the Rust test judges), 2 on a usage error,
// 1 when the browser could not be driven.
import http from 'node:http';
import { chromium } from 'playwright-core';

const args = JSON.parse(process.argv[2] ?? 'null');
if (!args || !args.pageUrl || !args.base || !['sse', 'ws'].includes(args.mode)) {
  console.error('usage: node consume.mjs \'{"pageUrl","base","group","token","count","mode":"sse"|"ws","timeoutMs"}\'');
  process.exit(2);
}
const page = new URL(args.pageUrl);

const server = http.createServer((_req, res) => {
  res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
  res.end('<!doctype html><title>unimesh page</title><p>consumer</p>');
});
await new Promise((resolve, reject) => {
  server.once('error', reject);
  server.listen(Number(page.port), '127.0.0.1', resolve);
});

// The flags the machine's notes give for a root, offline Chromium.
const browser = await chromium.launch({
  executablePath: process.env.UNIMESH_CHROMIUM || '/usr/bin/chromium',
  args: [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
  ],
});
let code = 0;
try {
  const tab = await browser.newPage();
  const console_lines = [];
  tab.on('console', (m) => console_lines.push(m.text()));
  await tab.goto(args.pageUrl);
  const out = await tab.evaluate(consume, args);
  out.console = console_lines.slice(0, 20);
  console.log(JSON.stringify(out));
} catch (e) {
  console.error(`the browser could not be driven: ${e}`);
  code = 1;
} finally {
  await browser.close();
  server.close();
}
process.exit(code);

// Runs inside the page.
function consume(a) {
  const out = { opened: false, received: [], acked: 0, errors: [] };
  const token = encodeURIComponent(a.token);
  return new Promise((resolve) => {
    let finish;
    const timer = setTimeout(() => { out.errors.push('timeout'); finish(); }, a.timeoutMs);
    const done = () => out.acked >= a.count;
    if (a.mode === 'sse') {
      const es = new EventSource(`${a.base}/v1/subscriptions/${a.group}/stream?client=page&access_token=${token}`);
      finish = () => { clearTimeout(timer); es.close(); resolve(out); };
      es.onopen = () => { out.opened = true; };
      es.onerror = () => {
        out.errors.push(`EventSource error, readyState ${es.readyState}`);
        if (es.readyState === EventSource.CLOSED) finish();
      };
      es.onmessage = async (m) => {
        try {
          const d = JSON.parse(m.data);
          out.received.push(d.event.id);
          const r = await fetch(`${a.base}/v1/subscriptions/${a.group}/ack`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', authorization: `Bearer ${a.token}` },
            body: JSON.stringify({ deliveryIds: [d.deliveryId] }),
          });
          const j = await r.json();
          if (r.status !== 200) out.errors.push(`ack ${r.status} ${JSON.stringify(j)}`);
          out.acked += j.acked ?? 0;
        } catch (e) {
          out.errors.push(`ack failed: ${e}`);
        }
        if (done()) finish();
      };
    } else {
      const ws = new WebSocket(`${a.base.replace(/^http/, 'ws')}/v1/subscriptions/${a.group}/ws?client=page&access_token=${token}`);
      finish = () => { clearTimeout(timer); try { ws.close(); } catch (_) { /* closed */ } resolve(out); };
      ws.onopen = () => { out.opened = true; };
      ws.onerror = () => { out.errors.push('WebSocket error'); };
      ws.onclose = (c) => { if (!done()) { out.errors.push(`WebSocket closed ${c.code}`); finish(); } };
      ws.onmessage = (m) => {
        const f = JSON.parse(m.data);
        if (f.deliveryId) {
          out.received.push(f.event.id);
          ws.send(JSON.stringify({ ack: [f.deliveryId] }));
        } else if (f.result === 'ack') {
          out.acked += f.acked ?? 0;
          if (done()) finish();
        } else {
          out.errors.push(`frame ${m.data}`);
        }
      };
    }
  });
}
