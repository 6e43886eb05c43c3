// The page at GET /, in Debian's Chromium driven by playwright-core: every
// section loads, what it draws equals what the API answers (the test sends
// the page's own requests again) and what an independent double-precision
// reference computes, an API error is shown as the API words it with its
// field marked, and the page works from a second origin exactly when
// attnd's --cors-origin allows that origin.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import { startAttnd, requireNodeDep, sdpaReference, maxRelErr, decode, post, root } from './support.mjs';

const { chromium } = requireNodeDep('playwright-core');
const shots = path.resolve(root, process.env.ATTND_SHOT_DIR ?? 'build/web');
const chromiumPath = process.env.CHROMIUM ?? '/usr/bin/chromium';

let server, other, browser, statics;

// A second origin: a plain static server for server/web/, as someone would
// serve the page from their own site.
function staticServer() {
  const dir = path.join(root, 'server/web');
  const types = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css' };
  const s = http.createServer((req, res) => {
    const name = new URL(req.url, 'http://x').pathname.replace(/^\/$/, '/index.html');
    const file = path.join(dir, path.basename(name));
    fs.readFile(file, (err, data) => {
      if (err) { res.writeHead(404); res.end(); return; }
      res.writeHead(200, { 'Content-Type': types[path.extname(file)] ?? 'application/octet-stream' });
      res.end(data);
    });
  });
  return new Promise((resolve) => s.listen(0, '127.0.0.1', () => resolve(s)));
}

