// docker/nginx.conf as a KV cache balancer, run by a real nginx (Debian's) in
// front of three stub replicas that keep caches the way attnd does: a cache
// lives on the replica that created it, named by the X-Request-ID of the
// creating request; any other replica answers 404 cache_not_found. The file
// is run as it is, with only its upstream lines pointed at the stubs, its
// listen port and its log file changed (as tests/test_server.c does).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { root } from './support.mjs';

const nginxBin = fs.existsSync('/usr/sbin/nginx') ? '/usr/sbin/nginx' : 'nginx';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const freePort = () => new Promise((resolve) => {
  const s = net.createServer().listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
});

/** A replica that answers with its name and holds the caches created on it. */
function startStub(name) {
  const caches = new Set();
  const seen = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => { body += d; });
    req.on('end', () => {
      seen.push({ method: req.method, url: req.url, requestId: req.headers['x-request-id'] ?? null });
      const reply = (status, obj, headers = {}) => {
        res.writeHead(status, { 'Content-Type': 'application/json', ...headers });
        res.end(JSON.stringify({ replica: name, ...obj }));
      };
      const m = /^\/v1\/caches\/([^/]+)(\/attention)?$/.exec(req.url);
      if (req.url === '/v1/caches' && req.method === 'POST') {
        const id = req.headers['x-request-id'];
        if (!/^[0-9a-f]{32}$/.test(id ?? '')) return reply(400, { error: `no balancer key: ${id}` });
        caches.add(id);
        return reply(201, { id }, { Location: `/v1/caches/${id}` });
      }
      if (m) {
        if (!caches.has(m[1])) return reply(404, { error: 'cache_not_found' });
        if (req.method === 'DELETE' && !m[2]) { caches.delete(m[1]); return reply(200, { deleted: m[1] }); }
        return reply(200, { id: m[1] });
      }
      return reply(200, {});
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({
    name, caches, seen, port: server.address().port,
    stop: () => new Promise((done) => { server.close(done); server.closeAllConnections(); }),
  })));
}

/** docker/nginx.conf with each upstream's run of replica lines replaced. */
function nginxConf(dir, port, stubs) {
  let inRun = false, upstreams = 0, listen = 0;
  const lines = [];
  for (const line of fs.readFileSync(path.join(root, 'docker/nginx.conf'), 'utf8').split('\n')) {
    const t = line.trimStart();
    const replica = t.startsWith('server attnd');
    if (replica && !inRun) {
      upstreams++;
      for (const s of stubs) lines.push(`        server 127.0.0.1:${s.port} max_fails=1 fail_timeout=10s;`);
    } else if (replica) {
      // the rest of the run
    } else if (t.startsWith('listen ')) {
      listen++;
      lines.push(`        listen 127.0.0.1:${port};`);
    } else if (t.startsWith('access_log ')) {
      lines.push(`    access_log ${dir}/access.log;`);
    } else {
      lines.push(line);
    }
    inRun = replica;
  }
  assert.equal(upstreams, 2, 'two upstreams: round robin and the caches\' hash ring');
  assert.equal(listen, 1);
  fs.writeFileSync(path.join(dir, 'nginx.conf'), lines.join('\n'));
  return path.join(dir, 'nginx.conf');
}

let dir, stubs, nginx, lb, nginxLog = '';
const nginxArgs = (conf) => ['-p', dir, '-e', path.join(dir, 'error.log'), '-c', conf,
  '-g', `daemon off; pid ${dir}/nginx.pid;${process.getuid() === 0 ? ' user root;' : ''}`];

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'attnd-balancer-'));
  fs.chmodSync(dir, 0o755);
  stubs = await Promise.all(['attnd-1', 'attnd-2', 'attnd-3'].map(startStub));
  const port = await freePort();
  const conf = nginxConf(dir, port, stubs);
  const t = spawnSync(nginxBin, ['-t', ...nginxArgs(conf)], { encoding: 'utf8' });
  assert.equal(t.status, 0, `nginx -t: ${t.stdout}${t.stderr}`);
  nginx = spawn(nginxBin, nginxArgs(conf), { stdio: ['ignore', 'ignore', 'pipe'] });
  nginx.stderr.on('data', (d) => { nginxLog += d; });
  lb = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 100; i++) {
    try { await fetch(`${lb}/healthz`); return; } catch { await sleep(50); }
  }
  throw new Error(`nginx did not start: ${nginxLog}`);
});

