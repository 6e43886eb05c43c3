// The page's client module (server/web/attnd.js) from Node.js against a live
// attnd: base64 tensors both ways, answers against the double-precision
// reference of support.mjs, the API's errors as AttndError. Needs no npm
// package, so it runs in make test.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Client, Tensor, AttndError, base64Encode, base64Decode } from '../../server/web/attnd.js';
import { startAttnd, sdpaReference, maxRelErr } from './support.mjs';

let server, api;
before(async () => { server = await startAttnd(); api = new Client(server.url); });
after(async () => assert.equal(await server.stop(), 0));

function normals(n, seed) {
  let s = seed;
  const next = () => ((s = (s * 1103515245 + 12345) % 2147483648) / 2147483648);
  return Float32Array.from({ length: n }, () => Math.sqrt(-2 * Math.log(1 - next())) * Math.cos(2 * Math.PI * next()));
}

test('base64 agrees with Node\'s own codec for every length mod 3', () => {
  for (let n = 0; n < 40; n++) {
    const bytes = Uint8Array.from({ length: n }, (_, i) => (i * 37 + n) & 255);
    const text = base64Encode(bytes);
    assert.equal(text, Buffer.from(bytes).toString('base64'));
    assert.deepEqual(base64Decode(text), bytes);
  }
});

test('a Tensor goes out as little-endian float32 base64', () => {
  const t = new Tensor([2, 2], [1, -2.5, 3e-8, 65504]);
  const json = JSON.parse(JSON.stringify(t));
  assert.deepEqual(json.shape, [2, 2]);
  assert.equal(json.dtype, 'float32');
  const b = Buffer.from(json.base64, 'base64');
  assert.deepEqual([0, 1, 2, 3].map((i) => b.readFloatLE(4 * i)), Array.from(t.data));
  assert.deepEqual(Tensor.from([[1, 2], [3, 4]]).toNested(), [[1, 2], [3, 4]]);
  assert.throws(() => new Tensor([2, 3], [1, 2]), RangeError);
});

test('attention with causal mask and gradients equals the reference', async () => {
  const nq = 5, nk = 8, d = 16, dv = 3;
  const q = normals(nq * d, 1), k = normals(nk * d, 2), v = normals(nk * dv, 3), dO = normals(nq * dv, 4);
  const r = await api.attention({
    q: new Tensor([nq, d], q), k: new Tensor([nk, d], k), v: new Tensor([nk, dv], v),
    grad_output: new Tensor([nq, dv], dO), causal: true, return_weights: true,
  });
  assert.ok(r.output instanceof Tensor && r.output.data instanceof Float32Array);
  assert.deepEqual(r.output.shape, [nq, dv]);
  const ref = sdpaReference({ q, k, v, nq, nk, d, dv, causal: true, dO });
  assert.ok(maxRelErr(r.weights.data, ref.weights) < 1e-6);
  assert.ok(maxRelErr(r.output.data, ref.output) < 1e-5);
  for (const key of ['q', 'k', 'v'])
    assert.ok(maxRelErr(r.grad[key].data, ref.grad[key]) < 1e-5, `d${key}: ${maxRelErr(r.grad[key].data, ref.grad[key])}`);
  // Causal, aligned bottom-right: query 0 of 5 sees keys 0..3 of 8.
  assert.ok(r.weights.at(0, 3) > 0);
  assert.equal(r.weights.at(0, 4), 0);
  for (const step of ['decode', 'compute', 'encode', 'total']) assert.equal(typeof r.meta.timing_ms[step], 'number');
});

test('the base64 answer is the flat answer bit for bit', async () => {
  const req = { q: Tensor.from([[0.1, 0.2], [0.3, 0.4]]), k: Tensor.from([[1, 0], [0.5, 2]]), v: Tensor.from([[1, 2], [3, 4]]) };
  const b64 = await api.attention(req);
  const flat = await api.attention({ ...req, output_encoding: 'flat' });
  const nested = await api.attention({ ...req, output_encoding: 'nested' });
  assert.deepEqual(Array.from(b64.output.data), Array.from(flat.output.data));
  assert.deepEqual(b64.output.toNested(), nested.output.toNested());
});

test('multihead: the head mean is the mean of the heads', async () => {
  const x = Tensor.from([[1, 0], [0, 1], [1, 1]]), eye = Tensor.from([[1, 0], [0, 1]]);
  const req = { x, w_q: eye, w_k: eye, w_v: eye, num_heads: 2 };
  const [per, mean] = await Promise.all([api.multihead({ ...req, return_weights: true }), api.multihead({ ...req, return_weights: 'mean' })]);
  assert.deepEqual(per.weights.shape, [2, 3, 3]);
  for (let i = 0; i < 9; i++) assert.ok(Math.abs((per.weights.data[i] + per.weights.data[9 + i]) / 2 - mean.weights.data[i]) < 1e-7);
});

test('errors: the API\'s status, code, message and field; no server is a network error', async () => {
  await assert.rejects(api.attention({ q: Tensor.from([[1, 0]]), k: Tensor.from([[1, 0, 0]]), v: Tensor.from([[1]]) }),
    (e) => e instanceof AttndError && e.status === 422 && e.code === 'shape_mismatch' && e.field === 'k' && /d_k=3/.test(e.message));
  await assert.rejects(api.computeText('/v1/attention', '{"q": [[1]], "k": [[1]], "v": [[1]], "casual": true}'),
    (e) => e.status === 400 && e.code === 'unknown_field' && e.field === 'casual');
  const gone = new Client('http://127.0.0.1:9');
  await assert.rejects(gone.info(), (e) => e instanceof AttndError && e.status === 0 && e.code === 'network');
});