before(async () => {
  server = await startAttnd();
  statics = await staticServer();
  // Allows the static server's 127.0.0.1 origin only: "localhost" is another origin.
  other = await startAttnd(['--cors-origin', `http://127.0.0.1:${statics.address().port}`]);
  browser = await chromium.launch({
    executablePath: chromiumPath,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  fs.mkdirSync(shots, { recursive: true });
});

after(async () => {
  await browser?.close();
  statics?.close();
  for (const s of [server, other]) if (s) assert.equal(await s.stop(), 0, 'attnd drains and exits 0');
});

/** Opens a page, recording console errors and every compute request it sends. */
async function open(url) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const problems = [];
  const computes = [];
  page.on('console', (m) => { if (m.type() === 'error') problems.push(m.text()); });
  page.on('pageerror', (e) => problems.push(String(e)));
  page.on('request', (r) => {
    if (r.method() === 'POST' && /\/v1\/(attention|multihead)$/.test(r.url()))
      computes.push({ url: r.url(), body: r.postData() });
  });
  const response = await page.goto(url);
  return { page, problems, computes, response };
}

const readyOrError = (page) =>
  page.waitForFunction(() => ['ready', 'error'].includes(document.body.dataset.state), null, { timeout: 120000 });

/** The numbers a heatmap table draws, row-major. */
const drawn = (page, name) =>
  page.$$eval(`table.heatmap[data-name="${name}"] td`, (tds) => tds.map((td) => Number(td.dataset.value)));

/** Sends a body the page sent, again, and decodes the answer. */
async function again(body, overrides = {}) {
  const { __path = '/v1/attention', ...rest } = overrides;
  const req = { ...JSON.parse(body), ...rest };
  const { status, json } = await post(`${server.url}${__path}`, req);
  assert.equal(status, 200, JSON.stringify(json));
  return json;
}

/** float32 equality of what is drawn and what the API answered. */
function sameFloats(got, want, what) {
  assert.equal(got.length, want.length, `${what}: ${got.length} numbers drawn, API has ${want.length}`);
  for (let i = 0; i < got.length; i++)
    assert.equal(Math.fround(got[i]), Math.fround(want[i]), `${what}[${i}]: drawn ${got[i]}, API ${want[i]}`);
}

test('GET / serves the page with a Content-Security-Policy, its files with their types', async () => {
  const res = await fetch(`${server.url}/`);
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /^text\/html/);
  const csp = res.headers.get('content-security-policy');
  assert.match(csp, /default-src 'none'/);
  assert.match(csp, /script-src 'self'(;|$)/);
  const html = await res.text();
  assert.doesNotMatch(html, /<script(?![^>]*\bsrc=)[^>]*>/, 'no inline script');
  assert.doesNotMatch(html, /https?:\/\//, 'no external resource');
  for (const [file, type] of [['app.js', 'text/javascript'], ['attnd.js', 'text/javascript'], ['style.css', 'text/css']]) {
    const r = await fetch(`${server.url}/${file}`);
    assert.equal(r.status, 200, file);
    assert.match(r.headers.get('content-type'), new RegExp(`^${type}`), file);
    assert.equal(await r.text(), fs.readFileSync(path.join(root, 'server/web', file), 'utf8'), `${file} is the embedded file`);
  }
});

test('the page from attnd: every section drawn from the API answers', async () => {
  const { page, problems, computes } = await open(`${server.url}/`);
  await readyOrError(page);
  const state = await page.evaluate(() => document.body.dataset.state);
  const status = await page.textContent('#page-status');
  assert.equal(state, 'ready', `page state ${state}: ${status}; ${problems.join('; ')}`);
  assert.deepEqual(problems, [], 'no console errors (a CSP violation would be one)');
  for (const id of ['playground', 'multihead', 'chapter', 'gradients', 'ex1', 'ex2', 'ex6', 'theorem1', 'corollary1'])
    assert.equal(await page.getAttribute(`#${id}`, 'data-state'), 'ready', id);
  await page.screenshot({ path: path.join(shots, 'page.png'), fullPage: true });
  await page.screenshot({ path: path.join(shots, 'page-top.png') });
  await page.locator('#theorem1').screenshot({ path: path.join(shots, 'page-theorem1.png') });

  // Every control has a label a screen reader reads.
  const unlabelled = await page.$$eval('input, textarea', (els) =>
    els.filter((e) => e.labels.length === 0 && !e.getAttribute('aria-label')).map((e) => e.name || e.id));
  assert.deepEqual(unlabelled, []);

  await test_playground(page);
  await test_multihead(page, computes);
  await test_worked_examples(page);
  await test_theorems(page, computes);
  await test_gradients(page, computes);
  await test_errors(page);
  await page.close();
});

async function test_playground(page) {
  // The textareas hold what was sent: send it again as nested arrays.
  const text = await page.$$eval('#pg-form textarea', (ts) => Object.fromEntries(ts.map((t) => [t.name, t.value])));
  const q = JSON.parse(text.q), k = JSON.parse(text.k), v = JSON.parse(text.v);
  const api = await again(JSON.stringify({ q, k, v, return_weights: true, output_encoding: 'flat' }));
  const W = decode(api.weights), O = decode(api.output);
  const [H, nq, nk] = W.shape, dv = O.shape.at(-1), d = q[0][0].length;
  for (let h = 0; h < H; h++) {
    sameFloats(await drawn(page, `weights-h${h}`), W.data.subarray(h * nq * nk, (h + 1) * nq * nk), `playground weights head ${h}`);
    sameFloats(await drawn(page, `output-h${h}`), O.data.subarray(h * nq * dv, (h + 1) * nq * dv), `playground output head ${h}`);
    const ref = sdpaReference({ q: q[h].flat(), k: k[h].flat(), v: v[h].flat(), nq, nk, d, dv });
    assert.ok(maxRelErr(W.data.subarray(h * nq * nk, (h + 1) * nq * nk), ref.weights) < 1e-5, `weights head ${h} vs reference`);
  }
  // The timing metadata shown is the response's.
  const timing = await page.$eval('#playground .timing', (p) => ({ ...p.dataset, text: p.textContent }));
  assert.match(timing.text, /decode [\d.]+ ms · compute [\d.]+ ms · encode [\d.]+ ms/);
  assert.ok(Number(timing.compute) >= 0 && Number(timing.total) >= Number(timing.compute));
}

async function test_multihead(page, computes) {
  const sent = computes.filter((c) => c.url.endsWith('/v1/multihead'));
  const perHead = sent.find((c) => JSON.parse(c.body).return_weights === true);
  const mean = sent.find((c) => JSON.parse(c.body).return_weights === 'mean');
  assert.ok(perHead && mean, 'the page asked for per-head and mean weights');
  const a = await again(perHead.body, { __path: '/v1/multihead', output_encoding: 'flat' });
  const m = await again(mean.body, { __path: '/v1/multihead', output_encoding: 'flat' });
  const W = decode(a.weights), M = decode(m.weights);
  const [h, n, mm] = W.shape;
  assert.equal(h, 4);
  const labels = await page.$$eval('table[data-name="mh-h0"] tbody th', (ths) => ths.map((t) => t.textContent));
  assert.deepEqual(labels, ['the', 'cat', 'sat', 'on', 'the', 'mat']);
  for (let i = 0; i < h; i++)
    sameFloats(await drawn(page, `mh-h${i}`), W.data.subarray(i * n * mm, (i + 1) * n * mm), `multihead head ${i}`);
  sameFloats(await drawn(page, 'mh-mean'), M.data, 'multihead mean');
  // The mean the server returns is the mean of the heads it returns.
  for (let j = 0; j < n * mm; j++) {
    let s = 0;
    for (let i = 0; i < h; i++) s += W.data[i * n * mm + j];
    assert.ok(Math.abs(s / h - M.data[j]) < 1e-6, `mean weight ${j}`);
  }

  // Cross-attention: a second sentence becomes the keys.
  await page.fill('#mh-form input[name="context"]', 'a dog ran');
  await page.click('#mh-form button[type="submit"]');
  await page.waitForFunction(() => document.querySelector('#multihead').dataset.state === 'ready' &&
    document.querySelectorAll('table[data-name="mh-mean"] thead th').length === 4);
  const cols = await page.$$eval('table[data-name="mh-mean"] thead th', (ths) => ths.slice(1).map((t) => t.textContent));
  assert.deepEqual(cols, ['a', 'dog', 'ran']);
  const cross = computes.filter((c) => c.url.endsWith('/v1/multihead') && JSON.parse(c.body).context && JSON.parse(c.body).return_weights === 'mean').at(-1);
  const c = await again(cross.body, { __path: '/v1/multihead', output_encoding: 'flat' });
  sameFloats(await drawn(page, 'mh-mean'), decode(c.weights).data, 'cross-attention mean');
}

async function test_worked_examples(page) {
  const value = async (id) => Number(await page.getAttribute(`#${id}`, 'data-value'));
  // Worked Example 1: softmax([1/sqrt 2, 0]).
  const w0 = 1 / (1 + Math.exp(-Math.SQRT1_2));
  assert.ok(Math.abs((await value('ex1-w00')) - w0) < 1e-6);
  assert.ok(Math.abs((await value('ex1-w01')) - (1 - w0)) < 1e-6);
  assert.equal((await page.textContent('#ex1-w00')).slice(0, 4), '0.66');
  assert.ok(Math.abs((await value('ex1-o0')) - (w0 * 1 + (1 - w0) * 3)) < 1e-5);
  const ex1 = await post(`${server.url}/v1/attention`, { q: [[1, 0], [0, 1]], k: [[1, 0], [0, 1]], v: [[1, 2], [3, 4]], return_weights: true });
  sameFloats(await drawn(page, 'ex1-weights'), decode(ex1.json.weights).data, 'example 1 weights');

  // Worked Example 2 and Exercise 5: X as Q, K and V, with and without the mask.
  const X = [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]];
  for (const causal of [false, true]) {
    const ref = sdpaReference({ q: X.flat(), k: X.flat(), v: X.flat(), nq: 3, nk: 3, d: 4, dv: 4, causal });
    const api = await post(`${server.url}/v1/attention`, { q: X, k: X, v: X, causal, return_weights: true });
    const got = await drawn(page, causal ? 'ex2-causal' : 'ex2-full');
    sameFloats(got, decode(api.json.weights).data, `example 2 weights, causal ${causal}`);
    assert.ok(maxRelErr(got, ref.weights) < 1e-6, `example 2 vs reference, causal ${causal}`);
    if (causal) {
      assert.deepEqual([got[1], got[2], got[5]], [0, 0, 0], 'the upper triangle is exactly 0');
      sameFloats(await drawn(page, 'ex2-causal-output'), decode(api.json.output).data, 'example 2 causal output');
    }
  }
  assert.equal(await value('ex2-upper'), 0);
  assert.equal(await value('ex2-w00'), 1);

  // Exercise 6: scores 10 and 0, unscaled and scaled by 1/sqrt(64).
  const raw = 1 / (1 + Math.exp(-10)), scaled = 1 / (1 + Math.exp(-1.25));
  assert.ok(Math.abs((await value('ex6-raw0')) - raw) < 1e-6);
  assert.ok(Math.abs((await value('ex6-raw1')) - (1 - raw)) < 1e-6);
  assert.ok(Math.abs((await value('ex6-sc0')) - scaled) < 1e-6);
  assert.ok(Math.abs((await value('ex6-sc1')) - (1 - scaled)) < 1e-6);
  assert.equal(await page.textContent('#ex6-sc0'), '0.7773');
}

