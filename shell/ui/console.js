// The unimesh web console: a page of the admin listener (GET /ui) that shows the mesh live
// from the admin API's feed (GET /admin/events, Server-Sent Events, one snapshot when
// something changed) and pulls the operator's levers through the admin routes (DLQ browse
// and replay, client eviction, seek, rate limits). It never polls: it asks the server only
// when the operator acts, and for a group's dead letters when the feed says they changed.
'use strict';

const TOKEN_KEY = 'unimesh.adminToken';
const DLQ_PAGE = 1000;

const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem(TOKEN_KEY) || '';
let feed = null;
let selected = null; // the group whose partitions and dead letters are shown
let groups = new Map(); // name -> the group as the last snapshot showed it
// The group's DLQ change count when its dead letters were last read, and a read going on.
let dlqRead = { group: null, changes: -1, loading: false };

// ----- talking to the admin API -----

async function api(method, path, body) {
  const headers = {};
  if (token) headers.authorization = `Bearer ${token}`;
  if (body !== undefined) headers['content-type'] = 'application/json';
  const r = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: 'no-store',
  });
  let answer = null;
  try {
    answer = await r.json();
  } catch (_) {
    // Not JSON: the status says enough.
  }
  if (!r.ok) {
    const what = answer && answer.message ? `${answer.error}: ${answer.message}` : r.statusText;
    const e = new Error(`${r.status} ${what}`);
    e.status = r.status;
    throw e;
  }
  return answer;
}

function say(text, bad) {
  const s = $('status');
  s.textContent = text;
  s.className = bad ? 'bad' : 'good';
}

// ----- the feed -----

// Checks the token (one request), then opens the feed.
async function start() {
  try {
    await api('GET', '/admin/ratelimit');
  } catch (e) {
    if (e.status === 401 || e.status === 403) {
      askToken(e.message);
      return;
    }
    say(`the admin API did not answer: ${e.message}`, true);
  }
  $('login').hidden = true;
  $('main').hidden = false;
  $('forget').hidden = !token;
  connect();
}

function connect() {
  if (feed) feed.close();
  const query = token ? `?access_token=${encodeURIComponent(token)}` : '';
  feed = new EventSource(`/admin/events${query}`);
  feed.addEventListener('snapshot', (e) => render(JSON.parse(e.data), e.lastEventId));
  feed.onopen = () => setFeed('live', true);
  feed.onerror = () => {
    if (feed.readyState === EventSource.CLOSED) {
      // Refused (the token went stale, the mesh stopped): find out why, once.
      setFeed('closed', false);
      feed = null;
      setTimeout(start, 1000);
    } else {
      setFeed('reconnecting', false);
    }
  };
}

function setFeed(text, live) {
  const f = $('feed');
  f.textContent = text;
  f.className = live ? 'muted' : 'bad';
}

function askToken(why) {
  if (feed) {
    feed.close();
    feed = null;
  }
  $('main').hidden = true;
  $('login').hidden = false;
  $('login-why').textContent = token ? `The token was refused (${why}).` : `The admin API needs a token (${why}).`;
  $('token').focus();
}

// ----- rendering a snapshot -----

function render(snap, version) {
  const h = $('health');
  h.textContent = snap.health.ok ? 'healthy' : `unhealthy: ${snap.health.reason}`;
  h.className = snap.health.ok ? 'badge good' : 'badge bad';
  $('feed').textContent = `live, snapshot ${version}`;
  if (snap.error) say(`the engine did not answer: ${snap.error}`, true);
  if (snap.groups) renderGroups(snap.groups);
  if (snap.clients) renderClients(snap.clients);
  renderRateLimits(snap.rateLimits || []);
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text === undefined || text === null ? '-' : String(text);
  if (cls) td.className = cls;
  return td;
}

function renderGroups(list) {
  groups = new Map(list.map((g) => [g.group, g]));
  const body = $('groups').tBodies[0];
  body.replaceChildren();
  for (const g of list) {
    const row = body.insertRow();
    row.dataset.group = g.group;
    row.className = g.group === selected ? 'selected' : '';
    cell(row, g.group, 'name');
    cell(row, g.topic);
    cell(row, g.partitions.length, 'num');
    cell(row, g.lag, 'num lag');
    cell(row, g.inFlight, 'num in-flight');
    cell(row, g.clients, 'num');
    cell(row, g.replaying, 'num replaying');
    cell(row, g.stats.deadLettered, 'num');
    cell(row, g.stats.acked, 'num');
    row.addEventListener('click', () => select(g.group));
  }
  $('no-groups').hidden = list.length > 0;
  if (selected && !groups.has(selected)) select(null);
  else if (selected) renderGroup(groups.get(selected));
}

function select(name) {
  selected = name;
  for (const row of $('groups').tBodies[0].rows) {
    row.className = row.dataset.group === name ? 'selected' : '';
  }
  $('group').hidden = !name;
  if (!name) return;
  dlqRead = { group: name, changes: -1, loading: false };
  const g = groups.get(name);
  const partitions = $('seek-partition');
  partitions.replaceChildren();
  const all = document.createElement('option');
  all.value = '';
  all.textContent = 'every';
  partitions.append(all);
  for (const p of g.partitions) {
    const o = document.createElement('option');
    o.value = p.partition;
    o.textContent = p.partition;
    partitions.append(o);
  }
  renderGroup(g);
}

