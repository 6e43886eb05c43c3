// attnd's JavaScript client: the module the page at GET / runs on, and the
// same file works from Node.js 18+ (global fetch), so there is one client:
//
//   import { Client, Tensor } from './attnd.js';
//   const api = new Client('http://127.0.0.1:8080');
//   const r = await api.attention({ q: Tensor.from([[1, 0]]), k: ..., v: ...,
//                                   return_weights: true });
//   r.output.shape, r.output.data   // [1, d_v], a Float32Array
//
// Tensors travel as base64 float32 both ways: a Tensor in a request is sent
// as {"shape", "dtype": "float32", "base64"}, and the client asks for
// output_encoding "base64" unless the request names another, so every tensor
// of the answer comes back as a Tensor with the exact float32 values. Plain
// nested arrays in a request are sent as they are.
//
// An answer that is not 2xx throws an AttndError carrying the API's status,
// code, message and field unchanged (and the whole error object as
// `detail`).

/** A float32 tensor: shape and row-major data. */
export class Tensor {
  constructor(shape, data) {
    const size = shape.reduce((a, b) => a * b, 1);
    if (data.length !== size)
      throw new RangeError(`shape [${shape}] needs ${size} numbers, got ${data.length}`);
    this.shape = shape.slice();
    this.data = data instanceof Float32Array ? data : Float32Array.from(data);
  }

  /** From nested arrays ([[1, 2], [3, 4]]); rectangular. */
  static from(nested) {
    const shape = [];
    for (let a = nested; Array.isArray(a); a = a[0]) shape.push(a.length);
    const flat = nested.flat(Infinity);
    return new Tensor(shape, flat);
  }

  /** Element at an index list, row-major. */
  at(...index) {
    let off = 0;
    for (let i = 0; i < this.shape.length; i++) off = off * this.shape[i] + (index[i] ?? 0);
    return this.data[off];
  }

  /** The sub-tensor at a leading index: t.slice(h) of [H, n, d] is [n, d]. */
  slice(i) {
    const inner = this.shape.slice(1);
    const size = inner.reduce((a, b) => a * b, 1);
    return new Tensor(inner, this.data.subarray(i * size, (i + 1) * size));
  }

  /** Rows of a rank-2 tensor as plain arrays of numbers. */
  rows() {
    const [n, d] = this.shape.slice(-2);
    const out = [];
    for (let i = 0; i < n; i++) out.push(Array.from(this.data.subarray(i * d, (i + 1) * d)));
    return out;
  }

  toNested() {
    const build = (dim, off) => {
      if (dim === this.shape.length - 1)
        return Array.from(this.data.subarray(off, off + this.shape[dim]));
      const stride = this.shape.slice(dim + 1).reduce((a, b) => a * b, 1);
      const out = [];
      for (let i = 0; i < this.shape[dim]; i++) out.push(build(dim + 1, off + i * stride));
      return out;
    };
    return this.shape.length ? build(0, 0) : [];
  }

  /** The request form: base64 of little-endian float32. */
  toJSON() {
    const bytes = new Uint8Array(this.data.length * 4);
    const view = new DataView(bytes.buffer);
    for (let i = 0; i < this.data.length; i++) view.setFloat32(i * 4, this.data[i], true);
    return { shape: this.shape, dtype: 'float32', base64: base64Encode(bytes) };
  }
}

/** An answer of the API that is not 2xx, or a request that never got one. */
export class AttndError extends Error {
  constructor(status, code, message, field, detail = null) {
    super(message);
    this.name = 'AttndError';
    this.status = status; // 0: no HTTP answer (network, CORS)
    this.code = code;
    this.field = field ?? null;
    this.detail = detail; // the API's error object, as it came
  }
}

const ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
const DECODE = new Int16Array(128).fill(-1);
for (let i = 0; i < 64; i++) DECODE[ALPHABET.charCodeAt(i)] = i;

export function base64Encode(bytes) {
  let out = '';
  let i = 0;
  for (; i + 2 < bytes.length; i += 3) {
    const n = (bytes[i] << 16) | (bytes[i + 1] << 8) | bytes[i + 2];
    out += ALPHABET[n >> 18] + ALPHABET[(n >> 12) & 63] + ALPHABET[(n >> 6) & 63] + ALPHABET[n & 63];
  }
  const rest = bytes.length - i;
  if (rest === 1) {
    const n = bytes[i] << 16;
    out += ALPHABET[n >> 18] + ALPHABET[(n >> 12) & 63] + '==';
  } else if (rest === 2) {
    const n = (bytes[i] << 16) | (bytes[i + 1] << 8);
    out += ALPHABET[n >> 18] + ALPHABET[(n >> 12) & 63] + ALPHABET[(n >> 6) & 63] + '=';
  }
  return out;
}

