// The page at GET /, in Debian's Chromium driven by playwright-core: every
// section loads, what it draws equals what the API answers (the test sends
// the page's own requests again) and what an independent double-precision
// reference computes, an API error is shown as the API words it with its
// field marked (an offset into the body traced back to the text typed),
// and the page works from a second origin exactly when attnd's
// --cors-origin allows that origin. At 1400 px and at 390 px (a phone)
// nothing scrolls sideways, every label of a chart or heatmap is drawn at
// 10 px or more, and every heatmap shows every column.
//
// The screenshots of docs/ are taken here as the checks pass:
// ATTND_SHOT_DIR=docs (make screenshots) writes them there, otherwise they
// go to build/web.
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

const DESKTOP = { width: 1400, height: 900 };
const PHONE = { width: 390, height: 844 };

/**
 * Opens a page, recording console errors, dialogs (a script that got in
 * would open one) and every compute request it sends.
 */
async function open(url, viewport = DESKTOP) {
  const page = await browser.newPage({ viewport });
  const problems = [];
  const computes = [];
  page.on('console', (m) => { if (m.type() === 'error') problems.push(m.text()); });
  page.on('pageerror', (e) => problems.push(String(e)));
  page.on('dialog', (d) => { problems.push(`dialog: ${d.message()}`); d.dismiss(); });
  page.on('request', (r) => {
    if (r.method() === 'POST' && /\/v1\/(attention|multihead|caches\/[^/]+\/attention)$/.test(r.url()))
      computes.push({ url: r.url(), body: r.postData() });
  });
  const response = await page.goto(url);
  return { page, problems, computes, response };
}

const readyOrError = (page) =>
  page.waitForFunction(() => ['ready', 'error'].includes(document.body.dataset.state), null, { timeout: 120000 });

// The page at 1400 px, loaded once: the tests after the first one that
// opens it change its forms, each setting every input it depends on.
let desktop = null;
async function desktopPage() {
  if (desktop) return desktop;
  desktop = await open(`${server.url}/`);
  await readyOrError(desktop.page);
  return desktop;
}

/**
 * Waits for predicate(arg) to hold in the page; if it does not within a
 * minute, fails saying what was awaited and what the page shows instead.
 */
async function until(page, what, predicate, arg = null) {
  try {
    await page.waitForFunction(predicate, arg, { timeout: 60000 });
  } catch (e) {
    const seen = await page.evaluate(() => ({
      body: document.body.dataset.state,
      sections: [...document.querySelectorAll('[data-state]')].map((s) => `${s.id || s.tagName}=${s.dataset.state}`).join(' '),
      errors: [...document.querySelectorAll('.error:not([hidden])')].map((b) => b.textContent).join(' | '),
      focus: document.activeElement?.outerHTML.slice(0, 80),
    })).catch((err) => String(err));
    assert.fail(`waited for ${what}: ${e.message.split('\n')[0]}; the page shows ${JSON.stringify(seen)}`);
  }
}

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

/** A screenshot of the page or of one element, into the screenshot directory. */
async function shot(page, name, selector = null) {
  const file = path.join(shots, name);
  if (selector) await page.locator(selector).first().screenshot({ path: file });
  else await page.screenshot({ path: file });
}

/**
 * What is wrong with the layout of a page as it is drawn, in words (none:
 * []): the page wider than the window; a label of a chart (at the size it is
 * rendered, an SVG scaled down included) or of a heatmap or table under
 * 10 px; a heatmap row without a cell per column, or a cell too thin to see
 * or past its card or the window; a table of numbers wider than its box.
 * Opens every <details> first, so that their tables count.
 */
