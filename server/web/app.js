// The page at GET /: each section builds a request, sends it with the client
// of attnd.js and draws what came back. Nothing drawn is computed here: the
// numbers are the API's, and every drawn number carries its exact value in
// a data-value attribute (the browser test compares those with the API).
//
// The file reads top to bottom: the server the page talks to, small helpers,
// drawing (heatmaps, charts, tables; each drawn for the width it has), errors
// and section states, then one block per section of index.html, each ending
// in one object of SECTIONS. A new section is a <section> in index.html and
// one such block.
import { Client, Tensor, AttndError } from './attnd.js';

// ------------------------------------------------------------- the server

// ?api=URL points the page at another attnd (the page then runs from any
// origin that server's --cors-origin allows); otherwise it talks to its own.
// Only an absolute http: or https: URL is taken: the value ends up in the
// href of links, where a javascript: URL would run in this page's origin
// when clicked (the Content-Security-Policy forbids that too, but the page
// does not lean on it).
function apiFromQuery(search) {
  const value = new URLSearchParams(search).get('api')?.trim() ?? '';
  if (!value) return { base: '' };
  const url = httpUrl(value);
  return url ? { base: url.replace(/\/+$/, '') } : { base: '', refused: value };
}

/** The URL as text when it is an absolute http: or https: URL, else null. */
function httpUrl(text) {
  try {
    const url = new URL(text);
    return url.protocol === 'http:' || url.protocol === 'https:' ? url.href : null;
  } catch {
    return null;
  }
}

const server = apiFromQuery(location.search);
const api = new Client(server.base);

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

/** "0–2, 5, 7–8" for the sorted indices [0, 1, 2, 5, 7, 8]. */
function runsText(indices, label = String) {
  const runs = [];
  for (let i = 0; i < indices.length; i++) {
    let j = i;
    while (j + 1 < indices.length && indices[j + 1] === indices[j] + 1) j++;
    runs.push(j > i ? `${label(indices[i])}–${label(indices[j])}` : label(indices[i]));
    i = j;
  }
  return runs.join(', ');
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'text') e.textContent = v;
    else if (k === 'class') e.className = v;
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  // A child left out is null or undefined: append() would print it.
  for (const c of children) if (c != null) e.append(c);
  return e;
}

const SVG = 'http://www.w3.org/2000/svg';
function svg(tag, attrs = {}, text = null) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) if (v != null) e.setAttribute(k, String(v));
  if (text != null) e.textContent = text;
  return e;
}

/** An <output> that shows a rounded number and keeps the exact one. */
function setNumber(id, value, digits = 4) {
  const o = document.getElementById(id);
  o.dataset.value = String(value);
  o.textContent = fmt(value, digits);
}

// ------------------------------------------------------------- drawn to width

// Charts and heatmaps are drawn for the width their container has (an SVG
// unit is a CSS pixel, so a label is as large on a phone as on a desktop),
// and drawn again when that width changes (a phone turned, a window resized).
const drawers = new WeakMap();
const resized = new ResizeObserver((entries) => {
  for (const entry of entries) {
    const d = drawers.get(entry.target);
    const width = Math.floor(entry.contentRect.width);
    if (d && width !== d.width) {
      d.width = width;
      d.draw(width);
    }
  }
});

