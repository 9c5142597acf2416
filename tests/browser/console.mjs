// The browser side of tests/tests/console.rs: opens unimesh's web console in Debian's
// headless Chromium (driven by playwright-core) and does what the Rust test tells it, one
// command per line on stdin, one JSON answer per line on stdout, so the test can act as
// producer and consumer between the page's steps.
//
//   node console.mjs '{"url":"http://127.0.0.1:PORT/ui"}'
//
// Commands (every wait is bounded by "timeoutMs", default 30000):
//   {"op":"goto"}                                  load the page
//   {"op":"fill","selector":S,"value":V}           type into a field
//   {"op":"click","selector":S}                    click an element
//   {"op":"waitText","selector":S,"text":T}        until S's text (trimmed) is T
//   {"op":"waitVisible","selector":S}              until S is shown
//   {"op":"waitGone","selector":S}                 until nothing matches S
//   {"op":"text","selector":S}                     S's text, once it exists
//   {"op":"eval","expr":E}                         the value of a JS expression in the page
//   {"op":"requests","since":N}                    the page's requests from the N-th on
//   {"op":"screenshot","path":P}                   a PNG of the whole page
//   {"op":"problems"}                              console errors and page errors so far
//   {"op":"close"}
// Answers: {"ok":true,...} or {"ok":false,"error":...}. Exit 0 after "close", 2 on a usage
// error, 1 when the browser could not be started.
import readline from 'node:readline';
import { chromium } from 'playwright-core';

const args = JSON.parse(process.argv[2] ?? 'null');
if (!args || !args.url) {
  console.error('usage: node console.mjs \'{"url":"http://127.0.0.1:PORT/ui"}\'');
  process.exit(2);
}

let browser;
try {
  // The flags the machine's notes give for a root, offline Chromium.
  browser = await chromium.launch({
    executablePath: process.env.UNIMESH_CHROMIUM || '/usr/bin/chromium',
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
  });
} catch (e) {
  console.error(`the browser could not be started: ${e}`);
  process.exit(1);
}
const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
const requests = [];
const problems = [];
page.on('request', (r) => requests.push({ method: r.method(), url: r.url(), type: r.resourceType() }));
page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
page.on('pageerror', (e) => problems.push(`page: ${e}`));

const answer = (value) => process.stdout.write(`${JSON.stringify(value)}\n`);

async function run(c) {
  const timeout = c.timeoutMs ?? 30000;
  switch (c.op) {
    case 'goto':
      await page.goto(args.url, { timeout });
      return {};
    case 'fill':
      await page.fill(c.selector, c.value, { timeout });
      return {};
    case 'click':
      await page.click(c.selector, { timeout });
      return {};
    case 'waitText':
      try {
        await page.waitForFunction(
          ([s, t]) => {
            const e = document.querySelector(s);
            return e !== null && e.textContent.trim() === t;
          },
          [c.selector, c.text],
          { timeout },
        );
      } catch (e) {
        const now = await page.evaluate((s) => document.querySelector(s)?.textContent ?? null, c.selector);
        throw new Error(`${c.selector} did not show ${JSON.stringify(c.text)} (it shows ${JSON.stringify(now)}): ${e.message}`);
      }
      return {};
    case 'waitVisible':
      await page.waitForSelector(c.selector, { timeout, state: 'visible' });
      return {};
    case 'waitGone':
      await page.waitForFunction((s) => document.querySelector(s) === null, c.selector, { timeout });
      return {};
    case 'text':
      await page.waitForSelector(c.selector, { timeout, state: 'attached' });
      return { text: await page.textContent(c.selector) };
    case 'eval':
      return { value: await page.evaluate(c.expr) };
    case 'requests':
      return { requests: requests.slice(c.since ?? 0), total: requests.length };
    case 'screenshot':
      await page.screenshot({ path: c.path, fullPage: true, timeout });
      return {};
    case 'problems':
      return { problems };
    default:
      throw new Error(`unknown op ${c.op}`);
  }
}

const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  let command;
  try {
    command = JSON.parse(line);
  } catch (e) {
    answer({ ok: false, error: `not JSON: ${e}` });
    continue;
  }
  if (command.op === 'close') {
    answer({ ok: true });
    break;
  }
  try {
    answer({ ok: true, ...(await run(command)) });
  } catch (e) {
    answer({ ok: false, error: String(e.message ?? e), problems });
  }
}
await browser.close();
process.exit(0);
