// The page at GET /: each section builds a request, sends it with the client
// of attnd.js and draws what came back. Nothing drawn is computed here: the
// numbers are the API's, and every drawn number carries its exact value in
// a data-value attribute (the browser test compares those with the API).
import { Client, Tensor, AttndError } from './attnd.js';

// ------------------------------------------------------------- the server

// ?api=URL points the page at another attnd (the page then runs from any
// origin that server's --cors-origin allows); otherwise it talks to its own.
const params = new URLSearchParams(location.search);
const apiBase = params.get('api') ?? '';
const api = new Client(apiBase);

// ------------------------------------------------------------- randomness

// Seeded, so that a figure can be reproduced with curl (mulberry32).
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Standard normal draws (Box-Muller): mean 0, variance 1, as Theorem 1 assumes.
function normals(random, count) {
  const out = new Float32Array(count);
  for (let i = 0; i < count; i += 2) {
    const u = 1 - random(), w = random();
    const r = Math.sqrt(-2 * Math.log(u));
    out[i] = r * Math.cos(2 * Math.PI * w);
    if (i + 1 < count) out[i + 1] = r * Math.sin(2 * Math.PI * w);
  }
  return out;
}

function hashWord(word) {
  let h = 2166136261;
  for (const ch of word) h = Math.imul(h ^ ch.codePointAt(0), 16777619);
  return h >>> 0;
}

// ------------------------------------------------------------- formatting

const fmt = (x, digits = 4) => {
  if (x === 0) return '0';
  const a = Math.abs(x);
  if (a >= 1e4 || a < 1e-3) return x.toExponential(2);
  return Number(x.toFixed(digits)).toString();
};

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'text') e.textContent = v;
    else if (k === 'class') e.className = v;
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

const SVG = 'http://www.w3.org/2000/svg';
function svg(tag, attrs = {}) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

/** An <output> that shows a rounded number and keeps the exact one. */
function setNumber(id, value, digits = 4) {
  const o = document.getElementById(id);
  o.dataset.value = String(value);
  o.textContent = fmt(value, digits);
}

// ------------------------------------------------------------- colours

// Sequential (weights, 0..1): a viridis-like ramp; diverging (outputs,
// gradients): blue - white - red around 0.
const SEQ = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const DIV = [[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130], [178, 24, 43]];

function ramp(stops, t) {
  t = Math.min(1, Math.max(0, t));
  const x = t * (stops.length - 1), i = Math.min(stops.length - 2, Math.floor(x)), f = x - i;
  return stops[i].map((c, j) => Math.round(c + (stops[i + 1][j] - c) * f));
}

const css = (rgb) => `rgb(${rgb[0]}, ${rgb[1]}, ${rgb[2]})`;
const inkFor = (rgb) => (0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 140 ? '#111' : '#fff');

/** The colour map of a heatmap: value -> rgb, and its legend's ends. */
function colourScale(values, kind) {
  if (kind === 'weights') return { lo: 0, hi: 1, at: (v) => ramp(SEQ, v), stops: SEQ };
  let m = 0;
  for (const v of values) m = Math.max(m, Math.abs(v));
  if (m === 0) m = 1;
  return { lo: -m, hi: m, at: (v) => ramp(DIV, (v + m) / (2 * m)), stops: DIV };
}

/**
 * A heatmap of a [rows, cols] tensor as a table: labelled rows and columns,
 * the rounded value in each cell (the exact one in data-value), a colour
 * scale under it. A table rather than a canvas so that it reads aloud and
 * can be navigated cell by cell.
 */
