// Operations that tools understand: /metrics passes promtool, a real
// Prometheus (Debian's) scrapes attnd with docker/prometheus.yml and answers
// attnd_requests_total through its query API, and docker/k8s/ is valid
// against the Kubernetes schemas (kubernetes-models) and says what the
// deployment needs (probes, non-root, read-only root, drain time, ...).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { startAttnd, requireNodeDep, root, post } from './support.mjs';

const YAML = requireNodeDep('yaml');
let server;
before(async () => { server = await startAttnd(); });
after(async () => assert.equal(await server.stop(), 0));

const freePort = () => new Promise((resolve) => {
  const s = net.createServer().listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test('/metrics passes promtool check metrics', async () => {
  await post(`${server.url}/v1/attention`, { q: [[1, 0]], k: [[1, 0]], v: [[1]] });
  await post(`${server.url}/v1/attention`, { q: [[1, 0]], k: [[1]], v: [[1]] }); // a 422
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const r = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  assert.equal(r.error, undefined, 'promtool runs');
  assert.equal(r.status, 0, `promtool: ${r.stdout}${r.stderr}`);
  assert.equal((r.stdout + r.stderr).trim(), '', 'no lint problem');
});

test('Prometheus scrapes attnd with docker/prometheus.yml and answers attnd_requests_total', async () => {
  const config = YAML.parse(fs.readFileSync(path.join(root, 'docker/prometheus.yml'), 'utf8'));
  const job = config.scrape_configs.find((j) => j.job_name === 'attnd');
  assert.ok(job?.dns_sd_configs, 'the attnd job discovers the replicas');
  delete job.dns_sd_configs;
  job.static_configs = [{ targets: [`127.0.0.1:${server.port}`] }];
  config.global.scrape_interval = '1s';
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'attnd-prom-'));
  fs.writeFileSync(path.join(dir, 'prometheus.yml'), YAML.stringify(config));
  const check = spawnSync('promtool', ['check', 'config', path.join(dir, 'prometheus.yml')], { encoding: 'utf8' });
  assert.equal(check.status, 0, check.stdout + check.stderr);

  const port = await freePort();
  const prom = spawn('prometheus', [`--config.file=${path.join(dir, 'prometheus.yml')}`,
    `--storage.tsdb.path=${path.join(dir, 'data')}`, `--web.listen-address=127.0.0.1:${port}`], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  prom.stderr.on('data', (d) => { log += d; });
  try {
    for (let i = 0; i < 3; i++) await post(`${server.url}/v1/attention`, { q: [[1, 0]], k: [[1, 0]], v: [[1]] });
    const query = encodeURIComponent('attnd_requests_total{route="/v1/attention",status="200"}');
    let result = [];
    for (let t = 0; t < 60 && result.length === 0; t++) {
      await sleep(500);
      try {
        const r = await (await fetch(`http://127.0.0.1:${port}/api/v1/query?query=${query}`)).json();
        result = r.status === 'success' ? r.data.result : [];
      } catch { /* not up yet */ }
    }
    assert.equal(result.length, 1, `Prometheus has the series (log: ${log.slice(-500)})`);
    assert.equal(result[0].metric.job, 'attnd');
    assert.ok(Number(result[0].value[1]) >= 3, `attnd_requests_total = ${result[0].value[1]}`);
    const up = await (await fetch(`http://127.0.0.1:${port}/api/v1/query?query=up`)).json();
    assert.equal(up.data.result[0].value[1], '1', 'the target is up');
  } finally {
    prom.kill('SIGTERM');
    await new Promise((r) => prom.on('exit', r));
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

// ------------------------------------------------------------- Kubernetes

const k8s = Object.fromEntries(fs.readdirSync(path.join(root, 'docker/k8s')).filter((f) => f.endsWith('.yaml'))
  .flatMap((f) => YAML.parseAllDocuments(fs.readFileSync(path.join(root, 'docker/k8s', f), 'utf8')).map((d) => d.toJS()))
  .map((o) => [o.kind, o]));

const MODELS = {
  Deployment: ['kubernetes-models/apps/v1', 'apps/v1'],
  Service: ['kubernetes-models/v1', 'v1'],
  HorizontalPodAutoscaler: ['kubernetes-models/autoscaling/v2', 'autoscaling/v2'],
  PodDisruptionBudget: ['kubernetes-models/policy/v1', 'policy/v1'],
};

test('docker/k8s/ has a Deployment, Service, HPA and PDB, each valid against its Kubernetes schema', () => {
  assert.deepEqual(Object.keys(k8s).sort(), Object.keys(MODELS).sort());
  for (const [kind, [module, apiVersion]] of Object.entries(MODELS)) {
    const Model = requireNodeDep(module)[kind];
    assert.equal(k8s[kind].apiVersion, apiVersion, kind);
    assert.doesNotThrow(() => new Model(k8s[kind]).validate(), `${kind} is valid`);
  }
  // The validator is not a rubber stamp: a wrong type is refused.
  const { Deployment } = requireNodeDep('kubernetes-models/apps/v1');
  const broken = structuredClone(k8s.Deployment);
  broken.spec.template.spec.containers[0].readinessProbe.httpGet.port = { name: 'http' };
  assert.throws(() => new Deployment(broken).validate());
});

test('the Deployment: 2 replicas, probes, resources, non-root, read-only root, time to drain', () => {
  const d = k8s.Deployment, pod = d.spec.template.spec, c = pod.containers[0];
  assert.equal(d.spec.replicas, 2);
  assert.equal(c.readinessProbe.httpGet.path, '/readyz');
  assert.equal(c.livenessProbe.httpGet.path, '/healthz');
  assert.ok(c.resources.requests.cpu && c.resources.requests.memory && c.resources.limits.cpu && c.resources.limits.memory);
  assert.equal(pod.securityContext.runAsNonRoot, true);
  assert.equal(c.securityContext.readOnlyRootFilesystem, true);
  assert.equal(c.securityContext.allowPrivilegeEscalation, false);
  // The image's user (docker/Dockerfile) is the one the pod runs as.
  const dockerfile = fs.readFileSync(path.join(root, 'docker/Dockerfile'), 'utf8');
  assert.match(dockerfile, new RegExp(`--uid ${pod.securityContext.runAsUser}\\b`));
  // preStop, then the drain: the grace period covers both with room to spare.
  const preStop = Number(c.lifecycle.preStop.exec.command.at(-1));
  assert.ok(preStop > 0 && pod.terminationGracePeriodSeconds >= preStop + 60, 'grace >= preStop + 60 s of drain');
  assert.equal(c.env.find((e) => e.name === 'ATTND_BIND').value, '0.0.0.0');
  const port = c.ports.find((p) => p.name === 'http').containerPort;
  assert.equal(String(port), c.env.find((e) => e.name === 'ATTND_PORT').value);
});

test('the Service, HPA and PDB point at the Deployment\'s pods', () => {
  const labels = k8s.Deployment.spec.template.metadata.labels;
  const matches = (sel) => Object.entries(sel).every(([k, v]) => labels[k] === v);
  assert.ok(matches(k8s.Service.spec.selector));
  assert.equal(k8s.Service.spec.ports[0].targetPort, 'http');
  assert.ok(matches(k8s.PodDisruptionBudget.spec.selector.matchLabels));
  assert.ok(k8s.PodDisruptionBudget.spec.minAvailable < k8s.Deployment.spec.replicas, 'a drain can proceed');
  const hpa = k8s.HorizontalPodAutoscaler.spec;
  assert.equal(hpa.scaleTargetRef.kind, 'Deployment');
  assert.equal(hpa.scaleTargetRef.name, k8s.Deployment.metadata.name);
  assert.equal(hpa.minReplicas, k8s.Deployment.spec.replicas);
  assert.equal(hpa.metrics[0].resource.name, 'cpu');
});