function layoutProblems(page) {
  return page.evaluate(() => {
    const out = [];
    for (const d of document.querySelectorAll('details')) d.open = true;
    const W = window.innerWidth;
    const sw = document.documentElement.scrollWidth;
    if (sw > W) out.push(`the page is ${sw} px wide in a ${W} px window`);
    const shown = (e) => {
      const s = getComputedStyle(e), r = e.getBoundingClientRect();
      return s.visibility !== 'hidden' && s.display !== 'none' && r.width > 0 && r.height > 0;
    };
    for (const t of document.querySelectorAll('svg.chart text')) {
      const px = parseFloat(getComputedStyle(t).fontSize) * t.ownerSVGElement.getScreenCTM().a;
      if (px < 10) out.push(`chart label "${t.textContent}" is drawn at ${px.toFixed(1)} px`);
      if (t.getBoundingClientRect().right > W) out.push(`chart label "${t.textContent}" is past the window`);
    }
    const labels = 'table.heatmap caption, table.heatmap th > span, table.heatmap td > span, figure .legend span, figcaption, table.numbers th, table.numbers td';
    for (const t of document.querySelectorAll(labels)) {
      const px = parseFloat(getComputedStyle(t).fontSize);
      if (shown(t) && px < 10) out.push(`label "${t.textContent}" is ${px} px`);
    }
    for (const table of document.querySelectorAll('table.heatmap')) {
      const name = table.dataset.name, cols = Number(table.dataset.cols);
      const card = table.closest('.card').getBoundingClientRect();
      const right = Math.min(W, card.right);
      const bad = [];
      for (const tr of table.tBodies[0].rows) {
        const tds = tr.querySelectorAll('td');
        if (tds.length !== cols) bad.push(`a row has ${tds.length} cells of ${cols}`);
        for (const td of tds) {
          const r = td.getBoundingClientRect();
          if (r.width < 1.5 || r.height < 1.5) bad.push(`a cell is ${r.width.toFixed(1)} x ${r.height.toFixed(1)} px`);
          if (r.right > right + 0.5 || r.left < card.left) bad.push(`a cell spans ${r.left.toFixed(0)}-${r.right.toFixed(0)} px, its card ${card.left.toFixed(0)}-${right.toFixed(0)}`);
        }
      }
      if (bad.length) out.push(`heatmap ${name}: ${bad[0]} (${bad.length} problems)`);
    }
    for (const t of document.querySelectorAll('table.numbers')) {
      const box = t.parentElement;
      if (t.getBoundingClientRect().width > box.clientWidth + 0.5)
        out.push(`table ${t.dataset.name} is ${t.getBoundingClientRect().width} px in a ${box.clientWidth} px box`);
    }
    return out;
  });
}

/** Sets the playground's random-input fields and presses "Random Q, K, V". */
async function randomInputs(page, { nq, nk, dk = 4, dv = 3, heads = 1, seed = 1, causal = false, mask = '' }) {
  await page.evaluate(({ nq, nk, dk, dv, heads, seed, causal, mask }) => {
    const f = document.getElementById('pg-form').elements;
    Object.assign(f.n_q, { value: nq }); Object.assign(f.n_k, { value: nk });
    Object.assign(f.d_k, { value: dk }); Object.assign(f.d_v, { value: dv });
    Object.assign(f.heads, { value: heads }); Object.assign(f.seed, { value: seed });
    f.causal.checked = causal;
    f.ragged.checked = false;
    f.mask.value = mask;
    f.scale.value = '';
  }, { nq, nk, dk, dv, heads, seed, causal, mask });
  await page.click('#pg-random');
  await until(page, `the playground's ${nq} x ${nk} weights`, ({ nq, nk }) => {
    const t = document.querySelector('table.heatmap[data-name="weights-h0"]');
    return document.querySelector('#playground').dataset.state !== 'loading' && t && t.dataset.rows === String(nq) && t.dataset.cols === String(nk);
  }, { nq, nk });
}

/**
 * Fills a form's textareas (fields: name -> text), causal box and (in the
 * playground) ragged lengths (none: one sequence), presses its Compute
 * button and waits for the section's answer or error.
 */
async function computeTyped(page, fields, { causal = false, ragged = '', form = '#pg-form', section = '#playground' } = {}) {
  for (const [name, value] of Object.entries(fields)) await page.fill(`${form} textarea[name="${name}"]`, value);
  await page.setChecked(`${form} input[name="causal"]`, causal);
  if (form === '#pg-form') {
    await page.setChecked(`${form} input[name="ragged"]`, Boolean(ragged));
    if (ragged) await page.fill(`${form} input[name="seq_lens"]`, ragged);
  }
  await page.evaluate((s) => { document.querySelector(s).dataset.state = 'sent'; }, section);
  await page.click(`${form} button[type="submit"]`);
  await until(page, `an answer in ${section}`, (s) => ['ready', 'error'].includes(document.querySelector(s).dataset.state), section);
}