function heatmap(t, { name, title, rowLabels, colLabels, kind = 'weights', rowTitle = '', colTitle = '' }) {
  const [rows, cols] = t.shape.slice(-2);
  const scale = colourScale(t.data, kind);
  const small = cols > 12;
  const table = el('table', { class: 'heatmap' + (small ? ' dense' : ''), 'data-name': name, 'data-rows': rows, 'data-cols': cols });
  table.append(el('caption', { text: title }));
  const head = el('tr', {}, el('th', { scope: 'col', class: 'corner', text: rowTitle && colTitle ? `${rowTitle} \\ ${colTitle}` : '' }));
  for (let j = 0; j < cols; j++) head.append(el('th', { scope: 'col', text: colLabels?.[j] ?? String(j) }));
  table.append(el('thead', {}, head));
  const body = el('tbody');
  for (let i = 0; i < rows; i++) {
    const tr = el('tr', {}, el('th', { scope: 'row', text: rowLabels?.[i] ?? String(i) }));
    for (let j = 0; j < cols; j++) {
      const v = t.data[i * cols + j];
      const rgb = scale.at(v);
      const td = el('td', { 'data-value': String(v), title: `${rowLabels?.[i] ?? i} → ${colLabels?.[j] ?? j}: ${v}` },
        small ? '' : fmt(v, kind === 'weights' ? 2 : 2));
      td.style.backgroundColor = css(rgb);
      td.style.color = inkFor(rgb);
      tr.append(td);
    }
    body.append(tr);
  }
  table.append(body);
  const bar = el('span', { class: 'bar', 'aria-hidden': 'true' });
  bar.style.backgroundImage = `linear-gradient(to right, ${scale.stops.map(css).join(', ')})`;
  const legend = el('div', { class: 'legend' }, el('span', { text: fmt(scale.lo, 3) }), bar, el('span', { text: fmt(scale.hi, 3) }));
  return el('figure', { class: 'map' }, table, legend);
}

/**
 * A line chart against d_k on a log2 axis. series: [{name, key, values:
 * [{x, y}]}]. Each point is a circle carrying data-x and data-y.
 */
function lineChart({ series, logY = false, yLabel, id }) {
  const W = 560, H = 300, L = 58, R = 150, T = 14, B = 44;
  const xs = series[0].values.map((p) => p.x);
  const all = series.flatMap((s) => s.values.map((p) => p.y)).filter((y) => y != null);
  const fx = (x) => L + ((Math.log2(x) - Math.log2(xs[0])) / (Math.log2(xs.at(-1)) - Math.log2(xs[0]) || 1)) * (W - L - R);
  let y0 = logY ? Math.floor(Math.log10(Math.min(...all.filter((y) => y > 0)))) : 0;
  let y1 = logY ? Math.ceil(Math.log10(Math.max(...all))) : Math.max(...all) * 1.05;
  if (y1 === y0) y1 = y0 + 1;
  const fy = (y) => {
    const v = logY ? Math.log10(y) : y;
    return T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  };
  const root = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-labelledby': `${id}-title`, class: 'chart', 'data-name': id });
  const title = svg('title', { id: `${id}-title` });
  title.textContent = `${series.map((s) => s.name).join(' and ')} against d_k`;
  root.append(title);
  const axis = svg('g', { class: 'axis' });
  for (const x of xs) {
    axis.append(svg('line', { x1: fx(x), x2: fx(x), y1: T, y2: H - B, class: 'grid' }));
    const t = svg('text', { x: fx(x), y: H - B + 16, 'text-anchor': 'middle' });
    t.textContent = String(x);
    axis.append(t);
  }
  const yTicks = [];
  if (logY) for (let e = y0; e <= y1; e++) yTicks.push(10 ** e);
  else for (let k = 0; k <= 4; k++) yTicks.push((y1 * k) / 4);
  for (const y of yTicks) {
    axis.append(svg('line', { x1: L, x2: W - R, y1: fy(y), y2: fy(y), class: 'grid' }));
    const t = svg('text', { x: L - 6, y: fy(y) + 4, 'text-anchor': 'end' });
    t.textContent = logY ? (y >= 1 ? String(y) : y.toExponential(0)) : fmt(y, 2);
    axis.append(t);
  }
  const xl = svg('text', { x: (L + W - R) / 2, y: H - 6, 'text-anchor': 'middle', class: 'label' });
  xl.textContent = 'd_k';
  const yl = svg('text', { x: 14, y: (T + H - B) / 2, 'text-anchor': 'middle', class: 'label', transform: `rotate(-90 14 ${(T + H - B) / 2})` });
  yl.textContent = yLabel;
  axis.append(xl, yl);
  root.append(axis);
  series.forEach((s, n) => {
    const g = svg('g', { class: `series s${n}`, 'data-series': s.key });
    const pts = s.values.filter((p) => p.y != null);
    g.append(svg('polyline', { points: pts.map((p) => `${fx(p.x)},${fy(p.y)}`).join(' '), fill: 'none' }));
    for (const p of pts) {
      const c = svg('circle', { cx: fx(p.x), cy: fy(p.y), r: 3.5, 'data-x': p.x, 'data-y': p.y });
      const tip = svg('title');
      tip.textContent = `${s.name}, d_k = ${p.x}: ${p.y}`;
      c.append(tip);
      g.append(c);
    }
    const ly = T + 14 + n * 20;
    g.append(svg('line', { x1: W - R + 12, x2: W - R + 32, y1: ly, y2: ly }));
    const lt = svg('text', { x: W - R + 38, y: ly + 4, class: 'key' });
    lt.textContent = s.name;
    g.append(lt);
    root.append(g);
  });
  return root;
}