async function test_theorems(page, computes) {
  const series = async (chart, key) => page.$$eval(`svg[data-name="${chart}"] g[data-series="${key}"] circle`,
    (cs) => cs.map((c) => ({ x: Number(c.dataset.x), y: Number(c.dataset.y) })));
  const raw = await series('th1-chart', 'raw'), scaled = await series('th1-chart', 'scaled');
  const dks = raw.map((p) => p.x);
  assert.deepEqual(dks, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]);
  const sat = await series('co1-chart', 'max-raw'), ent = await series('co1-chart', 'entropy-raw');
  const entScaled = await series('co1-chart', 'entropy-scaled');
  for (let i = 0; i < dks.length; i++) {
    const dk = dks[i];
    const sent = computes.filter((c) => c.url.endsWith('/v1/attention')).map((c) => ({ c, b: JSON.parse(c.body) }))
      .filter(({ b }) => b.return_stats && b.q.shape?.[1] === dk);
    const withDefault = sent.find(({ b }) => b.scale === undefined), withOne = sent.find(({ b }) => b.scale === 1);
    assert.ok(withDefault && withOne, `d_k=${dk}: both requests sent`);
    const a = await again(withDefault.c.body), b = await again(withOne.c.body);
    // Drawn = answered.
    assert.equal(raw[i].y, a.stats.scores.var, `Var S at d_k=${dk}`);
    assert.equal(scaled[i].y, a.stats.scaled_scores.var, `Var S~ at d_k=${dk}`);
    assert.equal(sat[i].y, b.stats.max_weight.mean, `max weight at d_k=${dk}`);
    assert.equal(ent[i].y, b.stats.entropy.mean, `entropy at d_k=${dk}`);
    // Answered = the variance of q.k computed here from the same inputs.
    const q = decode(withDefault.b.q), k = decode(withDefault.b.k), n = q.shape[0];
    let sum = 0, sq = 0;
    for (let r = 0; r < n; r++)
      for (let j = 0; j < n; j++) {
        let dot = 0;
        for (let c = 0; c < dk; c++) dot += q.data[r * dk + c] * k.data[j * dk + c];
        sum += dot;
        sq += dot * dot;
      }
    const mean = sum / (n * n), variance = sq / (n * n) - mean * mean;
    assert.ok(Math.abs(a.stats.scores.var - variance) < 1e-4 * Math.max(1, variance), `d_k=${dk}: API ${a.stats.scores.var}, here ${variance}`);
    assert.ok(Math.abs(a.stats.scaled_scores.var - variance / dk) < 1e-4 * Math.max(1, variance / dk));
    // Theorem 1 on 4096 scores: Var S near d_k, Var S~ near 1.
    assert.ok(variance / dk > 0.7 && variance / dk < 1.4, `d_k=${dk}: Var(q.k)/d_k = ${variance / dk}`);
  }
  // Corollary 1: unscaled, one key takes (almost) everything at large d_k.
  assert.ok(sat.at(-1).y > 0.9 && sat[0].y < 0.5, `max weight ${sat[0].y} -> ${sat.at(-1).y}`);
  assert.ok(ent.at(-1).y < 0.3 && entScaled.at(-1).y > 2, `entropy ${ent.at(-1).y} unscaled, ${entScaled.at(-1).y} scaled`);
  // The table under the chart has the same numbers.
  const rows = await page.$$eval('table[data-name="th1-numbers"] tbody tr', (trs) => trs.map((tr) => [...tr.querySelectorAll('td')].map((td) => Number(td.dataset.value))));
  assert.equal(rows.length, dks.length);
  rows.forEach((r, i) => assert.equal(r[1], raw[i].y));
}