function renderGroup(g) {
  $('group-name').textContent = g.group;
  $('group-topic').textContent = `on ${g.topic}`;
  const body = $('partitions').tBodies[0];
  body.replaceChildren();
  for (const p of g.partitions) {
    const row = body.insertRow();
    row.dataset.partition = p.partition;
    cell(row, p.partition, 'num');
    cell(row, p.watermark, 'num');
    cell(row, p.ackRanges.length ? p.ackRanges.map(([a, b]) => `${a}..${b}`).join(' ') : '-');
    cell(row, p.end, 'num');
    cell(row, p.lag, 'num lag');
    cell(row, p.inFlight, 'num');
    cell(row, p.owner);
  }
  // The dead letters are read again only when the feed says they changed.
  if (g.dlqChanges !== dlqRead.changes) readDlq(g.group, g.dlqChanges);
}

async function readDlq(group, changes) {
  if (dlqRead.loading) return; // the read going on is followed by another if needed
  dlqRead.loading = true;
  try {
    const answer = await api('GET', `/admin/dlq/${encodeURIComponent(group)}?max=${DLQ_PAGE}`);
    if (selected !== group) return;
    dlqRead.changes = changes;
    renderDlq(answer.entries);
  } catch (e) {
    say(`dead letters of ${group}: ${e.message}`, true);
  } finally {
    dlqRead.loading = false;
  }
  const now = groups.get(group);
  if (selected === group && now && now.dlqChanges !== dlqRead.changes) readDlq(group, now.dlqChanges);
}

function renderDlq(entries) {
  const n = entries.length;
  $('dlq-count').textContent = n >= DLQ_PAGE ? `${n}+` : String(n);
  $('dlq-count').className = n ? 'badge bad' : 'badge good';
  $('dlq-replay').disabled = n === 0;
  const body = $('dlq').tBodies[0];
  body.replaceChildren();
  for (const d of entries) {
    const row = body.insertRow();
    cell(row, d.partition, 'num');
    cell(row, d.offset, 'num');
    cell(row, d.attempts, 'num');
    cell(row, d.reason);
    cell(row, d.event ? d.event.id : '(not an event)');
    cell(row, d.event ? d.event.type : '-');
  }
}

function renderClients(list) {
  const body = $('clients').tBodies[0];
  body.replaceChildren();
  for (const c of list) {
    const row = body.insertRow();
    row.dataset.client = c.client;
    row.dataset.group = c.group;
    cell(row, c.group);
    cell(row, c.client, 'name');
    cell(row, c.credit, 'num');
    cell(row, c.inFlight, 'num');
    const b = document.createElement('button');
    b.type = 'button';
    b.className = 'evict';
    b.textContent = 'Evict';
    b.addEventListener('click', () => evict(c.client));
    row.insertCell().append(b);
  }
  $('no-clients').hidden = list.length > 0;
}

function renderRateLimits(list) {
  const body = $('ratelimits').tBodies[0];
  body.replaceChildren();
  for (const r of list) {
    const row = body.insertRow();
    row.dataset.topic = r.topic;
    cell(row, r.topic, 'name');
    cell(row, r.eventsPerSecond, 'num');
    cell(row, r.burst, 'num');
  }
}

// ----- levers -----

async function act(what, f) {
  try {
    say(await f(), false);
  } catch (e) {
    say(`${what}: ${e.message}`, true);
  }
}

function evict(client) {
  act(`evict ${client}`, async () => {
    const a = await api('POST', `/admin/clients/${encodeURIComponent(client)}/evict`);
    return `evicted ${a.client} from ${a.groups} group(s): what it held is delivered again`;
  });
}

function replay() {
  const group = selected;
  act(`replay of ${group}`, async () => {
    const a = await api('POST', `/admin/dlq/${encodeURIComponent(group)}/replay?max=${DLQ_PAGE}`);
    return `${group}: replay of ${a.replayed} dead letter(s) started`;
  });
}

function hourAgo() {
  return new Date(Date.now() - 3600 * 1000).toISOString();
}

function seek(e) {
  e.preventDefault();
  const group = selected;
  const by = $('seek-by').value;
  const value = $('seek-value').value.trim();
  const chosen = $('seek-partition').value;
  const partitions = chosen === '' ? groups.get(group).partitions.map((p) => p.partition) : [Number(chosen)];
  act(`seek of ${group}`, async () => {
    const done = [];
    for (const partition of partitions) {
      const body = by === 'time' ? { partition, time: value } : { partition, offset: Number(value) };
      const a = await api('POST', `/admin/subscriptions/${encodeURIComponent(group)}/seek`, body);
      done.push(`${a.partition} at ${a.offset}`);
    }
    return `${group}: partition ${done.join(', ')}`;
  });
}

function setRateLimit(e) {
  e.preventDefault();
  const rule = {
    topic: $('rl-topic').value.trim(),
    eventsPerSecond: Number($('rl-eps').value),
    burst: Number($('rl-burst').value),
  };
  act(`rate limit of ${rule.topic}`, async () => {
    const a = await api('PUT', '/admin/ratelimit', rule);
    return `${a.topic}: ${a.eventsPerSecond} events per second, burst ${a.burst}`;
  });
}

// ----- start -----

document.addEventListener('DOMContentLoaded', () => {
  $('login-form').addEventListener('submit', (e) => {
    e.preventDefault();
    token = $('token').value.trim();
    $('token').value = '';
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    start();
  });
  $('forget').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    token = '';
    askToken('forgotten');
  });
  $('dlq-replay').addEventListener('click', replay);
  $('seek-form').addEventListener('submit', seek);
  $('seek-hour').addEventListener('click', () => {
    $('seek-by').value = 'time';
    $('seek-value').value = hourAgo();
  });
  $('seek-value').value = hourAgo();
  $('ratelimit-form').addEventListener('submit', setRateLimit);
  start();
});