/** The numbers of a chart as a table. */
function dataTable(columns, rows, name) {
  const table = el('table', { class: 'numbers', 'data-name': name });
  table.append(el('thead', {}, el('tr', {}, ...columns.map((c) => el('th', { scope: 'col', text: c })))));
  const body = el('tbody');
  for (const r of rows)
    body.append(el('tr', {}, ...r.map((v, i) => (i === 0 ? el('th', { scope: 'row', text: String(v) }) : el('td', { 'data-value': v == null ? '' : String(v), text: v == null ? '—' : fmt(v, 4) })))));
  table.append(body);
  return table;
}

function metaLine(answer, extra = '') {
  const t = answer.meta.timing_ms;
  const parts = [
    `decode ${t.decode.toFixed(3)} ms`, `compute ${t.compute.toFixed(3)} ms`,
    `encode ${t.encode.toFixed(3)} ms`, `total ${t.total.toFixed(3)} ms`,
  ];
  const line = el('p', { class: 'timing' });
  line.append(el('strong', { text: 'Server time: ' }), parts.join(' · '),
    el('span', { class: 'muted', text: ` — ${answer.meta.flops.toLocaleString('en')} FLOPs, ${answer.meta.algorithm}${extra}` }));
  line.dataset.decode = t.decode;
  line.dataset.compute = t.compute;
  line.dataset.encode = t.encode;
  line.dataset.total = t.total;
  return line;
}

// ------------------------------------------------------------- section states

function setState(section, state) {
  section.dataset.state = state;
}