function drawToWidth(container, draw) {
  const width = Math.floor(container.getBoundingClientRect().width);
  drawers.set(container, { width, draw });
  draw(width);
  resized.observe(container);
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

// ------------------------------------------------------------- heatmaps

// Up to this many columns a heatmap prints its numbers in the cells (when
// they fit); beyond, and wherever they do not fit, it shows colour only.
const NUMBERED_COLS = 12;

/**
 * A heatmap of a [rows, cols] tensor as a table: labelled rows and columns,
 * the rounded value in each cell (the exact one in data-value), a colour
 * scale under it. A table rather than a canvas so that it reads aloud and
 * can be navigated cell by cell. noKey: the rows that see no key (marked).
 */
function heatmap(t, { name, title, rowLabels, colLabels, kind = 'weights', rowTitle = '', colTitle = '', noKey = [] }) {
  const [rows, cols] = t.shape.slice(-2);
  const scale = colourScale(t.data, kind);
  const numbered = cols <= NUMBERED_COLS;
  const rowName = (i) => rowLabels?.[i] ?? String(i);
  const colName = (j) => colLabels?.[j] ?? String(j);
  const table = el('table', { class: 'heatmap' + (numbered ? '' : ' many'), 'data-name': name, 'data-rows': rows, 'data-cols': cols });
  table.append(el('caption', { text: title }));
  const corner = rowTitle && colTitle ? `${rowTitle} \\ ${colTitle}` : '';
  const head = el('tr', {}, el('th', { scope: 'col', class: 'corner' }, el('span', { text: corner })));
  for (let j = 0; j < cols; j++) head.append(el('th', { scope: 'col', 'aria-label': colName(j) }, el('span', { text: colName(j) })));
  table.append(el('thead', {}, head));
  const body = el('tbody');
  for (let i = 0; i < rows; i++) {
    const blind = noKey.includes(i);
    const tr = el('tr', { 'data-no-key': blind }, el('th', { scope: 'row', 'aria-label': rowName(i), title: blind ? `${rowName(i)} sees no key` : null }, el('span', { text: rowName(i) })));
    for (let j = 0; j < cols; j++) {
      const v = t.data[i * cols + j];
      const rgb = scale.at(v);
      const td = el('td', { 'data-value': String(v), title: `${rowName(i)} → ${colName(j)}: ${v}` },
        numbered ? el('span', { text: fmt(v, 2) }) : null);
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

/** The smallest of 1, 2, 5, 10, 20, 50, ... that is at least k. */
function niceStep(k) {
  for (let p = 1; ; p *= 10) for (const m of [1, 2, 5]) if (m * p >= k) return m * p;
}

/**
 * Fits a heatmap to a width: numbers in the cells when the table fits with
 * them; otherwise colour only, every column sharing the width (a cell of at
 * least 2 px), and the row and column labels thinned to every 1, 2, 5, 10...
 * so that they never overlap (each header keeps its label for screen
 * readers).
 */
function fitHeatmap(table, width) {
  const corner = table.querySelector('th.corner');
  table.classList.remove('dense');
  table.style.removeProperty('width');
  corner.style.removeProperty('width');
  for (const th of table.querySelectorAll('th.minor')) th.classList.remove('minor');
  if (!table.classList.contains('many') && table.offsetWidth <= width) return;
  table.classList.add('dense');
  const cols = Number(table.dataset.cols);
  const rowSpans = [...table.querySelectorAll('tbody th > span')];
  const colSpans = [...table.querySelectorAll('thead th:not(.corner) > span')];
  const widest = (spans) => Math.ceil(Math.max(0, ...spans.map((s) => s.getBoundingClientRect().width)));
  const header = Math.max(16, Math.min(widest(rowSpans) + 8, Math.floor(width * 0.3)));
  // The separate border model puts 1 px before, between and after columns.
  const cell = Math.max(2, Math.min(18, Math.floor((width - header - cols - 2) / cols)));
  table.style.width = `${header + cols * (cell + 1) + 2}px`;
  table.style.setProperty('--cell', `${cell}px`);
  table.style.setProperty('--label', `${header - 6}px`);
  corner.style.width = `${header}px`;
  const thin = (spans, step) => spans.forEach((s, i) => s.parentElement.classList.toggle('minor', i % step !== 0));
  thin(colSpans, niceStep((widest(colSpans) + 6) / (cell + 1)));
  thin(rowSpans, niceStep(14 / (cell + 1)));
}

/** Puts heatmaps (figures) into a container, each fitted to its width. */
function showMaps(container, figures) {
  container.replaceChildren(...figures);
  drawToWidth(container, (width) => {
    for (const f of figures) fitHeatmap(f.querySelector('table'), width);
  });
}

// ------------------------------------------------------------- charts

/**
 * One y axis: its ends as values (min, max), its ticks, and at(y), a value
 * on the axis's own scale (log10 for a log axis), whose ends are lo and hi.
 */
function yScale({ log = false, min, max }, values) {
  if (log) {
    const lo = Math.floor(Math.log10(Math.min(...values.filter((y) => y > 0))));
    let hi = Math.ceil(Math.log10(Math.max(...values)));
    if (hi === lo) hi = lo + 1;
    const ticks = [];
    for (let e = lo; e <= hi; e++) ticks.push(10 ** e);
    return { lo, hi, min: 10 ** lo, max: 10 ** hi, ticks, at: (y) => Math.log10(y) };
  }
  const lo = min ?? 0;
  const hi = max ?? (Math.max(...values) * 1.05 || 1);
  // Whole numbers when the range is a few units (entropy 0..5), else quarters.
  const n = Number.isInteger(hi - lo) && hi - lo >= 2 && hi - lo <= 8 ? hi - lo : 4;
  const ticks = [];
  for (let k = 0; k <= n; k++) ticks.push(lo + ((hi - lo) * k) / n);
  return { lo, hi, min: lo, max: hi, ticks, at: (y) => y };
}

const tickText = (y, log) => (!log ? fmt(y, 3) : y >= 1e-3 ? String(y) : y.toExponential(0));

/**
 * A line chart against d_k on a log2 axis, width CSS pixels wide.
 * axes: {left: {label, log?, min?, max?}, right?: {...}}: each series is
 * drawn against its own axis (series[i].axis, 'left' by default). Each
 * point is a circle carrying data-x and data-y; each axis its ticks' values
 * and positions (data-value on the tick labels).
 */
function lineChart({ id, width, axes, series }) {
  // The key goes right of the plot when that leaves the plot 420 px, else
  // under it (its width: a 20 px line, and 7 px a character at 12 px).
  const keyW = 38 + 7 * Math.max(...series.map((s) => s.name.length));
  const keyAtRight = width - keyW >= 420;
  const W = width, T = 14, plotH = Math.min(240, Math.max(170, Math.round(width * 0.5)));
  const L = 60, R = (axes.right ? 60 : 16) + (keyAtRight ? keyW : 0);
  const B = 46 + (keyAtRight ? 0 : series.length * 20 + 6);
  const H = T + plotH + B;
  const xs = series[0].values.map((p) => p.x);
  const lx = (x) => Math.log2(x);
  const fx = (x) => L + ((lx(x) - lx(xs[0])) / (lx(xs.at(-1)) - lx(xs[0]) || 1)) * (W - L - R);
  const scales = {};
  for (const side of Object.keys(axes)) {
    const ys = series.filter((s) => (s.axis ?? 'left') === side).flatMap((s) => s.values.map((p) => p.y)).filter((y) => y != null);
    const s = yScale(axes[side], ys);
    s.fy = (y) => T + (1 - (s.at(y) - s.lo) / (s.hi - s.lo)) * plotH;
    scales[side] = s;
  }
  const root = svg('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: 'img', 'aria-labelledby': `${id}-title`, class: 'chart', 'data-name': id });
  root.append(svg('title', { id: `${id}-title` }, `${series.map((s) => s.name).join(', ')} against d_k`));

  // The x axis: a label where there is room for one (every other on a phone).
  const xAxis = svg('g', { class: 'axis', 'data-axis': 'x' });
  const step = Math.ceil(34 / ((W - L - R) / Math.max(1, xs.length - 1)));
  xs.forEach((x, i) => {
    xAxis.append(svg('line', { x1: fx(x), x2: fx(x), y1: T, y2: T + plotH, class: 'grid' }));
    if (i % step === 0)
      xAxis.append(svg('text', { x: fx(x), y: T + plotH + 18, 'text-anchor': 'middle', 'data-value': x }, String(x)));
  });
  xAxis.append(svg('text', { x: (L + W - R) / 2, y: T + plotH + 38, 'text-anchor': 'middle', class: 'label' }, 'd_k'));
  root.append(xAxis);

  // The y axes: the left one draws the grid; the right one only its ticks.
  for (const [side, s] of Object.entries(scales)) {
    const left = side === 'left';
    const g = svg('g', { class: 'axis', 'data-axis': side, 'data-min': s.min, 'data-max': s.max, 'data-log': axes[side].log ? 'true' : null });
    const edge = left ? L : W - R;
    for (const y of s.ticks) {
      if (left) g.append(svg('line', { x1: L, x2: W - R, y1: s.fy(y), y2: s.fy(y), class: 'grid' }));
      else g.append(svg('line', { x1: edge, x2: edge + 4, y1: s.fy(y), y2: s.fy(y), class: 'tick' }));
      g.append(svg('text', { x: left ? edge - 6 : edge + 7, y: s.fy(y) + 4, 'text-anchor': left ? 'end' : 'start', 'data-value': y, 'data-y': s.fy(y) }, tickText(y, axes[side].log)));
    }
    if (!left) g.append(svg('line', { x1: edge, x2: edge, y1: T, y2: T + plotH, class: 'axis-line' }));
    const lxp = left ? 14 : edge + 52, ly = T + plotH / 2;
    g.append(svg('text', { x: lxp, y: ly, 'text-anchor': 'middle', class: 'label', transform: `rotate(-90 ${lxp} ${ly})` }, axes[side].label));
    root.append(g);
  }

  series.forEach((s, n) => {
    const side = s.axis ?? 'left';
    const fy = scales[side].fy;
    const g = svg('g', { class: `series s${n}`, 'data-series': s.key, 'data-axis': side });
    const pts = s.values.filter((p) => p.y != null);
    g.append(svg('polyline', { points: pts.map((p) => `${fx(p.x)},${fy(p.y)}`).join(' '), fill: 'none' }));
    for (const p of pts) {
      const c = svg('circle', { cx: fx(p.x), cy: fy(p.y), r: 3.5, 'data-x': p.x, 'data-y': p.y });
      c.append(svg('title', {}, `${s.name}, d_k = ${p.x}: ${p.y}`));
      g.append(c);
    }
    // The key: at the right of the plot on a wide screen, under it on a narrow one.
    const kx = keyAtRight ? W - keyW + 8 : L;
    const ky = keyAtRight ? T + 14 + n * 20 : T + plotH + 58 + n * 20;
    g.append(svg('line', { x1: kx, x2: kx + 20, y1: ky, y2: ky }));
    g.append(svg('text', { x: kx + 26, y: ky + 4, class: 'key' }, s.name));
    root.append(g);
  });
  return root;
}

/** A chart in its container, drawn again when the container's width changes. */
function showChart(container, options) {
  drawToWidth(container, (width) => container.replaceChildren(lineChart({ ...options, width })));
}

/** The numbers of a chart as a table, in a box that scrolls if it must. */
function dataTable(columns, rows, name) {
  const table = el('table', { class: 'numbers', 'data-name': name });
  table.append(el('thead', {}, el('tr', {}, ...columns.map((c) => el('th', { scope: 'col', text: c })))));
  const body = el('tbody');
  for (const r of rows)
    body.append(el('tr', {}, ...r.map((v, i) => (i === 0 ? el('th', { scope: 'row', text: String(v) }) : el('td', { 'data-value': v == null ? '' : String(v), text: v == null ? '—' : fmt(v, 4) })))));
  table.append(body);
  return el('div', { class: 'scroll' }, table);
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

// ------------------------------------------------------------- rows that see no key

/**
 * The query rows of each head whose lse is -inf: the API's word for a row
 * that sees no key (its weights and output are zeros). lse [..., n_q].
 */
function noKeyRows(lse) {
  const nq = lse.shape.at(-1), heads = lse.data.length / nq;
  const out = [];
  for (let h = 0; h < heads; h++) {
    const rows = [];
    for (let i = 0; i < nq; i++) if (lse.data[h * nq + i] === -Infinity) rows.push(i);
    out.push(rows);
  }
  return out;
}

/**
 * A paragraph saying which queries see no key and why, or null when every
 * query sees one. A query i is before every key under causal masking when
 * i + n_k - n_q < 0 (the last query lines up with the last key); any other
 * row that sees none had its keys hidden by the mask.
 */
function noKeyNote(perHead, { nq, nk, causal, label = String, hasMask = false }) {
  const all = [...new Set(perHead.flat())].sort((a, b) => a - b);
  if (!all.length) return null;
  const same = perHead.every((r) => r.length === perHead[0].length && r.every((x, i) => x === perHead[0][i]));
  const who = same ? `${all.length === 1 ? 'Query' : 'Queries'} ${runsText(all, label)} see${all.length === 1 ? 's' : ''} no key`
    : `Some queries see no key (${perHead.map((r, h) => (r.length ? `head ${h}: ${runsText(r, label)}` : null)).filter(Boolean).join('; ')})`;
  const reasons = [];
  const early = causal ? all.filter((i) => i + nk - nq < 0) : [];
  if (early.length)
    reasons.push(`with causal, the last query lines up with the last key, so query i sees keys j ≤ i + n_k − n_q = i − ${nq - nk}: ` +
      `the first ${nq - nk} of the ${nq} queries come before every one of the ${nk} keys`);
  if (all.length > early.length)
    reasons.push(`${hasMask ? 'the mask hides' : 'a mask hides'} every key from ${early.length ? 'the others' : all.length === 1 ? 'it' : 'them'}`);
  return el('p', { class: 'note no-key', 'data-rows': all.join(',') },
    el('strong', { text: `${who}: ` }),
    `${reasons.join('; ')}. Their weights and output are 0, by the API's convention (their lse is −∞), not a softmax over nothing.`);
}

// ------------------------------------------------------------- bodies typed by hand

/** Bytes of a string in UTF-8 (the API counts error offsets in bytes). */
const utf8Length = (text) => new TextEncoder().encode(text).length;

/**
 * A request body put together from text typed into the page, unparsed, so
 * that every mistake in it is found and worded by the API, not by the page.
 * It remembers where each field's text lies in the body: an error at a byte
 * offset of the body is traced back to the field, and to the line and column
 * of what was typed there.
 */
class TypedBody {
  constructor() {
    this.parts = [];
  }

  /** Text of the page's own making. */
  page(text) {
    this.parts.push({ text });
    return this;
  }

  /** A field's value as typed in `control` (a textarea or input). */
  typed(field, control, label) {
    this.parts.push({ text: control.value, field, control, label });
    return this;
  }

  get text() {
    return this.parts.map((p) => p.text).join('');
  }

  /**
   * Where a byte offset of the body falls: {field, control, label, index,
   * line, column, after} for the typed text holding it, or, when it falls in
   * the page's text, for the typed text just before (its value ended early:
   * the parser read on into what follows), with `after` true.
   */
  locate(byte) {
    let start = 0, last = null;
    for (const p of this.parts) {
      const len = utf8Length(p.text);
      if (byte < start + len && p.control) return this.#where(p, byte - start, false);
      if (byte < start + len) return last && this.#where(last, Infinity, true);
      if (p.control) last = p;
      start += len;
    }
    return last && this.#where(last, Infinity, true);
  }

  #where(part, byte, after) {
    // The character index holding that byte, then its line and column.
    let index = 0;
    for (let b = 0; index < part.text.length;) {
      const cp = part.text.codePointAt(index);
      const size = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
      if (b + size > byte) break;
      b += size;
      index += cp > 0xffff ? 2 : 1;
    }
    const before = part.text.slice(0, index);
    const line = before.split('\n').length;
    const column = [...before.slice(before.lastIndexOf('\n') + 1)].length + 1;
    return { field: part.field, control: part.control, label: part.label, index, line, column, after };
  }
}

// "invalid JSON: expected ',' or ']' at byte 19 (line 2, column 5)": the API
// gives the body's byte offset (a structured `offset` is taken first).
const BODY_POSITION = / at byte (\d+) \(line \d+, column \d+\)/;

/** The place in what was typed that an API error points at, or null. */
function typedPlace(body, err) {
  if (!(err instanceof AttndError)) return null;
  const byte = Number.isInteger(err.detail?.offset) ? err.detail.offset : Number(BODY_POSITION.exec(err.message)?.[1] ?? NaN);
  return Number.isInteger(byte) ? body.locate(byte) : null;
}

/** POSTs a typed body; an error that points into it carries `place`. */
async function computeTyped(path, body) {
  try {
    return await api.computeText(path, body.text);
  } catch (err) {
    if (err instanceof AttndError) err.place = typedPlace(body, err);
    throw err;
  }
}

// ------------------------------------------------------------- section states

function setState(section, state) {
  section.dataset.state = state;
}

function unmark(section) {
  for (const f of section.querySelectorAll('[data-field].invalid')) {
    f.classList.remove('invalid');
    f.querySelector('input, textarea')?.removeAttribute('aria-invalid');
  }
}

/** Marks the input of a field as the one an error names. */
function mark(section, field, box) {
  const input = field && section.querySelector(`[data-field="${CSS.escape(field)}"]`);
  if (!input) return null;
  input.classList.add('invalid');
  const control = input.querySelector('input, textarea');
  control?.setAttribute('aria-invalid', 'true');
  control?.setAttribute('aria-describedby', box.id || (box.id = `${section.id}-error`));
  return control;
}

/**
 * Shows an error in a section, and marks the input it names: the API's
 * field ("q.data" or "q[0][1]" names the input "q"), or the typed text an
 * offset of the body falls in (err.place), with the offending character
 * selected and the message saying where it is in what was typed.
 */
function showError(section, err) {
  const box = section.querySelector(':scope > .error');
  unmark(section);
  if (!err) {
    box.hidden = true;
    box.replaceChildren();
    for (const k of ['status', 'code', 'field', 'line', 'column']) delete box.dataset[k];
    return;
  }
  const e = err instanceof AttndError ? err : new AttndError(0, 'page', String(err?.message ?? err), null);
  const place = e.place ?? null;
  const field = place?.field ?? (e.field ? e.field.split(/[.[]/)[0] : null);
  let message = e.message, where = null;
  if (place) {
    message = message.replace(BODY_POSITION, '');
    where = place.after ? ` — after the end of ${place.label} (line ${place.line}, column ${place.column}): is something missing there?`
      : ` — in ${place.label}, line ${place.line}, column ${place.column}`;
  }
  box.dataset.status = e.status;
  box.dataset.code = e.code;
  box.dataset.field = field ?? '';
  if (place) Object.assign(box.dataset, { line: place.line, column: place.column });
  box.replaceChildren(...[
    el('strong', { text: e.status ? `${e.status} ${e.code}` : e.code }), ' ',
    el('span', { class: 'message', text: message, title: place ? e.message : null }),
    where && el('span', { class: 'where', text: where }),
    e.field && !place ? el('span', { class: 'muted', text: ` (field: ${e.field})` }) : null,
  ].filter((c) => c != null));
  box.hidden = false;
  const control = mark(section, field, box);
  if (place && control === place.control) {
    // The character the parser stopped at, selected where the user typed it.
    const end = Math.min(control.value.length, place.index + 1);
    control.focus({ preventScroll: true });
    control.setSelectionRange(Math.min(place.index, end), end);
  }
}

// Each run of a section gets a ticket: an answer to an older run (the user
// pressed again before it came) is dropped instead of drawn over a newer one.
const tickets = new WeakMap();

/**
 * Runs one section's work, keeping its data-state and error box right.
 * work() fetches and returns a function that draws (or draws itself and
 * returns nothing). Resolves to true or false, or null when a newer run of
 * the same section took over.
 */
async function run(section, work) {
  const ticket = (tickets.get(section) ?? 0) + 1;
  tickets.set(section, ticket);
  setState(section, 'loading');
  try {
    const draw = await work();
    if (tickets.get(section) !== ticket) return null;
    if (typeof draw === 'function') draw();
    showError(section, null);
    setState(section, 'ready');
    return true;
  } catch (err) {
    if (tickets.get(section) !== ticket) return null;
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

function playgroundBody() {
  const f = pgForm.elements;
  const body = new TypedBody();
  const tensor = (name, label, sep) => {
    body.page(`${sep}"${name}": `);
    if (f[name].value.trim()) body.typed(name, f[name], label);
    else body.page('null'); // "the field is required (it is null)"
  };
  tensor('q', 'Q', '{');
  tensor('k', 'K', ', ');
  tensor('v', 'V', ', ');
  if (f.mask.value.trim()) body.page(', "mask": ').typed('mask', f.mask, 'the mask');
  if (f.causal.checked) body.page(', "causal": true');
  if (f.ragged.checked) body.page(', "seq_lens": [').typed('seq_lens', f.seq_lens, 'the lengths').page(']');
  const scale = Number(f.scale.value);
  if (f.scale.value.trim() && Number.isFinite(scale)) body.page(`, "scale": ${scale}`);
  body.page(', "return_weights": true, "return_lse": true, "output_encoding": "base64"}');
  return body;
}

async function runPlayground() {
  const answer = await computeTyped('/v1/attention', playgroundBody());
  return () => drawPlayground(answer);
}

function drawPlayground(answer) {
  const w = answer.weights;
  const heads = w.shape.length > 2 ? w.shape.slice(0, -2).reduce((a, b) => a * b, 1) : 1;
  const [nq, nk] = w.shape.slice(-2);
  const blind = noKeyRows(answer.lse);
  const flatW = new Tensor([heads, nq, nk], w.data);
  const maps = [];
  for (let h = 0; h < heads; h++)
    maps.push(heatmap(flatW.slice(h), { name: `weights-h${h}`, title: heads > 1 ? `weights, head ${h}` : 'weights A', rowTitle: 'query', colTitle: 'key', noKey: blind[h % blind.length] }));
  const seqs = answer.meta.shape.sequences;
  if (seqs) for (const map of maps) markBlocks(map, pgForm.elements.seq_lens.value);
  showMaps(document.getElementById('pg-weights'), maps);
  const o = answer.output;
  const dv = o.shape.at(-1);
  const flatO = new Tensor([heads, nq, dv], o.data);
  const outs = [];
  for (let h = 0; h < heads; h++)
    outs.push(heatmap(flatO.slice(h), { name: `output-h${h}`, title: heads > 1 ? `output, head ${h}` : 'output A V', kind: 'signed', rowTitle: 'query', colTitle: 'dim', noKey: blind[h % blind.length] }));
  showMaps(document.getElementById('pg-output'), outs);
  const f = pgForm.elements;
  pg.querySelector('.meta').replaceChildren(...[
    metaLine(answer, `, ${heads} head${heads > 1 ? 's' : ''}, n_q=${nq}, n_k=${nk}${seqs ? `, ${seqs} sequences` : ''}`),
    noKeyNote(blind, { nq, nk, causal: f.causal.checked, hasMask: Boolean(f.mask.value.trim()) }),
  ].filter(Boolean));
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

const playground = {
  section: pg,
  setup() {
    wire(pgForm, pg, runPlayground);
    // New inputs make the drawn answer stale: compute again at once.
    document.getElementById('pg-random').addEventListener('click', () => {
      fillRandom();
      submitted(pg, runPlayground);
    });
    fillRandom();
  },
  run: runPlayground,
};

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
  const causal = f.causal.checked;
  const req = {
    x: embed(tokens, dModel, seed),
    w_q: projection(random, dModel, dModel),
    w_k: projection(random, dModel, dModel),
    w_v: projection(random, dModel, dModel),
    num_heads: heads,
    causal,
  };
  if (ctxTokens.length) req.context = embed(ctxTokens, dModel, seed);
  const [perHead, mean] = await Promise.all([
    api.multihead({ ...req, return_weights: true, return_lse: true }),
    api.multihead({ ...req, return_weights: 'mean' }),
  ]);
  return () => drawMultihead({ perHead, mean, tokens, keys: ctxTokens.length ? ctxTokens : tokens, causal, cross: ctxTokens.length > 0 });
}

function drawMultihead({ perHead, mean, tokens, keys, causal, cross }) {
  const heads = perHead.meta.shape.heads;
  const blind = noKeyRows(perHead.lse);
  const everyHead = blind[0].filter((i) => blind.every((r) => r.includes(i)));
  const maps = [];
  for (let h = 0; h < heads; h++)
    maps.push(heatmap(perHead.weights.slice(h), { name: `mh-h${h}`, title: `head ${h}`, rowLabels: tokens, colLabels: keys, noKey: blind[h] }));
  maps.push(heatmap(mean.weights, { name: 'mh-mean', title: 'mean over heads', rowLabels: tokens, colLabels: keys, noKey: everyHead }));
  showMaps(document.getElementById('mh-heads'), maps);
  const m = perHead.meta.shape;
  const label = (i) => `${i} (“${tokens[i]}”)`;
  mh.querySelector('.meta').replaceChildren(...[
    metaLine(perHead, `, ${m.heads} heads of d_k=${m.d_k}${cross ? ', cross-attention' : ''}`),
    noKeyNote(blind, { nq: tokens.length, nk: keys.length, causal, label }),
  ].filter(Boolean));
}

const multihead = {
  section: mh,
  setup() {
    wire(mhForm, mh, runMultihead);
  },
  run: runMultihead,
};

// ------------------------------------------------------------- the chapter

const chapterSection = document.getElementById('chapter');

async function workedExample1() {
  const a = await api.attention({
    q: Tensor.from([[1, 0], [0, 1]]), k: Tensor.from([[1, 0], [0, 1]]), v: Tensor.from([[1, 2], [3, 4]]),
    return_weights: true,
  });
  setNumber('ex1-w00', a.weights.at(0, 0));
  setNumber('ex1-w01', a.weights.at(0, 1));
  setNumber('ex1-o0', a.output.at(0, 0));
  const tok = ['token 1', 'token 2'];
  showMaps(document.querySelector('#ex1 .maps'), [
    heatmap(a.weights, { name: 'ex1-weights', title: 'weights', rowLabels: tok, colLabels: tok }),
    heatmap(a.output, { name: 'ex1-output', title: 'output', kind: 'signed', rowLabels: tok }),
  ]);
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
  showMaps(document.querySelector('#ex2 .maps'), [
    heatmap(full.weights, { name: 'ex2-full', title: 'weights, no mask', rowLabels: tok, colLabels: tok }),
    heatmap(causal.weights, { name: 'ex2-causal', title: 'weights, causal', rowLabels: tok, colLabels: tok }),
    heatmap(causal.output, { name: 'ex2-causal-output', title: 'output, causal', kind: 'signed', rowLabels: tok }),
  ]);
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
  showMaps(document.querySelector('#ex6 .maps'), [
    heatmap(raw.weights, { name: 'ex6-raw', title: 'scale 1', rowLabels: ['q'], colLabels: keys }),
    heatmap(scaled.weights, { name: 'ex6-scaled', title: 'scale 1/√64', rowLabels: ['q'], colLabels: keys }),
  ]);
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

function drawTheorem1(answers) {
  const point = (f) => answers.map((a) => ({ x: a.dk, y: f(a) }));
  showChart(document.getElementById('th1-plot'), {
    id: 'th1-chart',
    axes: { left: { label: 'variance', log: true } },
    series: [
      { name: 'Var(S) raw', key: 'raw', values: point((a) => a.scaled.scores.var) },
      { name: 'Var(S̃) scaled', key: 'scaled', values: point((a) => a.scaled.scaled_scores.var) },
    ],
  });
  document.getElementById('th1-table').replaceChildren(dataTable(
    ['d_k', 'mean S', 'Var S', 'mean S̃', 'Var S̃'],
    answers.map((a) => [a.dk, a.scaled.scores.mean, a.scaled.scores.var, a.scaled.scaled_scores.mean, a.scaled.scaled_scores.var]),
    'th1-numbers'));
}

// Weights (0 to 1) and entropies (0 to ln 128 nats, uniform over the keys)
// are different quantities: each gets its own axis.
function drawCorollary1(answers) {
  const point = (f) => answers.map((a) => ({ x: a.dk, y: f(a) }));
  const uniform = Math.log(THEOREM_N);
  const entropies = answers.flatMap((a) => [a.raw.entropy.mean, a.scaled.entropy.mean]);
  showChart(document.getElementById('co1-plot'), {
    id: 'co1-chart',
    axes: {
      left: { label: 'largest weight', min: 0, max: 1 },
      right: { label: 'entropy (nats)', min: 0, max: Math.ceil(Math.max(uniform, ...entropies)) },
    },
    series: [
      { name: 'max weight, scale 1', key: 'max-raw', values: point((a) => a.raw.max_weight.mean) },
      { name: 'entropy, scale 1', key: 'entropy-raw', axis: 'right', values: point((a) => a.raw.entropy.mean) },
      { name: 'max weight, 1/√d_k', key: 'max-scaled', values: point((a) => a.scaled.max_weight.mean) },
      { name: 'entropy, 1/√d_k', key: 'entropy-scaled', axis: 'right', values: point((a) => a.scaled.entropy.mean) },
    ],
  });
  document.getElementById('co1-table').replaceChildren(dataTable(
    ['d_k', 'max weight (scale 1)', 'entropy (scale 1)', 'max weight (1/√d_k)', 'entropy (1/√d_k)'],
    answers.map((a) => [a.dk, a.raw.max_weight.mean, a.raw.entropy.mean, a.scaled.max_weight.mean, a.scaled.entropy.mean]),
    'co1-numbers'));
}

async function theorems() {
  const seed = 1;
  const answers = await Promise.all(THEOREM_DK.map(async (dk) => {
    const req = theoremInputs(dk, seed);
    const [scaled, raw] = await Promise.all([api.attention(req), api.attention({ ...req, scale: 1 })]);
    return { dk, scaled: scaled.stats, raw: raw.stats };
  }));
  await run(document.getElementById('theorem1'), async () => drawTheorem1(answers));
  await run(document.getElementById('corollary1'), async () => drawCorollary1(answers));
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
  failed ||= [...chapterSection.querySelectorAll('article')].some((a) => a.dataset.state !== 'ready');
  if (failed) {
    const firstError = chapterSection.querySelector('article[data-state="error"]');
    throw new AttndError(0, 'chapter', `a part of the chapter failed: ${firstError?.id ?? 'theorems'}`, null);
  }
}

const chapter = {
  section: chapterSection,
  setup() {},
  run: runChapter,
};

// ------------------------------------------------------------- gradients

const gr = document.getElementById('gradients');
const grForm = document.getElementById('gr-form');

async function runGradients() {
  const f = grForm.elements;
  const x = JSON.stringify(EX2_X);
  const body = new TypedBody().page(`{"q": ${x}, "k": ${x}, "v": ${x}, "grad_output": `);
  if (f.grad_output.value.trim()) body.typed('grad_output', f.grad_output, 'dO');
  else body.page('null');
  body.page(`, "causal": ${f.causal.checked}, "return_weights": true, "output_encoding": "base64"}`);
  const a = await computeTyped('/v1/attention', body);
  return () => {
    const tok = ['x₁', 'x₂', 'x₃'];
    showMaps(document.getElementById('gr-maps'), [
      heatmap(a.weights, { name: 'gr-weights', title: 'weights A', rowLabels: tok, colLabels: tok }),
      heatmap(a.grad.q, { name: 'gr-dq', title: 'dQ (Eq. 17)', kind: 'signed', rowLabels: tok }),
      heatmap(a.grad.k, { name: 'gr-dk', title: 'dK (Eq. 18)', kind: 'signed', rowLabels: tok }),
      heatmap(a.grad.v, { name: 'gr-dv', title: 'dV = Aᵀ dO (Eq. 16)', kind: 'signed', rowLabels: tok }),
    ]);
    gr.querySelector('.meta').replaceChildren(metaLine(a));
  };
}

const gradients = {
  section: gr,
  setup() {
    wire(grForm, gr, runGradients);
  },
  run: runGradients,
};

// ------------------------------------------------------------- decoding

const dc = document.getElementById('decoding');
const dcForm = document.getElementById('dc-form');

/* One token a step through a KV cache, then the whole sequence causally
 * through /v1/attention: the same rows. The cache is deleted at the end,
 * failed or not. */
async function runDecoding() {
  const precision = dcForm.elements.precision.value;
  const cache = await api.request('POST', '/v1/caches', JSON.stringify({ num_kv_heads: 1, head_dim: 4 }));
  const rows = [];
  let last;
  try {
    for (const x of EX2_X) {
      last = await api.compute(`/v1/caches/${cache.id}/attention`, { k: [x], v: [x], q: [x], precision });
      rows.push(...last.output.data);
    }
  } finally {
    await api.request('DELETE', `/v1/caches/${cache.id}`).catch(() => {});
  }
  const x = Tensor.from(EX2_X);
  const whole = await api.attention({ q: x, k: x, v: x, causal: true, precision });
  const decoded = new Tensor([EX2_X.length, 4], Float32Array.from(rows));
  let worst = 0;
  for (let i = 0; i < rows.length; i++) worst = Math.max(worst, Math.abs(decoded.data[i] - whole.output.data[i]));
  return () => {
    const tok = ['x₁', 'x₂', 'x₃'];
    showMaps(document.getElementById('dc-maps'), [
      heatmap(decoded, { name: 'dc-decoded', title: 'decoded, one token a step', kind: 'signed', rowLabels: tok }),
      heatmap(whole.output, { name: 'dc-whole', title: 'causal attention, all at once', kind: 'signed', rowLabels: tok }),
    ]);
    dc.querySelector('.meta').replaceChildren(metaLine(last, ` — the cache held ${last.cache.length} positions; largest difference ${worst.toExponential(1)}`));
  };
}

const decoding = {
  section: dc,
  setup() {
    wire(dcForm, dc, runDecoding);
  },
  run: runDecoding,
};

// ------------------------------------------------------------- wiring

// Every section of the page, in the order they appear.
const SECTIONS = [playground, multihead, chapter, gradients, decoding];

/** A section run on the user's request, with the page's status line. */
async function submitted(section, work) {
  const ok = await run(section, work);
  if (ok === null) return;
  document.body.dataset.state = ok ? 'ready' : 'error';
  pageStatus(ok ? 'Done.' : 'The last request failed: see the message in its section.', !ok);
}

function wire(form, section, work) {
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    submitted(section, work);
  });
}

let notice = '';

function pageStatus(text, bad = false) {
  const status = document.getElementById('page-status');
  status.textContent = notice ? `${notice} ${text}` : text;
  status.classList.toggle('bad', bad);
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

function setupServerForm() {
  const base = document.getElementById('api-base');
  base.value = server.refused ?? server.base;
  if (server.refused) {
    base.setAttribute('aria-invalid', 'true');
    notice = `Ignored ?api=${server.refused}: only an http: or https: URL can name a server; this page talks to its own.`;
  } else if (server.base) {
    document.getElementById('openapi-link').href = `${server.base}/openapi.yaml`;
    document.getElementById('metrics-link').href = `${server.base}/metrics`;
  }
  document.getElementById('server-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const value = base.value.trim();
    if (value && !httpUrl(value)) {
      base.setAttribute('aria-invalid', 'true');
      document.getElementById('server-info').textContent = `${value} is not an http: or https: URL`;
      return;
    }
    const u = new URL(location.href);
    if (value) u.searchParams.set('api', value);
    else u.searchParams.delete('api');
    location.href = u.href;
  });
}

async function main() {
  setupServerForm();
  for (const s of SECTIONS) s.setup();
  describeServer();
  const results = await Promise.all(SECTIONS.map((s) => run(s.section, s.run)));
  const ok = results.every((r) => r !== false);
  document.body.dataset.state = ok ? 'ready' : 'error';
  const where = server.base || 'this server';
  pageStatus(ok ? `Ready: every figure below came from ${where}.` : `Some requests to ${where} failed: the sections say why.`, !ok);
}

main();
