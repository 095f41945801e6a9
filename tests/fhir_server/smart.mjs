// SMART Backend Services for the test FHIR server: registered clients, the client-credentials token exchange with
// a signed client assertion (RFC 7523 as profiled by SMART App Launch 2, "asymmetric client authentication"),
// scopes and bearer tokens. Node's crypto verifies the signatures; no JOSE library.
import crypto from 'node:crypto';

const ALGORITHMS = { RS384: 'rsa', ES384: 'ec' }; // JWS alg -> the key type it needs
const ASSERTION_TYPE = 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer';
const MAX_ASSERTION_LIFETIME_S = 300;

/** A refused token request: `error` is the OAuth error code (invalid_client answers 401, the others 400). */
export class OAuthError extends Error {
  constructor(error, description) {
    super(description);
    this.error = error;
  }
}

/** `system/Observation.rs` (v2), `system/*.read` (v1), `patient/...`, `user/...` -> {context, type, perms} or null. */
export function parseScope(text) {
  const match = /^(system|user|patient)\/([A-Za-z]+|\*)\.(read|write|\*|c?r?u?d?s?)$/.exec(text);
  if (!match || !match[3]) return null;
  const perms = { read: 'rs', write: 'cud', '*': 'cruds' }[match[3]] ?? match[3];
  return { context: match[1], type: match[2], perms };
}

const covers = (held, wanted) => held.context === wanted.context
  && (held.type === '*' || held.type === wanted.type) && [...wanted.perms].every((p) => held.perms.includes(p));

/** Whether a token's grant allows `perm` ('r' read, 's' search) on a resource type (the launch context is ignored). */
export const allows = (grant, type, perm) => grant.scopes.some(
  (scope) => (scope.type === '*' || scope.type === type) && scope.perms.includes(perm));

const decode = (part) => JSON.parse(Buffer.from(part, 'base64url').toString('utf8'));

export class SmartAuth {
  /** @param tokenUrl - a function giving the token endpoint's URL, the `aud` every assertion must carry */
  constructor(tokenUrl) {
    this.tokenUrl = tokenUrl;
    this.clients = new Map(); // client_id -> {jwks, scopes}
    this.tokens = new Map(); // access token -> {scopes, expiresAt (ms)}
    this.seenJti = new Set();
    this.ttlSeconds = 300;
  }

  register(clientId, jwks, scope) {
    this.clients.set(clientId, { jwks, scopes: String(scope ?? '').split(/\s+/).map(parseScope).filter(Boolean) });
  }

  /** A new bearer token for exactly these scopes. */
  issue(scopeText) {
    const token = crypto.randomBytes(32).toString('base64url');
    const scopes = scopeText.split(/\s+/).map(parseScope).filter(Boolean);
    this.tokens.set(token, { scopes, expiresAt: Date.now() + this.ttlSeconds * 1000 });
    return { access_token: token, token_type: 'bearer', expires_in: this.ttlSeconds, scope: scopeText };
  }

  /** The token endpoint: grants the requested scopes the client is registered for, or throws an OAuthError. */
  exchange(form) {
    if (form.get('grant_type') !== 'client_credentials') {
      throw new OAuthError('unsupported_grant_type', 'grant_type must be client_credentials');
    }
    if (form.get('client_assertion_type') !== ASSERTION_TYPE) {
      throw new OAuthError('invalid_client', 'client_assertion_type must be jwt-bearer');
    }
    const client = this.verify(form.get('client_assertion'));
    const granted = (form.get('scope') ?? '').split(/\s+/).filter((text) => {
      const wanted = parseScope(text);
      return wanted && client.scopes.some((held) => covers(held, wanted));
    });
    if (!granted.length) throw new OAuthError('invalid_scope', 'none of the requested scopes is granted');
    return this.issue(granted.join(' '));
  }

  /** Checks a client assertion in the order a server must: signature by a registered key, then the claims. */
  verify(assertion) {
    const parts = String(assertion ?? '').split('.');
    let header;
    let claims;
    try {
      [header, claims] = [decode(parts[0]), decode(parts[1])];
    } catch {
      // not base64url JSON: refused below
    }
    if (parts.length !== 3 || typeof header !== 'object' || typeof claims !== 'object' || !header || !claims) {
      throw new OAuthError('invalid_client', 'client_assertion is not a JWS');
    }
    const keyType = ALGORITHMS[header.alg];
    if (!keyType) throw new OAuthError('invalid_client', `alg ${header.alg} not accepted`);
    const client = this.clients.get(claims.iss);
    if (!client || claims.sub !== claims.iss) throw new OAuthError('invalid_client', 'iss/sub: no registered client');
    const jwk = header.kid && client.jwks.keys?.find((key) => key.kid === header.kid);
    if (!jwk || (jwk.alg && jwk.alg !== header.alg)) throw new OAuthError('invalid_client', 'kid names no key for alg');
    if (!verifySignature(jwk, keyType, parts)) throw new OAuthError('invalid_client', 'signature does not verify');

    const audiences = Array.isArray(claims.aud) ? claims.aud : [claims.aud];
    if (!audiences.includes(this.tokenUrl())) throw new OAuthError('invalid_client', 'aud is not the token endpoint');
    const now = Date.now() / 1000;
    if (typeof claims.exp !== 'number' || claims.exp <= now) throw new OAuthError('invalid_client', 'no valid exp');
    if (claims.exp > now + MAX_ASSERTION_LIFETIME_S) throw new OAuthError('invalid_client', 'exp > 5 min ahead');
    const jti = `${claims.iss} ${claims.jti}`;
    if (!claims.jti || this.seenJti.has(jti)) throw new OAuthError('invalid_client', 'jti missing or already used');
    this.seenJti.add(jti);
    return client;
  }

  /** The grant of a live bearer token from an Authorization header, else null. */
  grantFor(authorization) {
    const match = /^Bearer\s+(\S+)$/i.exec(authorization ?? '');
    const grant = match && this.tokens.get(match[1]);
    return grant && grant.expiresAt > Date.now() ? grant : null;
  }

  expireAll() {
    this.tokens.forEach((grant) => { grant.expiresAt = Date.now() - 1; });
  }
}

/** JWS signatures: RS384 is PKCS#1 v1.5 over SHA-384; ES384 is raw r||s (IEEE P1363), not DER. */
function verifySignature(jwk, keyType, [header, payload, signature]) {
  try {
    const key = crypto.createPublicKey({ key: jwk, format: 'jwk' });
    if (key.asymmetricKeyType !== keyType) return false;
    const options = keyType === 'ec' ? { key, dsaEncoding: 'ieee-p1363' } : key;
    return crypto.verify('sha384', Buffer.from(`${header}.${payload}`), options, Buffer.from(signature, 'base64url'));
  } catch {
    return false;
  }
}