/** Shows an API error in a section, and marks the input it names. */
function showError(section, err) {
  const box = section.querySelector(':scope > .error');
  for (const f of section.querySelectorAll('[data-field].invalid')) {
    f.classList.remove('invalid');
    f.querySelector('input, textarea')?.removeAttribute('aria-invalid');
  }
  if (!err) {
    box.hidden = true;
    box.replaceChildren();
    return;
  }
  const e = err instanceof AttndError ? err : new AttndError(0, 'page', String(err?.message ?? err), null);
  box.dataset.status = e.status;
  box.dataset.code = e.code;
  box.dataset.field = e.field ?? '';
  box.replaceChildren(
    el('strong', { text: e.status ? `${e.status} ${e.code}` : e.code }), ' ',
    el('span', { class: 'message', text: e.message }),
    e.field ? el('span', { class: 'muted', text: ` (field: ${e.field})` }) : null);
  box.hidden = false;
  // "q.data" or "q[0][1]" names the input "q".
  const root = e.field ? e.field.split(/[.[]/)[0] : null;
  const input = root && section.querySelector(`[data-field="${CSS.escape(root)}"]`);
  if (input) {
    input.classList.add('invalid');
    const control = input.querySelector('input, textarea');
    control?.setAttribute('aria-invalid', 'true');
    control?.setAttribute('aria-describedby', box.id || (box.id = `${section.id}-error`));
  }
}

/** Runs one section's work, keeping its data-state and error box right. */
async function run(section, work) {
  setState(section, 'loading');
  try {
    await work();
    showError(section, null);
    setState(section, 'ready');
    return true;
  } catch (err) {
    showError(section, err);
    setState(section, 'error');
    return false;
  }
}

// ------------------------------------------------------------- playground

const pg = document.getElementById('playground');
const pgForm = document.getElementById('pg-form');

function randomTensorText(random, heads, n, d) {
  const rows = (h) => {
    const out = [];
    for (let i = 0; i < n; i++) {
      const r = [];
      for (let j = 0; j < d; j++) r.push(Math.round((random() * 4 - 2) * 100) / 100);
      out.push('[' + r.join(', ') + ']');
    }
    return (h ? ' ' : '') + '[' + out.join(',\n  ') + ']';
  };
  if (heads === 1) return rows(0);
  const hs = [];
  for (let h = 0; h < heads; h++) hs.push(rows(h).replace(/\n/g, '\n '));
  return '[' + hs.join(',\n').trimStart() + ']';
}

function fillRandom() {
  const f = pgForm.elements;
  const num = (name) => Math.max(1, parseInt(f[name].value, 10) || 1);
  const random = rng(num('seed'));
  const heads = num('heads');
  f.q.value = randomTensorText(random, heads, num('n_q'), num('d_k'));
  f.k.value = randomTensorText(random, heads, num('n_k'), num('d_k'));
  f.v.value = randomTensorText(random, heads, num('n_k'), num('d_v'));
}

// The body is put together from the text typed, unparsed, so that every
// mistake in it is found and worded by the API, not by the page.
function playgroundBody() {
  const f = pgForm.elements;
  const parts = [`"q": ${f.q.value || 'null'}`, `"k": ${f.k.value || 'null'}`, `"v": ${f.v.value || 'null'}`];
  if (f.mask.value.trim()) parts.push(`"mask": ${f.mask.value}`);
  if (f.causal.checked) parts.push('"causal": true');
  if (f.scale.value.trim()) parts.push(`"scale": ${Number(f.scale.value)}`);
  if (f.ragged.checked) parts.push(`"seq_lens": [${f.seq_lens.value}]`);
  parts.push('"return_weights": true', '"output_encoding": "base64"');
  return `{${parts.join(', ')}}`;
}

async function runPlayground() {
  const answer = await api.computeText('/v1/attention', playgroundBody());
  const w = answer.weights;
  const heads = w.shape.length > 2 ? w.shape.slice(0, -2).reduce((a, b) => a * b, 1) : 1;
  const [nq, nk] = w.shape.slice(-2);
  const maps = [];
  const flatW = new Tensor([heads, nq, nk], w.data);
  for (let h = 0; h < heads; h++)
    maps.push(heatmap(flatW.slice(h), { name: `weights-h${h}`, title: heads > 1 ? `weights, head ${h}` : 'weights A', rowTitle: 'query', colTitle: 'key' }));
  const seqs = answer.meta.shape.sequences;
  if (seqs) for (const map of maps) markBlocks(map, pgForm.elements.seq_lens.value);
  document.getElementById('pg-weights').replaceChildren(...maps);
  const o = answer.output;
  const [, dv] = o.shape.slice(-2);
  const flatO = new Tensor([heads, nq, dv], o.data);
  const outs = [];
  for (let h = 0; h < heads; h++)
    outs.push(heatmap(flatO.slice(h), { name: `output-h${h}`, title: heads > 1 ? `output, head ${h}` : 'output A V', kind: 'signed', rowTitle: 'query', colTitle: 'dim' }));
  document.getElementById('pg-output').replaceChildren(...outs);
  pg.querySelector('.meta').replaceChildren(metaLine(answer, `, ${heads} head${heads > 1 ? 's' : ''}, n_q=${nq}, n_k=${nk}${seqs ? `, ${seqs} sequences` : ''}`));
}

/**
 * A ragged batch's weights heatmap: each row and cell marked with its
 * sequence (data-seq), and the cells outside the sequences' blocks, which
 * the server never computed, set apart. `lengths` is the text the server
 * accepted, so it parses.
 */
function markBlocks(map, lengths) {
  const seqOf = [];
  JSON.parse(`[${lengths}]`).forEach((n, s) => { for (let i = 0; i < n; i++) seqOf.push(s); });
  map.querySelectorAll('tbody tr').forEach((tr, i) => {
    tr.dataset.seq = seqOf[i];
    tr.querySelectorAll('td').forEach((td, j) => {
      if (seqOf[j] === seqOf[i]) td.dataset.seq = seqOf[i];
      else td.classList.add('outside');
    });
  });
}

// ------------------------------------------------------------- multi-head

const mh = document.getElementById('multihead');
const mhForm = document.getElementById('mh-form');

const words = (s) => s.trim().split(/\s+/).filter(Boolean);

function embed(tokens, dModel, seed) {
  const data = new Float32Array(tokens.length * dModel);
  tokens.forEach((t, i) => data.set(normals(rng(hashWord(t.toLowerCase()) ^ seed), dModel), i * dModel));
  return new Tensor([tokens.length, dModel], data);
}

function projection(random, rows, cols) {
  // Entries of variance 1/d_model keep the projected vectors' entries near
  // variance 1 (as Theorem 1 assumes of q and k).
  const w = normals(random, rows * cols);
  const s = 1 / Math.sqrt(rows);
  for (let i = 0; i < w.length; i++) w[i] *= s;
  return new Tensor([rows, cols], w);
}

async function runMultihead() {
  const f = mhForm.elements;
  const tokens = words(f.sentence.value);
  const ctxTokens = words(f.context.value);
  const heads = parseInt(f.heads.value, 10);
  const dModel = parseInt(f.d_model.value, 10);
  const seed = parseInt(f.seed.value, 10) >>> 0;
  const random = rng(seed);
  const keys = ctxTokens.length ? ctxTokens : tokens;
  const req = {
    x: embed(tokens, dModel, seed),
    w_q: projection(random, dModel, dModel),
    w_k: projection(random, dModel, dModel),
    w_v: projection(random, dModel, dModel),
    num_heads: heads,
    causal: f.causal.checked,
  };
  if (ctxTokens.length) req.context = embed(ctxTokens, dModel, seed);
  const [perHead, mean] = await Promise.all([
    api.multihead({ ...req, return_weights: true }),
    api.multihead({ ...req, return_weights: 'mean' }),
  ]);
  const maps = [];
  for (let h = 0; h < heads; h++)
    maps.push(heatmap(perHead.weights.slice(h), { name: `mh-h${h}`, title: `head ${h}`, rowLabels: tokens, colLabels: keys }));
  maps.push(heatmap(mean.weights, { name: 'mh-mean', title: 'mean over heads', rowLabels: tokens, colLabels: keys }));
  document.getElementById('mh-heads').replaceChildren(...maps);
  const m = perHead.meta.shape;
  mh.querySelector('.meta').replaceChildren(metaLine(perHead, `, ${m.heads} heads of d_k=${m.d_k}${ctxTokens.length ? ', cross-attention' : ''}`));
}

// ------------------------------------------------------------- the chapter

const chapter = document.getElementById('chapter');

async function workedExample1() {
  const a = await api.attention({
    q: Tensor.from([[1, 0], [0, 1]]), k: Tensor.from([[1, 0], [0, 1]]), v: Tensor.from([[1, 2], [3, 4]]),
    return_weights: true,
  });
  setNumber('ex1-w00', a.weights.at(0, 0));
  setNumber('ex1-w01', a.weights.at(0, 1));
  setNumber('ex1-o0', a.output.at(0, 0));
  const tok = ['token 1', 'token 2'];
  document.querySelector('#ex1 .maps').replaceChildren(
    heatmap(a.weights, { name: 'ex1-weights', title: 'weights', rowLabels: tok, colLabels: tok }),
    heatmap(a.output, { name: 'ex1-output', title: 'output', kind: 'signed', rowLabels: tok }));
}

const EX2_X = [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]];

