// Operations that tools understand: /metrics passes promtool, a real
// Prometheus (Debian's) scrapes attnd with docker/prometheus.yml and answers
// attnd_requests_total through its query API, and docker/k8s/ is valid
// against the Kubernetes schemas (kubernetes-models) and says what the
// deployment needs (probes, non-root, read-only root, drain time, ...); so
// are its alternatives: the KEDA ScaledObject (@kubernetes-models/keda, and
// its queries asked of a real Prometheus scraping a loaded attnd), the KServe
// InferenceService (the openAPIV3Schema of KServe's own CRD, test data kept
// outside the project, through Ajv) and the ingress-nginx Ingresses that
// route KV caches as docker/nginx.conf does.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { startAttnd, requireNodeDep, root, post } from './support.mjs';

// KServe's CRD (config/crd/full/serving.kserve.io_inferenceservices.yaml of
// kserve/kserve) is test data kept beside the project, not in it:
// ATTND_KSERVE_CRD names the file, else ../shared/testdata/kserve/ of the
// checkout or of the directory holding its worktree.
const KSERVE_CRD = process.env.ATTND_KSERVE_CRD || ['../shared', '../../shared']
  .map((p) => path.resolve(root, p, 'testdata/kserve/serving.kserve.io_inferenceservices.yaml'))
  .find((p) => fs.existsSync(p));

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
  // By number: podman kube play (make container-test) does not resolve names in probes.
  assert.equal(c.readinessProbe.httpGet.port, port);
  assert.equal(c.livenessProbe.httpGet.port, port);
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

// ------------------------------------------- the alternatives in docker/k8s/*/

const manifests = (dir) => fs.readdirSync(path.join(root, 'docker/k8s', dir)).filter((f) => f.endsWith('.yaml'))
  .flatMap((f) => YAML.parseAllDocuments(fs.readFileSync(path.join(root, 'docker/k8s', dir, f), 'utf8')).map((d) => d.toJS()));
const keda = manifests('keda'), kserve = manifests('kserve'), ingress = manifests('ingress');
const scaledObject = keda.find((o) => o.kind === 'ScaledObject');
const podLabels = k8s.Deployment.spec.template.metadata.labels;
const selects = (sel) => Object.entries(sel).every(([k, v]) => podLabels[k] === v);

test('docker/k8s/keda/: a ScaledObject valid against KEDA\'s schema, scaling the Deployment on attnd\'s queue and in-flight gauges', () => {
  assert.deepEqual(keda.map((o) => o.kind), ['ScaledObject']);
  const { ScaledObject } = requireNodeDep('@kubernetes-models/keda/keda.sh/v1alpha1');
  assert.equal(scaledObject.apiVersion, 'keda.sh/v1alpha1');
  assert.doesNotThrow(() => new ScaledObject(scaledObject).validate(), 'the ScaledObject is valid');
  const broken = structuredClone(scaledObject);
  broken.spec.minReplicaCount = 'two';
  assert.throws(() => new ScaledObject(broken).validate(), 'the validator refuses a wrong type');
  const spec = scaledObject.spec;
  assert.equal(spec.scaleTargetRef.kind, 'Deployment');
  assert.equal(spec.scaleTargetRef.name, k8s.Deployment.metadata.name);
  assert.ok(spec.minReplicaCount > k8s.PodDisruptionBudget.spec.minAvailable, 'a drain can proceed');
  assert.equal(spec.minReplicaCount, k8s.HorizontalPodAutoscaler.spec.minReplicas);
  assert.notEqual(spec.advanced.horizontalPodAutoscalerConfig.name, k8s.HorizontalPodAutoscaler.metadata.name,
    'KEDA\'s HPA does not take the name of hpa.yaml\'s');
  assert.deepEqual(spec.triggers.map((t) => [t.type, t.metricType]),
    [['prometheus', 'AverageValue'], ['prometheus', 'AverageValue']]);
});

test('the ScaledObject\'s metrics are gauges of /metrics', async () => {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const names = scaledObject.spec.triggers.flatMap((t) => t.metadata.query.match(/attnd_[a-z_]+/g));
  assert.deepEqual(names.sort(), ['attnd_in_flight_requests', 'attnd_queue_depth']);
  for (const name of names) assert.match(text, new RegExp(`^# TYPE ${name} gauge$`, 'm'));
});