/** What an error box says and names. */
const errorBox = (page, section) => page.$eval(`${section} > .error`, (b) => ({
  hidden: b.hidden, text: b.textContent, message: b.querySelector('.message')?.textContent ?? null,
  ...b.dataset,
}));

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

test('at 1400 px: every section drawn from the API answers, nothing scrolls sideways, labels of 10 px or more', async () => {
  const { page, problems, computes } = await desktopPage();
  const state = await page.evaluate(() => document.body.dataset.state);
  const status = await page.textContent('#page-status');
  assert.equal(state, 'ready', `page state ${state}: ${status}; ${problems.join('; ')}`);
  assert.deepEqual(problems, [], 'no console errors (a CSP violation would be one)');
  for (const id of ['playground', 'multihead', 'chapter', 'gradients', 'decoding', 'ex1', 'ex2', 'ex6', 'theorem1', 'corollary1'])
    assert.equal(await page.getAttribute(`#${id}`, 'data-state'), 'ready', id);
  await shot(page, 'page.png');
  await shot(page, 'page-theorem1.png', '#theorem1');
  await shot(page, 'page-corollary1.png', '#corollary1');
  assert.deepEqual(await layoutProblems(page), []);

  // Every control has a label a screen reader reads.
  const unlabelled = await page.$$eval('input, textarea', (els) =>
    els.filter((e) => e.labels.length === 0 && !e.getAttribute('aria-label')).map((e) => e.name || e.id));
  assert.deepEqual(unlabelled, []);

  await test_playground(page);
  await test_multihead(page, computes);
  await test_worked_examples(page);
  await test_theorems(page, computes);
  await test_gradients(page, computes);
  await test_decoding(page, computes);
});