async function workedExample2() {
  const x = Tensor.from(EX2_X);
  const [full, causal] = await Promise.all([
    api.attention({ q: x, k: x, v: x, return_weights: true }),
    api.attention({ q: x, k: x, v: x, causal: true, return_weights: true }),
  ]);
  let upper = 0;
  for (let i = 0; i < 3; i++) for (let j = i + 1; j < 3; j++) upper = Math.max(upper, Math.abs(causal.weights.at(i, j)));
  setNumber('ex2-upper', upper);
  setNumber('ex2-w00', causal.weights.at(0, 0));
  const tok = ['x₁', 'x₂', 'x₃'];
  document.querySelector('#ex2 .maps').replaceChildren(
    heatmap(full.weights, { name: 'ex2-full', title: 'weights, no mask', rowLabels: tok, colLabels: tok }),
    heatmap(causal.weights, { name: 'ex2-causal', title: 'weights, causal', rowLabels: tok, colLabels: tok }),
    heatmap(causal.output, { name: 'ex2-causal-output', title: 'output, causal', kind: 'signed', rowLabels: tok }));
}

async function exercise6() {
  const dk = 64;
  const q = new Float32Array(dk), k = new Float32Array(2 * dk);
  q[0] = 1;
  k[0] = 10; // q·k1 = 10, q·k2 = 0
  const req = { q: new Tensor([1, dk], q), k: new Tensor([2, dk], k), v: Tensor.from([[1], [0]]), return_weights: true };
  const [raw, scaled] = await Promise.all([api.attention({ ...req, scale: 1 }), api.attention(req)]);
  setNumber('ex6-raw0', raw.weights.at(0, 0), 7);
  setNumber('ex6-raw1', raw.weights.at(0, 1), 7);
  setNumber('ex6-sc0', scaled.weights.at(0, 0));
  setNumber('ex6-sc1', scaled.weights.at(0, 1));
  const keys = ['k₁ (q·k = 10)', 'k₂ (q·k = 0)'];
  document.querySelector('#ex6 .maps').replaceChildren(
    heatmap(raw.weights, { name: 'ex6-raw', title: 'scale 1', rowLabels: ['q'], colLabels: keys }),
    heatmap(scaled.weights, { name: 'ex6-scaled', title: 'scale 1/√64', rowLabels: ['q'], colLabels: keys }));
}