async function test_gradients(page, computes) {
  const sent = computes.filter((c) => JSON.parse(c.body).grad_output).at(-1);
  const a = await again(sent.body, { output_encoding: 'flat' });
  const X = [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]];
  const dO = JSON.parse(sent.body).grad_output;
  const ref = sdpaReference({ q: X.flat(), k: X.flat(), v: X.flat(), nq: 3, nk: 3, d: 4, dv: 4, dO: dO.flat() });
  for (const [name, key] of [['gr-dq', 'q'], ['gr-dk', 'k'], ['gr-dv', 'v']]) {
    const got = await drawn(page, name);
    sameFloats(got, decode(a.grad[key]).data, `d${key}`);
    assert.ok(maxRelErr(got, ref.grad[key]) < 1e-5, `d${key} vs reference: ${maxRelErr(got, ref.grad[key])}`);
  }
}

async function test_errors(page) {
  // A shape error, worded by the API, with K marked.
  await page.fill('#pg-form textarea[name="q"]', '[[1, 0]]');
  await page.fill('#pg-form textarea[name="k"]', '[[1, 0, 0]]');
  await page.fill('#pg-form textarea[name="v"]', '[[1]]');
  // By keyboard: focus the submit button and press Enter.
  await page.focus('#pg-form button[type="submit"]');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => document.body.dataset.state === 'error');
  const want = await post(`${server.url}/v1/attention`, { q: [[1, 0]], k: [[1, 0, 0]], v: [[1]] });
  assert.equal(want.status, 422);
  const box = '#playground > .error';
  assert.equal(await page.isVisible(box), true);
  assert.equal(await page.textContent(`${box} .message`), want.json.error.message);
  assert.equal(await page.getAttribute(box, 'data-code'), 'shape_mismatch');
  assert.equal(await page.getAttribute(box, 'data-field'), 'k');
  assert.match(await page.getAttribute('#pg-form [data-field="k"]', 'class'), /\binvalid\b/);
  assert.equal(await page.getAttribute('#pg-form textarea[name="k"]', 'aria-invalid'), 'true');
  assert.equal(await page.getAttribute('#pg-form textarea[name="q"]', 'aria-invalid'), null);
  await page.screenshot({ path: path.join(shots, 'page-error.png'), clip: await page.$eval('#playground', (e) => { const r = e.getBoundingClientRect(); return { x: r.x, y: r.y + window.scrollY, width: r.width, height: Math.min(r.height, 700) }; }), fullPage: true });

  // A number that is not a float32: 400, field q.
  await page.fill('#pg-form textarea[name="q"]', '[[1e39, 0]]');
  await page.fill('#pg-form textarea[name="k"]', '[[1, 0]]');
  await page.click('#pg-form button[type="submit"]');
  await page.waitForFunction(() => document.querySelector('#playground > .error').dataset.code === 'invalid_number');
  assert.equal(await page.getAttribute('#pg-form textarea[name="q"]', 'aria-invalid'), 'true');
  assert.equal(await page.getAttribute('#pg-form textarea[name="k"]', 'aria-invalid'), null);
  assert.match(await page.textContent('#playground > .error'), /^400 invalid_number/);

  // Fixed, it computes again and the error goes.
  await page.fill('#pg-form textarea[name="q"]', '[[1, 0]]');
  await page.click('#pg-form button[type="submit"]');
  await page.waitForFunction(() => document.body.dataset.state === 'ready');
  assert.equal(await page.isVisible('#playground > .error'), false);
  assert.deepEqual(await drawn(page, 'weights-h0'), [1]);
}

