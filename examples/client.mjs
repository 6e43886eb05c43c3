// attnd from Node.js 18+ with the page's own client (server/web/attnd.js,
// the module GET /attnd.js serves): base64 float32 both ways.
//   node examples/client.mjs [URL]
import { Client, Tensor, AttndError } from '../server/web/attnd.js';

const api = new Client(process.argv[2] ?? 'http://127.0.0.1:8080');
console.log('server:', (await api.info()).version);

// Worked Example 1: Q = K = I, V = [[1, 2], [3, 4]].
const eye = Tensor.from([[1, 0], [0, 1]]);
const r = await api.attention({ q: eye, k: eye, v: Tensor.from([[1, 2], [3, 4]]), return_weights: true });
console.log('example 1 weights:', JSON.stringify(r.weights.toNested()));
console.log('example 1 output:', JSON.stringify(r.output.toNested()));

// Multi-head self-attention over 3 tokens, 2 heads, with the head average.
const x = Tensor.from([[1, 0], [0, 1], [1, 1]]);
const mh = await api.multihead({ x, w_q: eye, w_k: eye, w_v: eye, num_heads: 2, causal: true, return_weights: 'mean' });
console.log('multihead mean weights:', JSON.stringify(mh.weights.toNested()));
console.log('timing (ms):', JSON.stringify(mh.meta.timing_ms));

try {
  await api.attention({ q: eye, k: Tensor.from([[1, 1, 1], [1, 1, 1]]), v: eye });
} catch (e) {
  if (!(e instanceof AttndError)) throw e;
  console.log(`error: ${e.status} ${e.code}: ${e.message} (field ${e.field})`);
}
