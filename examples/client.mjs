// attnd from Node.js 18+ with the page's own client (server/web/attnd.js,
// the module GET /attnd.js serves): base64 float32 both ways.
//   node examples/client.mjs [URL]
// URL defaults to $ATTND_URL, then http://127.0.0.1:8080. A server that is
// not there, or an answer that is an error, ends the script with one line
// saying so (and exit status 1).
import { Client, Tensor, AttndError } from '../server/web/attnd.js';

/** "host:port" alone is taken as http://host:port, as curl does. */
function serverUrl() {
  const url = process.argv[2] || process.env.ATTND_URL || 'http://127.0.0.1:8080';
  return url.includes('://') ? url : `http://${url}`;
}

/** What a failed request means for whoever ran the script, in one line. */
function oneLine(url, e) {
  if (e.status !== 0) return `${url} answered ${e.status} ${e.code}: ${e.message}`;
  // fetch() says "fetch failed"; the system's reason is in its cause.
  const why = e.cause?.cause?.code ?? e.cause?.cause?.message ?? e.cause?.message ?? e.message;
  return `cannot reach ${url}: is attnd running? (${why})`;
}

async function main(url) {
  const api = new Client(url);
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

  // An error on purpose: K's d_k is not Q's.
  try {
    await api.attention({ q: eye, k: Tensor.from([[1, 1, 1], [1, 1, 1]]), v: eye });
  } catch (e) {
    if (!(e instanceof AttndError)) throw e;
    console.log(`error: ${e.status} ${e.code}: ${e.message} (field ${e.field})`);
  }
}

const url = serverUrl();
try {
  await main(url);
} catch (e) {
  if (!(e instanceof AttndError)) throw e;
  console.error(oneLine(url, e));
  process.exitCode = 1;
}