test('the playground\'s ragged batch draws block-diagonal weights, each block its sequence alone', async () => {
  const { page, problems, computes } = await open(`${server.url}/`);
  await readyOrError(page);
  await page.check('#pg-form input[name="ragged"]');
  await page.fill('#pg-form input[name="seq_lens"]', '2, 3, 1');
  await page.click('#pg-form button[type="submit"]');
  await page.waitForFunction(() => /3 sequences/.test(document.querySelector('#playground .timing')?.textContent ?? ''));
  assert.deepEqual(problems, []);
  const sent = computes.filter((c) => c.url.endsWith('/v1/attention') && JSON.parse(c.body).seq_lens).at(-1);
  assert.ok(sent, 'the playground sent seq_lens');
  const req = JSON.parse(sent.body);
  assert.deepEqual(req.seq_lens, [2, 3, 1]);
  const api = await again(sent.body, { output_encoding: 'flat' });
  const W = decode(api.weights);
  const [H, n] = [W.shape.length > 2 ? W.shape[0] : 1, W.shape.at(-1)];
  const blocks = [[0, 2], [2, 5], [5, 6]];
  const seqOf = (i) => blocks.findIndex(([a, b]) => i >= a && i < b);
  for (let h = 0; h < H; h++) {
    const got = await drawn(page, `weights-h${h}`);
    sameFloats(got, W.data.subarray(h * n * n, (h + 1) * n * n), `ragged weights head ${h}`);
    const q = H > 1 ? req.q[h] : req.q, k = H > 1 ? req.k[h] : req.k, v = H > 1 ? req.v[h] : req.v;
    for (const [a, b] of blocks) {
      // The block is its sequence computed alone, and the rest of its rows 0.
      const ref = sdpaReference({ q: q.slice(a, b).flat(), k: k.slice(a, b).flat(), v: v.slice(a, b).flat(),
        nq: b - a, nk: b - a, d: q[0].length, dv: v[0].length });
      const block = [];
      for (let i = a; i < b; i++)
        for (let j = 0; j < n; j++) {
          if (j >= a && j < b) block.push(got[i * n + j]);
          else assert.equal(got[i * n + j], 0, `head ${h}: weight (${i}, ${j}) outside the blocks`);
        }
      assert.ok(maxRelErr(block, ref.weights) < 1e-5, `head ${h}, sequence [${a}, ${b}) vs its reference`);
    }
    // The cells outside the blocks are set apart, those inside carry their sequence.
    const marks = await page.$$eval(`table.heatmap[data-name="weights-h${h}"] td`, (tds) =>
      tds.map((td) => (td.classList.contains('outside') ? -1 : Number(td.dataset.seq))));
    marks.forEach((m, c) => {
      const i = Math.floor(c / n), j = c % n;
      assert.equal(m, seqOf(i) === seqOf(j) ? seqOf(i) : -1, `head ${h}: cell (${i}, ${j}) marked ${m}`);
    });
  }
  await page.locator('#playground').screenshot({ path: path.join(shots, 'page-ragged.png') });

  // Lengths that do not add up to the rows: the API's 422, the field marked.
  await page.fill('#pg-form input[name="seq_lens"]', '2, 3');
  await page.click('#pg-form button[type="submit"]');
  await page.waitForFunction(() => document.querySelector('#playground > .error').dataset.code === 'shape_mismatch');
  assert.equal(await page.getAttribute('#playground > .error', 'data-field'), 'seq_lens');
  assert.match(await page.getAttribute('#pg-form [data-field="seq_lens"]', 'class'), /\binvalid\b/);
  await page.close();
});