after(async () => {
  nginx?.kill('SIGQUIT');
  if (nginx) await new Promise((r) => nginx.on('exit', r));
  await Promise.all((stubs ?? []).map((s) => s.stop().catch(() => {})));
  fs.rmSync(dir, { recursive: true, force: true });
});

const call = async (method, url, headers = {}) => {
  const r = await fetch(`${lb}${url}`, { method, headers, body: method === 'POST' ? '{}' : undefined });
  return { status: r.status, location: r.headers.get('location'), body: await r.json() };
};

let created = [];

test('nginx -t accepts docker/nginx.conf and a cache is created on any replica, named by a fresh 128-bit key', async () => {
  for (let i = 0; i < 30; i++) {
    // A client's own X-Request-ID is not what names the cache.
    const r = await call('POST', '/v1/caches', i % 2 ? { 'X-Request-ID': 'client-chosen' } : {});
    assert.equal(r.status, 201, JSON.stringify(r.body));
    assert.match(r.body.id, /^[0-9a-f]{32}$/);
    assert.equal(r.location, `/v1/caches/${r.body.id}`);
    created.push({ id: r.body.id, location: r.location, replica: r.body.replica });
  }
  assert.equal(new Set(created.map((c) => c.id)).size, 30, 'every id is new');
  const per = Object.fromEntries(stubs.map((s) => [s.name, created.filter((c) => c.replica === s.name).length]));
  assert.ok(Object.values(per).every((n) => n > 0), `creations spread over every replica: ${JSON.stringify(per)}`);
});

test('every request to a cache\'s Location, with or without a sub-path, reaches the replica that created it', async () => {
  for (const c of created) {
    for (const [method, url] of [['GET', c.location], ['POST', `${c.location}/attention`],
      ['POST', `${c.location}/attention`], ['GET', c.location]]) {
      const r = await call(method, url);
      assert.equal(r.status, 200, `${method} ${url}: ${JSON.stringify(r.body)}`);
      assert.equal(r.body.replica, c.replica, `${method} ${url} reached ${r.body.replica}, the cache is on ${c.replica}`);
    }
  }
});

test('stateless requests still take turns over every replica, X-Request-ID passed through', async () => {
  const before = stubs.map((s) => s.seen.filter((x) => x.url === '/v1/attention').length);
  for (let i = 0; i < 30; i++) {
    const r = await call('POST', '/v1/attention', { 'X-Request-ID': `trace-${i}` });
    assert.equal(r.status, 200);
  }
  const got = stubs.map((s, i) => s.seen.filter((x) => x.url === '/v1/attention').length - before[i]);
  assert.ok(got.every((n) => n >= 5), `round robin: ${got}`);
  const ids = stubs.flatMap((s) => s.seen.filter((x) => x.url === '/v1/attention').map((x) => x.requestId));
  assert.ok(ids.includes('trace-0') && ids.includes('trace-29'), 'the client\'s X-Request-ID reaches attnd');
});

test('one replica gone: its caches answer 404 cache_not_found at once, every other cache stays where it is', async () => {
  const victim = stubs[0];
  await victim.stop();
  let slowest = 0;
  for (const c of created) {
    const t0 = Date.now();
    const r = await call('POST', `${c.location}/attention`);
    slowest = Math.max(slowest, Date.now() - t0);
    if (c.replica === victim.name) {
      assert.equal(r.status, 404, `${c.id} was on the stopped replica: ${JSON.stringify(r.body)}`);
      assert.equal(r.body.error, 'cache_not_found');
      assert.notEqual(r.body.replica, victim.name);
    } else {
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.body.replica, c.replica, `${c.id} moved from ${c.replica} to ${r.body.replica}`);
    }
  }
  assert.ok(slowest < 1000, `every answer within a second (the slowest took ${slowest} ms)`);
  // New caches go to the replicas that are left, and are found again.
  for (let i = 0; i < 6; i++) {
    const r = await call('POST', '/v1/caches');
    assert.equal(r.status, 201);
    assert.notEqual(r.body.replica, victim.name);
    const g = await call('GET', r.location);
    assert.equal(g.status, 200);
    assert.equal(g.body.replica, r.body.replica);
  }
});
