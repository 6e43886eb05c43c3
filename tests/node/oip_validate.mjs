// Validates attnd's /v2 answers against the Open Inference Protocol's own
// OpenAPI description with an OpenAPI response validator
// (openapi-response-validator, from build/node):
//
//   node tests/node/oip_validate.mjs open_inference_rest.yaml EXCHANGES.jsonl
//
// EXCHANGES.jsonl (written by tests/oip_client.py) holds one exchange a
// line: method, path, status and the JSON of the answer (for a binary
// answer, its JSON part). Each is matched to the protocol's operation (the
// description spells the paths with a model version, which attnd's models
// do not have) and validated as that operation's response: a 200 against
// its 200 schema, an error against the protocol's error object for the
// operation. The one change made to the description is the binary tensor
// data extension's: a response output whose data follows the JSON has
// "parameters": {"binary_data_size": N} in place of "data".
import fs from 'node:fs';
import { requireNodeDep } from './support.mjs';

const YAML = requireNodeDep('yaml');
const OpenAPIResponseValidator = requireNodeDep('openapi-response-validator').default;

const [specPath, exchangesPath] = process.argv.slice(2);
const spec = YAML.parse(fs.readFileSync(specPath, 'utf8'));

// The binary tensor data extension: data, or binary_data_size.
const output = spec.components.schemas.response_output;
output.required = output.required.filter((name) => name !== 'data');
output.anyOf = [
  { required: ['data'] },
  { required: ['parameters'], properties: { parameters: { type: 'object', required: ['binary_data_size'] } } },
];

const versioned = '/v2/models/${MODEL_NAME}/versions/${MODEL_VERSION}';
function operation(method, path) {
  const model = /^\/v2\/models\/[^/]+(\/ready|\/infer)?$/.exec(path);
  let key;
  if (path === '/v2') key = '/v2/';
  else if (path === '/v2/health/live' || path === '/v2/health/ready') key = path;
  else if (model) key = versioned + (model[1] ?? '');
  else return { error: 'inference_error_response' };
  const op = spec.paths[key][method.toLowerCase()];
  const errors = {
    '/v2/': 'metadata_server_error_response',
    [versioned]: 'metadata_model_error_response',
  };
  return { op, error: errors[key] ?? 'inference_error_response', key };
}

let failures = 0;
let count = 0;
const lines = fs.readFileSync(exchangesPath, 'utf8').split('\n').filter(Boolean);
for (const line of lines) {
  const { method, path, status, body } = JSON.parse(line);
  const { op, error, key } = operation(method, path);
  let responses;
  if (status === 200) {
    if (!op.responses['200'].content) {
      // The probes declare no body; theirs must still be JSON objects.
      responses = { 200: { description: 'OK', content: { 'application/json': { schema: { type: 'object' } } } } };
    } else {
      responses = op.responses;
    }
  } else {
    responses = { [status]: { description: 'error', content: { 'application/json': { schema: { $ref: `#/components/schemas/${error}` } } } } };
  }
  const validator = new OpenAPIResponseValidator({ responses, components: spec.components });
  const result = validator.validateResponse(status, body);
  count++;
  // An error answer must also be nothing but the protocol's error object.
  const extra = status !== 200 && (typeof body.error !== 'string' || Object.keys(body).length !== 1);
  if (result || extra) {
    failures++;
    console.log(`FAILED ${method} ${path} (${key ?? 'no operation'}) ${status}: ` +
                `${JSON.stringify(result?.errors ?? 'not {"error": "message"}')}\n  ${JSON.stringify(body).slice(0, 300)}`);
  }
}
console.log(`${count} /v2 answers validated against ${specPath.split('/').pop()}: ${failures} failure(s)`);
if (count === 0) failures++;
process.exit(failures ? 1 : 0);