export const THEOREM_DK = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];
export const THEOREM_N = 128;

// Queries and keys for one d_k: standard normal entries, seeded per d_k.
function theoremInputs(dk, seed) {
  const random = rng(seed * 7919 + dk);
  return {
    q: new Tensor([THEOREM_N, dk], normals(random, THEOREM_N * dk)),
    k: new Tensor([THEOREM_N, dk], normals(random, THEOREM_N * dk)),
    v: new Tensor([THEOREM_N, 1], new Float32Array(THEOREM_N)),
    return_stats: true,
  };
}

async function theorems() {
  const seed = 1;
  const answers = await Promise.all(THEOREM_DK.map(async (dk) => {
    const req = theoremInputs(dk, seed);
    const [scaled, raw] = await Promise.all([api.attention(req), api.attention({ ...req, scale: 1 })]);
    return { dk, scaled: scaled.stats, raw: raw.stats };
  }));
  const point = (f) => answers.map((a) => ({ x: a.dk, y: f(a) }));

  const th = document.getElementById('theorem1');
  await run(th, async () => {
    document.getElementById('th1-plot').replaceChildren(lineChart({
      id: 'th1-chart', logY: true, yLabel: 'variance',
      series: [
        { name: 'Var(S) raw', key: 'raw', values: point((a) => a.scaled.scores.var) },
        { name: 'Var(S̃) scaled', key: 'scaled', values: point((a) => a.scaled.scaled_scores.var) },
      ],
    }));
    document.getElementById('th1-table').replaceChildren(dataTable(
      ['d_k', 'mean S', 'Var S', 'mean S̃', 'Var S̃'],
      answers.map((a) => [a.dk, a.scaled.scores.mean, a.scaled.scores.var, a.scaled.scaled_scores.mean, a.scaled.scaled_scores.var]),
      'th1-numbers'));
  });
  const co = document.getElementById('corollary1');
  await run(co, async () => {
    document.getElementById('co1-plot').replaceChildren(lineChart({
      id: 'co1-chart', yLabel: 'max weight · entropy',
      series: [
        { name: 'max weight, scale 1', key: 'max-raw', values: point((a) => a.raw.max_weight.mean) },
        { name: 'entropy, scale 1', key: 'entropy-raw', values: point((a) => a.raw.entropy.mean) },
        { name: 'max weight, 1/√d_k', key: 'max-scaled', values: point((a) => a.scaled.max_weight.mean) },
        { name: 'entropy, 1/√d_k', key: 'entropy-scaled', values: point((a) => a.scaled.entropy.mean) },
      ],
    }));
    document.getElementById('co1-table').replaceChildren(dataTable(
      ['d_k', 'max weight (scale 1)', 'entropy (scale 1)', 'max weight (1/√d_k)', 'entropy (1/√d_k)'],
      answers.map((a) => [a.dk, a.raw.max_weight.mean, a.raw.entropy.mean, a.scaled.max_weight.mean, a.scaled.entropy.mean]),
      'co1-numbers'));
  });
}