test('from a second origin: works where --cors-origin allows it, says why where it does not', async () => {
  const port = statics.address().port;
  // Allowed origin.
  {
    const { page, problems } = await open(`http://127.0.0.1:${port}/index.html?api=${encodeURIComponent(other.url)}`);
    await readyOrError(page);
    assert.equal(await page.evaluate(() => document.body.dataset.state), 'ready', problems.join('; '));
    const w = Number(await page.getAttribute('#ex1-w00', 'data-value'));
    assert.ok(Math.abs(w - 1 / (1 + Math.exp(-Math.SQRT1_2))) < 1e-6);
    assert.match(await page.textContent('#server-info'), /^attnd /);
    await page.close();
  }
  // The same files from http://localhost:PORT, an origin attnd does not allow.
  {
    const { page } = await open(`http://localhost:${port}/index.html?api=${encodeURIComponent(other.url)}`);
    await readyOrError(page);
    assert.equal(await page.evaluate(() => document.body.dataset.state), 'error');
    assert.equal(await page.isVisible('#page-status'), true);
    assert.match(await page.textContent('#page-status'), /failed/);
    assert.match(await page.textContent('#playground > .error'), /no answer from http:\/\/127\.0\.0\.1:\d+\/v1\/attention/);
    await page.close();
  }
  // What the browser was refused, from attnd's side: no Access-Control-Allow-Origin.
  const res = await fetch(`${other.url}/v1/info`, { headers: { Origin: `http://localhost:${port}` } });
  assert.equal(res.headers.get('access-control-allow-origin'), null);
});
