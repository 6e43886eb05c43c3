// What the Node tests share: a real attnd started on a free port, the npm
// packages of build/node, and an independent double-precision reference of
// scaled dot-product attention and its gradients (plain loops, as
// tests/support/ref.c does in C).
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const attndBin = path.resolve(root, process.env.ATTND_BIN ?? 'build/attnd');

/** require() for the packages tools/node-deps.sh installed into build/node. */
export function requireNodeDep(name) {
  const dir = path.resolve(root, process.env.ATTND_NODE_DIR ?? 'build/node');
  return createRequire(path.join(dir, 'package.json'))(name);
}

/**
 * Starts attnd with --port 0 and reads the port it bound from its first log
 * line. stop() sends SIGTERM and resolves with the exit code.
 */
export function startAttnd(args = [], { bin = attndBin, env = {} } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, ['--bind', '127.0.0.1', '--port', '0', ...args], {
      stdio: ['ignore', 'ignore', 'pipe'],
      env: { ...process.env, ...env },
    });
    let log = '';
    const timer = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`attnd did not start: ${log}`)); }, 10000);
    child.on('error', reject);
    child.on('exit', (code) => { clearTimeout(timer); reject(new Error(`attnd exited ${code}: ${log}`)); });
    child.stderr.on('data', (chunk) => {
      log += chunk;
      const m = /listening on (\S+):(\d+)/.exec(log);
      if (!m || child.port) return;
      clearTimeout(timer);
      child.removeAllListeners('exit');
      child.port = Number(m[2]);
      const exited = new Promise((done) => child.on('exit', (code, signal) => done(code ?? signal)));
      resolve({
        port: child.port,
        url: `http://127.0.0.1:${child.port}`,
        log: () => log,
        stop: () => { child.kill('SIGTERM'); return exited; },
      });
    });
  });
}

// ------------------------------------------------------------ the reference

/** rows x cols from a flat array. */
const at = (a, cols) => (i, j) => a[i * cols + j];

/**
 * q [nq, d], k [nk, d], v [nk, dv] as flat arrays; returns weights [nq, nk]
 * and output [nq, dv] in double precision, and with dO [nq, dv] the
 * gradients dq, dk, dv.
 */
export function sdpaReference({ q, k, v, nq, nk, d, dv, scale = 1 / Math.sqrt(d), causal = false, dO = null }) {
  const Q = at(q, d), K = at(k, d), V = at(v, dv);
  const w = new Float64Array(nq * nk), out = new Float64Array(nq * dv);
  for (let i = 0; i < nq; i++) {
    let max = -Infinity;
    const s = new Float64Array(nk);
    for (let j = 0; j < nk; j++) {
      let dot = 0;
      for (let c = 0; c < d; c++) dot += Q(i, c) * K(j, c);
      s[j] = causal && j > i + (nk - nq) ? -Infinity : dot * scale;
      max = Math.max(max, s[j]);
    }
    let z = 0;
    for (let j = 0; j < nk; j++) z += s[j] === -Infinity ? 0 : Math.exp(s[j] - max);
    for (let j = 0; j < nk; j++) {
      w[i * nk + j] = s[j] === -Infinity ? 0 : Math.exp(s[j] - max) / z;
      for (let c = 0; c < dv; c++) out[i * dv + c] += w[i * nk + j] * V(j, c);
    }
  }
  if (!dO) return { weights: w, output: out };
  const G = at(dO, dv), W = at(w, nk);
  const gq = new Float64Array(nq * d), gk = new Float64Array(nk * d), gv = new Float64Array(nk * dv);
  for (let i = 0; i < nq; i++) {
    // dA_ij = dO_i . v_j ; dS_ij = A_ij (dA_ij - sum_l A_il dA_il)
    const dA = new Float64Array(nk);
    let rowDot = 0;
    for (let j = 0; j < nk; j++) {
      for (let c = 0; c < dv; c++) dA[j] += G(i, c) * V(j, c);
      rowDot += W(i, j) * dA[j];
    }
    for (let j = 0; j < nk; j++) {
      const dS = W(i, j) * (dA[j] - rowDot) * scale;
      for (let c = 0; c < d; c++) {
        gq[i * d + c] += dS * K(j, c);
        gk[j * d + c] += dS * Q(i, c);
      }
      for (let c = 0; c < dv; c++) gv[j * dv + c] += W(i, j) * G(i, c);
    }
  }
  return { weights: w, output: out, grad: { q: gq, k: gk, v: gv } };
}

/** Largest |a - b| / max(1, |b|) over two equal-length arrays. */
export function maxRelErr(a, b) {
  if (a.length !== b.length) return Infinity;
  let e = 0;
  for (let i = 0; i < a.length; i++) e = Math.max(e, Math.abs(a[i] - b[i]) / Math.max(1, Math.abs(b[i])));
  return e;
}

/** A tensor of an answer (nested, flat or base64) as {shape, data}. */
export function decode(t) {
  if (Array.isArray(t)) {
    const shape = [];
    for (let a = t; Array.isArray(a); a = a[0]) shape.push(a.length);
    return { shape, data: Float64Array.from(t.flat(Infinity)) };
  }
  if (t.base64 !== undefined) {
    const b = Buffer.from(t.base64, 'base64');
    const data = new Float64Array(b.length / 4);
    for (let i = 0; i < data.length; i++) data[i] = b.readFloatLE(i * 4);
    return { shape: t.shape, data };
  }
  return { shape: t.shape, data: Float64Array.from(t.data) };
}

export async function post(url, body) {
  const res = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: typeof body === 'string' ? body : JSON.stringify(body) });
  return { status: res.status, json: await res.json(), headers: res.headers };
}