async function test_decoding(page, computes) {
  // Each step sent one token to a cache; what is drawn is the steps' rows,
  // and they are /v1/attention's causal rows over the three tokens.
  const steps = computes.filter((c) => /\/v1\/caches\/[^/]+\/attention$/.test(c.url));
  assert.equal(steps.length, 3, 'three decoding steps');
  const X = [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]];
  const a = await again(JSON.stringify({ q: X, k: X, v: X, causal: true, output_encoding: 'flat' }));
  const ref = sdpaReference({ q: X.flat(), k: X.flat(), v: X.flat(), nq: 3, nk: 3, d: 4, dv: 4, causal: true });
  const got = await drawn(page, 'dc-decoded');
  assert.ok(maxRelErr(Float32Array.from(got), ref.output) < 1e-5, `decoded rows vs the reference: ${got}`);
  sameFloats(await drawn(page, 'dc-whole'), decode(a.output).data, 'causal attention drawn');
}

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
  await until(page, 'cross-attention over 3 words', () => document.querySelector('#multihead').dataset.state === 'ready' &&
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

test('Corollary 1: the largest weight against its own axis (0 to 1), the entropy against another (0 to ln 128 and more)', async () => {
  const { page } = await desktopPage();
  const chart = 'svg[data-name="co1-chart"]';
  const axes = Object.fromEntries(await page.$$eval(`${chart} g.axis[data-axis="left"], ${chart} g.axis[data-axis="right"]`, (gs) => gs.map((g) => [g.dataset.axis, {
    lo: Number(g.dataset.min), hi: Number(g.dataset.max), label: g.querySelector('text.label').textContent,
    ticks: [...g.querySelectorAll('text[data-y]')].map((t) => ({ value: Number(t.dataset.value), y: Number(t.dataset.y) })),
  }])));
  assert.deepEqual(Object.keys(axes).sort(), ['left', 'right']);
  assert.match(axes.left.label, /weight/);
  assert.match(axes.right.label, /entropy/);
  assert.deepEqual([axes.left.lo, axes.left.hi], [0, 1]);
  assert.equal(axes.right.lo, 0);
  assert.ok(axes.right.hi >= Math.log(128), `the entropy axis reaches ${axes.right.hi}, uniform is ln 128`);
  const series = await page.$$eval(`${chart} g.series`, (gs) => gs.map((g) => ({
    key: g.dataset.series, axis: g.dataset.axis,
    points: [...g.querySelectorAll('circle')].map((c) => ({ y: Number(c.dataset.y), cy: Number(c.getAttribute('cy')) })),
  })));
  assert.deepEqual(series.map((s) => [s.key, s.axis]),
    [['max-raw', 'left'], ['entropy-raw', 'right'], ['max-scaled', 'left'], ['entropy-scaled', 'right']]);
  // Every point sits where its own axis's ticks put its value.
  for (const s of series) {
    const a = axes[s.axis], t0 = a.ticks[0], t1 = a.ticks.at(-1);
    for (const p of s.points) {
      const want = t0.y + ((p.y - t0.value) / (t1.value - t0.value)) * (t1.y - t0.y);
      assert.ok(Math.abs(p.cy - want) < 0.01, `${s.key} ${p.y} drawn at y ${p.cy}, its axis puts it at ${want}`);
    }
  }
  // Unscaled at d_k = 1024 the largest weight is near 1: at the top of the plot.
  const top = axes.left.ticks.at(-1).y, bottom = axes.left.ticks[0].y;
  const last = series[0].points.at(-1);
  assert.ok(last.cy < top + 0.2 * (bottom - top), `max weight ${last.y} drawn ${last.cy - top} px below the top of a ${bottom - top} px plot`);
});

test('at 390 px (a phone): nothing scrolls sideways, labels of 10 px or more, every heatmap column shown', async () => {
  const { page, problems } = await open(`${server.url}/`, PHONE);
  await readyOrError(page);
  assert.equal(await page.evaluate(() => document.body.dataset.state), 'ready', problems.join('; '));
  assert.deepEqual(await layoutProblems(page), []);
  // The charts are drawn for the phone, not shrunk: their labels keep their size.
  const chartWidths = await page.$$eval('svg.chart', (ss) => ss.map((s) => s.getBoundingClientRect().width));
  assert.ok(chartWidths.every((w) => w <= PHONE.width), `charts ${chartWidths} px wide`);
  await shot(page, 'page-phone.png', '#corollary1');
  // Numbers in the cells where they fit (6 x 6), colour only where they do not (40 x 64).
  assert.equal(await page.$eval('table[data-name="weights-h0"]', (t) => t.classList.contains('dense')), false);
  assert.equal(await page.isVisible('table[data-name="weights-h0"] td > span'), true);
  await randomInputs(page, { nq: 40, nk: 64, heads: 1 });
  assert.equal(await page.$eval('table[data-name="weights-h0"]', (t) => t.classList.contains('dense')), true);
  assert.deepEqual(await layoutProblems(page), []);
  await shot(page, 'page-phone-dense.png', '#pg-weights');
  // Turned sideways, it is drawn again for the new width; and so at a
  // width where the charts' keys move from under the plot to its right.
  for (const width of [844, 700, 620]) {
    await page.setViewportSize({ width, height: 390 });
    // An SVG scaled by CSS fits its box before it is redrawn: the heatmap,
    // drawn in the same ResizeObserver callback, says when that has run.
    await until(page, `the chart and the heatmap redrawn for ${width} px`, () => {
      const box = document.getElementById('co1-plot').getBoundingClientRect().width;
      const table = document.querySelector('table[data-name="weights-h0"]');
      return box > 390 && Math.abs(document.querySelector('svg[data-name="co1-chart"]').getBoundingClientRect().width - box) < 1.5 &&
        table.getBoundingClientRect().right <= table.closest('.maps').getBoundingClientRect().right + 0.5;
    });
    assert.deepEqual(await layoutProblems(page), [], `at ${width} px`);
  }
  assert.deepEqual(problems, []);
  await page.close();
});

async function test_errors(page) {
  // A shape error, worded by the API, with K marked.
  await page.fill('#pg-form textarea[name="q"]', '[[1, 0]]');
  await page.fill('#pg-form textarea[name="k"]', '[[1, 0, 0]]');
  await page.fill('#pg-form textarea[name="v"]', '[[1]]');
  await page.fill('#pg-form textarea[name="mask"]', '');
  await page.setChecked('#pg-form input[name="causal"]', false);
  // By keyboard: focus the submit button and press Enter.
  await page.focus('#pg-form button[type="submit"]');
  await page.keyboard.press('Enter');
  await until(page, 'the shape error', () => document.body.dataset.state === 'error');
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

  // A number that is not a float32: 400, field q.
  await page.fill('#pg-form textarea[name="q"]', '[[1e39, 0]]');
  await page.fill('#pg-form textarea[name="k"]', '[[1, 0]]');
  await page.click('#pg-form button[type="submit"]');
  await until(page, 'the invalid_number error', () => document.querySelector('#playground > .error').dataset.code === 'invalid_number');
  assert.equal(await page.getAttribute('#pg-form textarea[name="q"]', 'aria-invalid'), 'true');
  assert.equal(await page.getAttribute('#pg-form textarea[name="k"]', 'aria-invalid'), null);
  assert.match(await page.textContent('#playground > .error'), /^400 invalid_number/);

  // Fixed, it computes again and the error goes.
  await page.fill('#pg-form textarea[name="q"]', '[[1, 0]]');
  await page.click('#pg-form button[type="submit"]');
  await until(page, 'the fixed request answered', () => document.body.dataset.state === 'ready');
  assert.equal(await page.isVisible('#playground > .error'), false);
  assert.deepEqual(await drawn(page, 'weights-h0'), [1]);
}

test('an API error is shown as the API words it, with its field marked', async () => {
  const { page } = await desktopPage();
  await test_errors(page);
});

test('an error that names no field shows its status, code and message, and nothing after', async () => {
  const { page } = await desktopPage();
  const body = { q: [[1e30]], k: [[1e30]], v: [[1]] };
  const want = await post(`${server.url}/v1/attention`, body);
  assert.equal(want.status, 422);
  assert.equal(want.json.error.field, undefined, 'this error names no field');
  await computeTyped(page, { q: '[[1e30]]', k: '[[1e30]]', v: '[[1]]', mask: '' });
  const box = await errorBox(page, '#playground');
  assert.equal(box.hidden, false);
  assert.equal(box.code, 'numerical_overflow');
  assert.equal(box.text, `422 numerical_overflow ${want.json.error.message}`);
  assert.equal(await page.$$eval('#pg-form [aria-invalid]', (els) => els.length), 0, 'no input marked');
});

test('a JSON mistake is traced from the body to the field, line and column typed, and selected there', async () => {
  const { page } = await desktopPage();
  const selected = (name, form = '#pg-form') => page.$eval(`${form} textarea[name="${name}"]`, (t) => ({
    focused: document.activeElement === t, text: t.value.slice(t.selectionStart, t.selectionEnd),
    invalid: t.getAttribute('aria-invalid'),
  }));

  // On Q's first line: the body has `{"q": ` before it, the column counts from Q's own start.
  await computeTyped(page, { q: '[[1, 2 3]]', k: '[[1, 0]]', v: '[[1]]', mask: '' });
  let box = await errorBox(page, '#playground');
  assert.equal(box.code, 'invalid_json');
  assert.deepEqual([box.field, box.line, box.column], ['q', '1', '8']);
  assert.doesNotMatch(box.text, /at byte/, 'no offset into a body the user never saw');
  assert.match(box.text, /in Q, line 1, column 8/);
  assert.doesNotMatch(box.text, /null/);
  assert.deepEqual(await selected('q'), { focused: true, text: '3', invalid: 'true' });

  // On Q's second line, at a character of three bytes in UTF-8 (U+2212, a
  // minus sign that is not JSON's): lines and columns count characters.
  await computeTyped(page, { q: '[[1, 2],\n [3, \u22124]]', k: '[[1, 0], [0, 1]]', v: '[[1], [2]]' });
  box = await errorBox(page, '#playground');
  assert.deepEqual([box.code, box.field, box.line, box.column], ['invalid_json', 'q', '2', '6']);
  assert.deepEqual(await selected('q'), { focused: true, text: '\u2212', invalid: 'true' });
  // The top of the playground: the error, and the character selected in Q.
  await page.screenshot({ path: path.join(shots, 'page-error.png'), fullPage: true, clip: await page.$eval('#playground', (e) => {
    const r = e.getBoundingClientRect();
    return { x: r.x, y: r.y + window.scrollY, width: r.width, height: Math.min(r.height, 560) };
  }) });
  assert.equal(await page.getAttribute('#pg-form textarea[name="k"]', 'aria-invalid'), null);

  // K missing its last bracket: the parser stops in the page's text after K,
  // so the error is K's, at its end.
  await computeTyped(page, { q: '[[1, 0]]', k: '[[1, 0]', v: '[[1]]' });
  box = await errorBox(page, '#playground');
  assert.deepEqual([box.code, box.field], ['invalid_json', 'k']);
  assert.match(box.text, /after the end of K/);
  assert.equal((await selected('k')).invalid, 'true');
  assert.equal(await page.getAttribute('#pg-form textarea[name="q"]', 'aria-invalid'), null);

  // The same in the mask, and in the gradients' dO.
  await computeTyped(page, { q: '[[1, 0]]', k: '[[1, 0]]', v: '[[1]]', mask: '[[tru]]' });
  box = await errorBox(page, '#playground');
  assert.deepEqual([box.field, box.line, box.column], ['mask', '1', '3']);
  await computeTyped(page, { grad_output: '[[1, 0, 0, 0],\n [0, 0, 0 0],\n [0, 0, 0, 0]]' }, { form: '#gr-form', section: '#gradients' });
  box = await errorBox(page, '#gradients');
  assert.deepEqual([box.code, box.field, box.line, box.column], ['invalid_json', 'grad_output', '2', '11']);
  assert.deepEqual(await selected('grad_output', '#gr-form'), { focused: true, text: '0', invalid: 'true' });
  await computeTyped(page, { grad_output: '[[1, 0, 0, 0],\n [0, 0, 0, 0],\n [0, 0, 0, -1]]' }, { form: '#gr-form', section: '#gradients' });
  assert.equal((await errorBox(page, '#gradients')).hidden, true);
});

test('the playground\'s ragged batch draws block-diagonal weights, each block its sequence alone', async () => {
  const { page, problems, computes } = await desktopPage();
  await randomInputs(page, { nq: 6, nk: 6, heads: 2, seed: 3 });
  const before = problems.length;
  await computeTyped(page, {}, { ragged: '2, 3, 1' });
  await until(page, 'the ragged answer', () => /3 sequences/.test(document.querySelector('#playground .timing')?.textContent ?? ''));
  assert.deepEqual(problems.slice(before), []);
  // (The shared page sent bodies that are not JSON before: the error cases.)
  const lengths = (c) => { try { return JSON.parse(c.body).seq_lens; } catch { return undefined; } };
  const sent = computes.filter((c) => c.url.endsWith('/v1/attention') && lengths(c)).at(-1);
  assert.ok(sent, 'the playground sent seq_lens');
  const req = JSON.parse(sent.body);
  assert.deepEqual(req.seq_lens, [2, 3, 1]);
  const api = await again(sent.body, { output_encoding: 'flat' });
  const W = decode(api.weights);
  const [H, n] = [W.shape[0], W.shape.at(-1)];
  assert.deepEqual(W.shape, [2, 6, 6]);
  const blocks = [[0, 2], [2, 5], [5, 6]];
  const seqOf = (i) => blocks.findIndex(([a, b]) => i >= a && i < b);
  for (let h = 0; h < H; h++) {
    const got = await drawn(page, `weights-h${h}`);
    sameFloats(got, W.data.subarray(h * n * n, (h + 1) * n * n), `ragged weights head ${h}`);
    const [q, k, v] = [req.q[h], req.k[h], req.v[h]];
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
  await shot(page, 'page-ragged.png', '#playground');

  // Lengths that do not add up to the rows: the API's 422, the field marked.
  await computeTyped(page, {}, { ragged: '2, 3' });
  const box = await errorBox(page, '#playground');
  assert.deepEqual([box.code, box.field], ['shape_mismatch', 'seq_lens']);
  assert.match(await page.getAttribute('#pg-form [data-field="seq_lens"]', 'class'), /\binvalid\b/);

  // Unchecked, the same inputs are one sequence again.
  await computeTyped(page, {});
  assert.equal((await errorBox(page, '#playground')).hidden, true);
  assert.equal(lengths(computes.at(-1)), undefined);
});


test('"Random Q, K, V" computes the new inputs at once: the old heatmaps and error go', async () => {
  const { page } = await desktopPage();
  await computeTyped(page, { q: '[[1, 0]', k: '[[1, 0]]', v: '[[1]]', mask: '' });
  assert.equal((await errorBox(page, '#playground')).hidden, false);
  await randomInputs(page, { nq: 3, nk: 5, dk: 2, dv: 2, heads: 1, seed: 9 });
  assert.equal(await page.getAttribute('#playground', 'data-state'), 'ready');
  assert.equal((await errorBox(page, '#playground')).hidden, true);
  assert.equal(await page.$$eval('#pg-form [aria-invalid]', (els) => els.length), 0);
  assert.deepEqual(await page.$$eval('#pg-weights table.heatmap', (ts) => ts.map((t) => t.dataset.name)), ['weights-h0']);
  // What is drawn is the answer to what the boxes now hold.
  const text = await page.$$eval('#pg-form textarea', (ts) => Object.fromEntries(ts.map((t) => [t.name, t.value])));
  const q = JSON.parse(text.q), k = JSON.parse(text.k), v = JSON.parse(text.v);
  assert.deepEqual([q.length, k.length, v[0].length], [3, 5, 2]);
  const api = await again(JSON.stringify({ q, k, v, return_weights: true, output_encoding: 'flat' }));
  sameFloats(await drawn(page, 'weights-h0'), decode(api.weights).data, 'weights after Random');
  sameFloats(await drawn(page, 'output-h0'), decode(api.output).data, 'output after Random');
});

test('rows that see no key are marked, and the page says why (causal with n_q > n_k, a mask)', async () => {
  const { page } = await desktopPage();
  const note = (section) => page.$eval(`${section} .no-key`, (p) => ({ rows: p.dataset.rows, text: p.textContent })).catch(() => null);
  const marked = (name) => page.$$eval(`table[data-name="${name}"] tbody tr`, (trs) => trs.flatMap((tr, i) => (tr.hasAttribute('data-no-key') ? [i] : [])));

  // Causal, 5 queries, 2 keys: queries 0-2 come before every key.
  await randomInputs(page, { nq: 5, nk: 2, heads: 2, causal: true });
  let n = await note('#playground');
  assert.equal(n?.rows, '0,1,2');
  assert.match(n.text, /^Queries 0–2 see no key: with causal/);
  assert.match(n.text, /j ≤ i \+ n_k − n_q = i − 3/);
  assert.match(n.text, /weights and output are 0/);
  assert.deepEqual(await marked('weights-h1'), [0, 1, 2]);
  const w = await drawn(page, 'weights-h0');
  assert.deepEqual(w.slice(0, 6), [0, 0, 0, 0, 0, 0]);
  assert.ok(Math.abs(w[6] + w[7] - 1) < 1e-6, 'query 3 sees key 0 (and 1 is past it)');

  // A mask that hides every key from query 1.
  await computeTyped(page, { q: '[[1, 0], [0, 1]]', k: '[[1, 0], [0, 1]]', v: '[[1], [2]]', mask: '[[true, false], [false, false]]' });
  n = await note('#playground');
  assert.equal(n?.rows, '1');
  assert.match(n.text, /^Query 1 sees no key: the mask hides every key from it/);
  assert.deepEqual(await drawn(page, 'output-h0'), [1, 0]);

  // Every query sees a key: no note.
  await computeTyped(page, { q: '[[1, 0], [0, 1]]', k: '[[1, 0], [0, 1]]', v: '[[1], [2]]', mask: '' }, { causal: true });
  assert.equal(await note('#playground'), null);
  assert.deepEqual(await marked('weights-h0'), []);

  // Cross-attention with causal: "the cat sat on the mat" over "a dog ran".
  await page.fill('#mh-form input[name="sentence"]', 'the cat sat on the mat');
  await page.fill('#mh-form input[name="context"]', 'a dog ran');
  await page.setChecked('#mh-form input[name="causal"]', true);
  await page.evaluate(() => { document.querySelector('#multihead').dataset.state = 'sent'; });
  await page.click('#mh-form button[type="submit"]');
  await until(page, 'the multi-head answer', () => document.querySelector('#multihead').dataset.state === 'ready');
  n = await note('#multihead');
  assert.equal(n?.rows, '0,1,2');
  assert.match(n.text, /^Queries 0 \(“the”\)–2 \(“sat”\) see no key: with causal/);
  assert.deepEqual(await marked('mh-mean'), [0, 1, 2]);
  assert.deepEqual((await drawn(page, 'mh-mean')).slice(0, 9), [0, 0, 0, 0, 0, 0, 0, 0, 0]);
  await shot(page, 'page-no-key.png', '#multihead');
  await page.setChecked('#mh-form input[name="causal"]', false);
  await page.evaluate(() => { document.querySelector('#multihead').dataset.state = 'sent'; });
  await page.click('#mh-form button[type="submit"]');
  await until(page, 'the multi-head answer', () => document.querySelector('#multihead').dataset.state === 'ready');
  assert.equal(await note('#multihead'), null);
});

test('?api= takes only an http: or https: URL: javascript: and data: never reach a link', async () => {
  for (const bad of ['javascript:alert(document.domain)//', 'data:text/html,<script>alert(1)</script>']) {
    const { page, problems } = await open(`${server.url}/?api=${encodeURIComponent(bad)}`);
    await readyOrError(page);
    assert.equal(await page.evaluate(() => document.body.dataset.state), 'ready', `${bad}: the page runs on its own server`);
    for (const id of ['openapi-link', 'metrics-link'])
      assert.equal(await page.$eval(`#${id}`, (a) => a.href), `${server.url}/${id === 'openapi-link' ? 'openapi.yaml' : 'metrics'}`, `${bad}: ${id}`);
    assert.ok((await page.textContent('#page-status')).startsWith(`Ignored ?api=${bad}: only an http: or https: URL`), bad);
    assert.equal(await page.getAttribute('#api-base', 'aria-invalid'), 'true');
    // Typed into the form, it is refused there too (the page stays).
    await page.fill('#api-base', bad);
    await page.click('#server-form button[type="submit"]');
    await page.waitForFunction(() => /is not an http: or https: URL/.test(document.querySelector('#server-info').textContent), null, { timeout: 5000 })
      .catch(async () => assert.fail(`${bad} typed into the form: at ${page.url()}, "${await page.textContent('#server-info')}"`));
    assert.equal(new URL(page.url()).searchParams.get('api'), bad);
    assert.deepEqual(problems, [], bad);
    await page.close();
  }
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
    assert.equal(await page.getAttribute('#openapi-link', 'href'), `${other.url}/openapi.yaml`);
    await page.close();
  }
  // The same files from http://localhost:PORT, an origin attnd does not allow.
  {
    const { page } = await open(`http://localhost:${port}/index.html?api=${encodeURIComponent(other.url)}`);
    await readyOrError(page);
    assert.equal(await page.evaluate(() => document.body.dataset.state), 'error');
    assert.equal(await page.isVisible('#page-status'), true);
    assert.match(await page.textContent('#page-status'), /failed/);
    const text = await page.textContent('#playground > .error');
    assert.match(text, /^network no answer from http:\/\/127\.0\.0\.1:\d+\/v1\/attention: /);
    assert.doesNotMatch(text, /null/);
    await page.close();
  }
  // What the browser was refused, from attnd's side: no Access-Control-Allow-Origin.
  const res = await fetch(`${other.url}/v1/info`, { headers: { Origin: `http://localhost:${port}` } });
  assert.equal(res.headers.get('access-control-allow-origin'), null);
});

test('the page at 1400 px closes cleanly', async () => {
  if (desktop) {
    // Chromium logs each 4xx answer; the tests above asked for those.
    const refused = /^Failed to load resource: the server responded with a status of 4\d\d /;
    assert.deepEqual(desktop.problems.filter((p) => !refused.test(p)), [], 'no other console error in all the tests above');
    await desktop.page.close();
  }
});