async function runChapter() {
  const parts = [['ex1', workedExample1], ['ex2', workedExample2], ['ex6', exercise6]];
  const results = await Promise.all(parts.map(([id, f]) => run(document.getElementById(id), f)));
  let failed = results.includes(false);
  try {
    await theorems();
  } catch (err) {
    for (const id of ['theorem1', 'corollary1']) setState(document.getElementById(id), 'error');
    throw err;
  }
  failed ||= [...chapter.querySelectorAll('article')].some((a) => a.dataset.state !== 'ready');
  if (failed) {
    const firstError = chapter.querySelector('article[data-state="error"]');
    throw new AttndError(0, 'chapter', `a part of the chapter failed: ${firstError?.id ?? 'theorems'}`, null);
  }
}

// ------------------------------------------------------------- gradients

const gr = document.getElementById('gradients');
const grForm = document.getElementById('gr-form');

async function runGradients() {
  const f = grForm.elements;
  const x = JSON.stringify(EX2_X);
  const body = `{"q": ${x}, "k": ${x}, "v": ${x}, "grad_output": ${f.grad_output.value || 'null'}, ` +
    `"causal": ${f.causal.checked}, "return_weights": true, "output_encoding": "base64"}`;
  const a = await api.computeText('/v1/attention', body);
  const tok = ['x₁', 'x₂', 'x₃'];
  document.getElementById('gr-maps').replaceChildren(
    heatmap(a.weights, { name: 'gr-weights', title: 'weights A', rowLabels: tok, colLabels: tok }),
    heatmap(a.grad.q, { name: 'gr-dq', title: 'dQ (Eq. 17)', kind: 'signed', rowLabels: tok }),
    heatmap(a.grad.k, { name: 'gr-dk', title: 'dK (Eq. 18)', kind: 'signed', rowLabels: tok }),
    heatmap(a.grad.v, { name: 'gr-dv', title: 'dV = Aᵀ dO (Eq. 16)', kind: 'signed', rowLabels: tok }));
  gr.querySelector('.meta').replaceChildren(metaLine(a));
}

// ------------------------------------------------------------- wiring

function wire(form, section, work) {
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const ok = await run(section, work);
    document.body.dataset.state = ok ? 'ready' : 'error';
    pageStatus(ok ? 'Done.' : 'The last request failed: see the message in its section.');
  });
}

function pageStatus(text) {
  document.getElementById('page-status').textContent = text;
}

async function describeServer() {
  const info = document.getElementById('server-info');
  try {
    const i = await api.info();
    const parts = [`attnd ${i.version}`];
    if (i.kernel) parts.push(`kernel ${typeof i.kernel === 'string' ? i.kernel : i.kernel.name ?? ''}`);
    if (i.blas?.corename) parts.push(`OpenBLAS ${i.blas.corename}`);
    if (i.threads) parts.push(`${i.threads} threads`);
    info.textContent = parts.join(' · ');
  } catch (e) {
    info.textContent = '';
  }
}

async function main() {
  const base = document.getElementById('api-base');
  base.value = apiBase;
  if (apiBase) {
    document.getElementById('openapi-link').href = `${api.base}/openapi.yaml`;
    document.getElementById('metrics-link').href = `${api.base}/metrics`;
  }
  document.getElementById('server-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const u = new URL(location.href);
    if (base.value.trim()) u.searchParams.set('api', base.value.trim());
    else u.searchParams.delete('api');
    location.href = u.href;
  });
  document.getElementById('pg-random').addEventListener('click', fillRandom);
  wire(pgForm, pg, runPlayground);
  wire(mhForm, mh, runMultihead);
  wire(grForm, gr, runGradients);

  fillRandom();
  describeServer();
  const results = await Promise.all([
    run(pg, runPlayground), run(mh, runMultihead), run(chapter, runChapter), run(gr, runGradients),
  ]);
  const ok = results.every(Boolean);
  document.body.dataset.state = ok ? 'ready' : 'error';
  pageStatus(ok ? `Ready: every figure below came from ${apiBase || 'this server'}.`
    : `Some requests to ${apiBase || 'this server'} failed: the sections say why.`);
  document.getElementById('page-status').classList.toggle('bad', !ok);
}

main();