export function base64Decode(text) {
  const clean = text.replace(/=+$/, '');
  const bytes = new Uint8Array(Math.floor((clean.length * 3) / 4));
  let acc = 0, bits = 0, o = 0;
  for (let i = 0; i < clean.length; i++) {
    const c = clean.charCodeAt(i);
    const v = c < 128 ? DECODE[c] : -1;
    if (v < 0) throw new AttndError(0, 'invalid_base64', `not base64 at character ${i}`, null);
    acc = (acc << 6) | v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes[o++] = (acc >> bits) & 255;
    }
  }
  return bytes;
}

// JSON has no infinity: the nested and flat encodings write lse's -inf (a
// row that sees no key, the one null an answer has) as null.
const fromJson = (x) => (x === null ? -Infinity : x);

/** A tensor of an answer, in any of the three encodings, as a Tensor. */
export function decodeTensor(t) {
  if (Array.isArray(t)) {
    const shape = [];
    for (let a = t; Array.isArray(a); a = a[0]) shape.push(a.length);
    return new Tensor(shape, t.flat(Infinity).map(fromJson));
  }
  if (t && typeof t.base64 === 'string') {
    const bytes = base64Decode(t.base64);
    const view = new DataView(bytes.buffer);
    const data = new Float32Array(bytes.length / 4);
    for (let i = 0; i < data.length; i++) data[i] = view.getFloat32(i * 4, true);
    return new Tensor(t.shape, data);
  }
  if (t && Array.isArray(t.data)) return new Tensor(t.shape, t.data.flat(Infinity).map(fromJson));
  throw new TypeError('not a tensor');
}

// The tensor-valued members of an answer; everything else is plain JSON.
const TENSOR_KEYS = ['output', 'weights', 'lse'];

function decodeAnswer(body) {
  for (const key of TENSOR_KEYS) if (body[key] != null) body[key] = decodeTensor(body[key]);
  if (body.grad)
    for (const key of Object.keys(body.grad)) body.grad[key] = decodeTensor(body.grad[key]);
  return body;
}

export class Client {
  /**
   * base: the server's URL ('' for the page's own origin).
   * options.fetch: a fetch implementation (default: the global one).
   */
  constructor(base = '', options = {}) {
    this.base = base.replace(/\/+$/, '');
    this.fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** POST /v1/attention. */
  attention(request) {
    return this.compute('/v1/attention', request);
  }

  /** POST /v1/multihead. */
  multihead(request) {
    return this.compute('/v1/multihead', request);
  }

  /** GET /v1/info. */
  info() {
    return this.request('GET', '/v1/info');
  }

  async compute(path, request) {
    const body = { output_encoding: 'base64', ...request };
    const answer = await this.request('POST', path, JSON.stringify(body));
    return decodeAnswer(answer);
  }

  /** POST a body given as text, as it is (for bodies a person typed). */
  async computeText(path, text) {
    return decodeAnswer(await this.request('POST', path, text));
  }

  async request(method, path, body) {
    let res;
    try {
      res = await this.fetch(this.base + path, {
        method,
        headers: body === undefined ? {} : { 'Content-Type': 'application/json' },
        body,
      });
    } catch (e) {
      // A refused connection and a CORS refusal look the same from a page;
      // in Node.js the cause says which (e.cause.code: ECONNREFUSED, ...).
      const err = new AttndError(0, 'network', `no answer from ${this.base || 'this server'}${path}: ${e.message}`, null);
      err.cause = e;
      throw err;
    }
    const text = await res.text();
    let json;
    try {
      json = JSON.parse(text);
    } catch {
      throw new AttndError(res.status, 'not_json', `${method} ${path} answered ${res.status} with a body that is not JSON`, null);
    }
    if (!res.ok) {
      const e = json.error ?? {};
      throw new AttndError(e.status ?? res.status, e.code ?? 'error', e.message ?? text, e.field, e);
    }
    return json;
  }
}