test('Prometheus answers the ScaledObject\'s queries: 0 when idle, the queue and the requests in flight under load', async () => {
  // One compute thread and four clients each posting a forward and backward
  // pass: one computes, three wait, while 1 s scrapes look on.
  const busy = await startAttnd(['--threads', '1']);
  const port = await freePort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'attnd-keda-'));
  fs.writeFileSync(path.join(dir, 'prometheus.yml'), YAML.stringify({
    global: { scrape_interval: '1s' },
    scrape_configs: [{ job_name: 'attnd', static_configs: [{ targets: [`127.0.0.1:${busy.port}`] }] }],
  }));
  const prom = spawn('prometheus', [`--config.file=${path.join(dir, 'prometheus.yml')}`,
    `--storage.tsdb.path=${path.join(dir, 'data')}`, `--web.listen-address=127.0.0.1:${port}`], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  prom.stderr.on('data', (d) => { log += d; });
  const ask = async (query) => {
    try {
      const r = await (await fetch(`http://127.0.0.1:${port}/api/v1/query?query=${encodeURIComponent(query)}`)).json();
      return r.status === 'success' && r.data.result.length === 1 ? Number(r.data.result[0].value[1]) : null;
    } catch { return null; }
  };
  const [queue, inFlight] = ['queue-depth', 'in-flight'].map((n) => scaledObject.spec.triggers.find((t) => t.name === n).metadata.query);
  /** Polls until every query's value passes its check; returns the values. */
  const until = async (checks, seconds) => {
    let got = [];
    for (let t = 0; t < seconds * 4; t++) {
      got = await Promise.all(checks.map(([q]) => ask(q)));
      if (got.every((v, i) => v !== null && checks[i][1](v))) return got;
      await sleep(250);
    }
    assert.fail(`Prometheus answered ${JSON.stringify(got)} (log: ${log.slice(-300)})`);
  };
  try {
    // Idle, and scraped: the scrape itself (route /metrics) is not load.
    await until([[queue, (v) => v === 0], [inFlight, (v) => v === 0], ['up', (v) => v === 1]], 30);
    const n = 1536, d = 64, h = 8;
    const t = { shape: [h, n, d], dtype: 'float32', base64: Buffer.from(new Float32Array(h * n * d).fill(0.01).buffer).toString('base64') };
    const body = JSON.stringify({ q: t, k: t, v: t, grad_output: t, output_encoding: 'base64' });
    // Four clients post again and again until Prometheus has seen the load:
    // however fast this machine computes, some scrape falls inside it. Only
    // the statuses are kept: each answer carries 16 MB of gradients.
    let loaded = true;
    const statuses = [];
    const client = async () => { while (loaded) statuses.push((await post(`${busy.url}/v1/attention`, body)).status); };
    const load = Promise.all([0, 1, 2, 3].map(client));
    let q, f;
    try {
      [q, f] = await until([[queue, (v) => v >= 1], [inFlight, (v) => v >= 2]], 20);
    } finally {
      loaded = false;
      await load;
    }
    assert.ok(statuses.every((s) => s === 200), `the load answered ${statuses}`);
    await until([[queue, (v) => v === 0], [inFlight, (v) => v === 0]], 10);
    console.log(`# under load: queue-depth query ${q}, in-flight query ${f}; idle again: 0 and 0`);
  } finally {
    prom.kill('SIGTERM');
    await new Promise((r) => prom.on('exit', r));
    fs.rmSync(dir, { recursive: true, force: true });
    assert.equal(await busy.stop(), 0);
  }
});

/** A Kubernetes structural schema as JSON Schema for Ajv, refusing unknown
 * fields as the API server does with strict field validation (kubectl's
 * default): every object with properties gets additionalProperties false,
 * except where the schema says x-kubernetes-preserve-unknown-fields. */
function strictSchema(node) {
  if (Array.isArray(node)) return node.map(strictSchema);
  if (!node || typeof node !== 'object') return node;
  const out = Object.fromEntries(Object.entries(node).map(([k, v]) => [k, k === 'properties'
    ? Object.fromEntries(Object.entries(v).map(([name, sub]) => [name, strictSchema(sub)])) : strictSchema(v)]));
  if (out.properties && out.additionalProperties === undefined && !out['x-kubernetes-preserve-unknown-fields']) out.additionalProperties = false;
  return out;
}

test('docker/k8s/kserve/: an InferenceService valid against the schema of KServe\'s CRD', (t) => {
  if (!KSERVE_CRD) {
    t.skip('no KServe CRD (set ATTND_KSERVE_CRD to config/crd/full/serving.kserve.io_inferenceservices.yaml of kserve/kserve)');
    return;
  }
  assert.deepEqual(kserve.map((o) => o.kind), ['InferenceService']);
  const isvc = kserve[0];
  const crd = YAML.parse(fs.readFileSync(KSERVE_CRD, 'utf8'));
  assert.equal(isvc.apiVersion, `${crd.spec.group}/v1beta1`);
  assert.equal(isvc.kind, crd.spec.names.kind);
  const version = crd.spec.versions.find((v) => v.name === 'v1beta1');
  const Ajv = requireNodeDep('ajv');
  const ajv = new Ajv({ strict: false, allErrors: true, validateFormats: false });
  const validate = ajv.compile(strictSchema(version.schema.openAPIV3Schema));
  assert.ok(validate(isvc), `InferenceService: ${ajv.errorsText(validate.errors)}`);
  // Not a rubber stamp: an unknown field, a wrong type, a value out of its
  // enum and a container without its name are refused.
  const breakers = {
    'an unknown field': (o) => { o.spec.predictor.containers[0].readinessProbe.httpGet.paht = '/'; },
    'a wrong type': (o) => { o.spec.predictor.minReplicas = 'none'; },
    'a value out of its enum': (o) => { o.spec.predictor.scaleMetric = 'queue'; },
    'a container without a name': (o) => { delete o.spec.predictor.containers[0].name; },
  };
  for (const [what, breakIt] of Object.entries(breakers)) {
    const broken = structuredClone(isvc);
    breakIt(broken);
    assert.equal(validate(broken), false, `${what} is refused`);
  }
});

test('the InferenceService: a custom container speaking protocol v2, probed on /v2/health, as the Deployment runs attnd', () => {
  const isvc = kserve[0], p = isvc.spec.predictor, c = p.containers[0];
  const d = k8s.Deployment.spec.template.spec, dc = d.containers[0];
  assert.equal(p.containers.length, 1);
  assert.equal(c.name, 'kserve-container');
  assert.equal(c.env.find((e) => e.name === 'PROTOCOL').value, 'v2');
  assert.equal(c.readinessProbe.httpGet.path, '/v2/health/ready');
  assert.equal(c.livenessProbe.httpGet.path, '/v2/health/live');
  const port = c.ports[0].containerPort;
  assert.equal(String(port), c.env.find((e) => e.name === 'ATTND_PORT').value);
  assert.equal(c.readinessProbe.httpGet.port, port);
  assert.equal(c.livenessProbe.httpGet.port, port);
  assert.equal(c.image, dc.image);
  assert.deepEqual(c.resources, dc.resources);
  assert.deepEqual(c.securityContext, dc.securityContext);
  assert.deepEqual(p.securityContext, d.securityContext);
  assert.equal(c.env.find((e) => e.name === 'ATTND_BIND').value, '0.0.0.0');
  assert.equal(p.scaleMetric, 'concurrency');
  assert.equal(p.scaleTarget, Number(dc.resources.limits.cpu), 'the concurrency target is the compute threads');
});

test('the InferenceService\'s probes answer 200 on a running attnd', async (t) => {
  const probes = [kserve[0].spec.predictor.containers[0].readinessProbe, kserve[0].spec.predictor.containers[0].livenessProbe];
  if ((await fetch(`${server.url}/v2`)).status === 404) {
    t.skip('this attnd does not serve /v2 (the Open Inference Protocol routes)');
    return;
  }
  for (const p of probes) assert.equal((await fetch(`${server.url}${p.httpGet.path}`)).status, 200, p.httpGet.path);
});

test('docker/k8s/ingress/: Services and Ingresses valid against their schemas, caches by a consistent hash of the id', () => {
  const { Service } = requireNodeDep('kubernetes-models/v1');
  const { Ingress } = requireNodeDep('kubernetes-models/networking.k8s.io/v1');
  const services = ingress.filter((o) => o.kind === 'Service'), ingresses = ingress.filter((o) => o.kind === 'Ingress');
  assert.equal(services.length + ingresses.length, ingress.length);
  for (const s of services) {
    assert.doesNotThrow(() => new Service(s).validate(), s.metadata.name);
    assert.ok(selects(s.spec.selector), `${s.metadata.name} selects the Deployment's pods`);
    assert.deepEqual(s.spec.ports, k8s.Service.spec.ports, 'the same endpoints: the same hash ring');
  }
  for (const i of ingresses) assert.doesNotThrow(() => new Ingress(i).validate(), i.metadata.name);
  const broken = structuredClone(ingresses[0]);
  broken.spec.rules[0].http.paths[0].backend.service.port = 8080;
  assert.throws(() => new Ingress(broken).validate());

  // Which backend answers a path, as ingress-nginx chooses: Exact, then the
  // longest regex (with use-regex on the host every path is a regex).
  const paths = ingresses.flatMap((i) => i.spec.rules[0].http.paths.map((p) => ({ ...p, ingress: i })));
  const route = (url) => paths.find((p) => p.pathType === 'Exact' && p.path === url)
    ?? paths.filter((p) => p.pathType !== 'Exact').sort((a, b) => b.path.length - a.path.length)
      .find((p) => new RegExp(`^${p.path}`, 'i').test(url));
  const known = new Set([k8s.Service.metadata.name, ...services.map((s) => s.metadata.name)]);
  for (const p of paths) assert.ok(known.has(p.backend.service.name), p.backend.service.name);
  const hashKey = (url) => {
    const p = route(url), by = p.ingress.metadata.annotations?.['nginx.ingress.kubernetes.io/upstream-hash-by'];
    if (!by) return { service: p.backend.service.name, key: null };
    const groups = new RegExp(`^${p.path}`, 'i').exec(url);
    return { service: p.backend.service.name, key: by.replace(/\$(\d+)/g, (_, g) => groups[Number(g)]) };
  };
  assert.deepEqual(hashKey('/v1/attention'), { service: 'attnd', key: null }, 'stateless: round robin');
  assert.deepEqual(hashKey('/v2/models/attention/infer'), { service: 'attnd', key: null });
  for (const url of ['/v1/caches/Zm9vYmFy-_09', '/v1/caches/Zm9vYmFy-_09/attention'])
    assert.deepEqual(hashKey(url), { service: 'attnd-caches', key: 'Zm9vYmFy-_09' }, url);
  assert.deepEqual(hashKey('/v1/caches'), { service: 'attnd-cache-create', key: '$request_id' },
    'creation is hashed on nginx\'s fresh 128-bit $request_id');
  // ... which is the X-Cache-Id attnd names the new cache by, and only there.
  const snippet = (i) => i.metadata.annotations?.['nginx.ingress.kubernetes.io/configuration-snippet'] ?? '';
  assert.match(snippet(route('/v1/caches').ingress), /^\s*proxy_set_header\s+X-Cache-Id\s+\$request_id\s*;\s*$/m,
    'POST /v1/caches sends the key it was hashed on as X-Cache-Id');
  for (const url of ['/v1/attention', '/v1/caches/Zm9vYmFy-_09/attention'])
    assert.doesNotMatch(snippet(route(url).ingress), /X-Cache-Id/i, `${url} carries no X-Cache-Id`);
  const hashed = ingresses.filter((i) => i.metadata.annotations?.['nginx.ingress.kubernetes.io/upstream-hash-by']);
  assert.equal(new Set(hashed.map((i) => i.spec.rules[0].http.paths[0].backend.service.name)).size, hashed.length,
    'one Service per hash key: ingress-nginx keeps one balancer per Service');
  for (const i of hashed) assert.doesNotMatch(i.metadata.annotations['nginx.ingress.kubernetes.io/proxy-next-upstream'], /http_503/,
    'a cache\'s 503 is its own answer, not a reason to try a replica without the cache');
});
