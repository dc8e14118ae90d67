// The REST API as the console uses it: ThingsBoard's paths, the JWT in X-Authorization, and
// errors carried as ApiError with the server's message. The login's access token is renewed
// with its refresh token before it expires (and when the server says it has), so a page
// left open keeps working; when renewal is refused the login is over (`session.onExpired`).

export interface EntityId { id: string; entityType?: string }
export interface Page<T> { data: T[]; totalPages: number; totalElements: number; hasNext: boolean }
export interface Device {
  id: EntityId; name: string; type: string; label?: string | null; createdTime: number;
  customerId?: EntityId | null; additionalInfo?: Record<string, unknown> | null;
}
export interface User {
  id: EntityId; email: string; authority: 'SYS_ADMIN' | 'TENANT_ADMIN' | 'CUSTOMER_USER';
  firstName?: string | null; lastName?: string | null; customerId?: EntityId | null; tenantId?: EntityId | null;
}
export interface Customer {
  id: EntityId; title: string; email?: string | null; phone?: string | null; country?: string | null; city?: string | null;
  address?: string | null; createdTime: number;
}
export interface Attribute { key: string; value: unknown; lastUpdateTs: number }

export class ApiError extends Error {
  /** `explained`: the server's answer said why (a message in its body), not just its status. */
  constructor(readonly status: number, message: string, readonly explained = true) { super(message); }
}

const TOKEN = 'gridlinks.token';
const REFRESH = 'gridlinks.refreshToken';
/** When the access token arrived (ms, this browser's clock): a reloaded page renews on time too. */
const RECEIVED = 'gridlinks.tokenReceived';
let token: string | null = sessionStorage.getItem(TOKEN);
let refreshToken: string | null = sessionStorage.getItem(REFRESH);
/** When the access token should be renewed (ms, this browser's clock), 0 when unknown. */
let renewAt = 0;
let renewTimer: ReturnType<typeof setTimeout> | undefined;
let refreshing: Promise<Renewal> | null = null;
let onExpired: () => void = () => {};
const onToken = new Set<(t: string) => void>();

/** What asking for a new token pair came to. */
type Renewal = 'renewed' | 'refused' | 'unreachable';

/** The `iat` and `exp` claims (seconds) of a JWT, if it has them. */
function claims(jwt: string): { iat?: number; exp?: number } {
  try {
    const b64 = jwt.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
    return JSON.parse(atob(b64)) as { iat?: number; exp?: number };
  } catch {
    return {};
  }
}

/**
 * Plans the renewal of a token that arrived at `received`: when three quarters of its
 * lifetime have passed, at most a minute before it ends. The lifetime is `exp - iat` as the
 * server wrote them, counted from its arrival on this browser's clock, so a clock set wrong
 * does not matter.
 */
function plan(jwt: string, received: number) {
  clearTimeout(renewTimer);
  const { iat, exp } = claims(jwt);
  if (!exp) { renewAt = 0; return; }
  const life = Math.max(1, exp - (iat ?? Math.floor(received / 1000)));
  const ahead = Math.min(60, life / 4);
  renewAt = received + (life - ahead) * 1000;
  renewTimer = setTimeout(() => void renewSoon(), Math.max(0, renewAt - Date.now()));
}

/** The planned renewal: retried every 5 s while the server cannot be reached. */
async function renewSoon() {
  if (!refreshToken) return;
  if ((await refresh()) === 'unreachable') renewTimer = setTimeout(() => void renewSoon(), 5000);
}

if (token) plan(token, Number(sessionStorage.getItem(RECEIVED)) || 0);

export const session = {
  token: () => token,
  /** Keeps a login: its access token and the refresh token that renews it. */
  set(t: string | null, refresh: string | null = null) {
    token = t;
    refreshToken = t ? refresh : null;
    const now = Date.now();
    if (t) sessionStorage.setItem(TOKEN, t); else sessionStorage.removeItem(TOKEN);
    if (refreshToken) sessionStorage.setItem(REFRESH, refreshToken); else sessionStorage.removeItem(REFRESH);
    if (t) sessionStorage.setItem(RECEIVED, String(now)); else sessionStorage.removeItem(RECEIVED);
    if (t) { plan(t, now); onToken.forEach((f) => f(t)); } else { clearTimeout(renewTimer); renewAt = 0; }
  },
  /** Called when the login is over and cannot be renewed (the server refused the refresh token, or there was none). */
  onExpired(f: () => void) { onExpired = f; },
  /** Called with each new access token (after a renewal): the live session authenticates again with it. */
  onToken(f: (t: string) => void): () => void { onToken.add(f); return () => { onToken.delete(f); }; },
  /** The access token, renewed first when it is due (or `force`); null when the login is over. */
  async fresh(force = false): Promise<string | null> {
    if (token && refreshToken && (force || (renewAt && Date.now() >= renewAt))) await refresh();
    return token;
  },
};

/**
 * A new token pair for the refresh token (ThingsBoard's `POST /api/auth/token`). One
 * request at a time: the server takes each refresh token once, and a second use of it
 * ends the login. A refusal ends the login here too (`onExpired`); an unreachable server
 * does not.
 */
export function refresh(): Promise<Renewal> {
  if (!refreshing) refreshing = renew().finally(() => { refreshing = null; });
  return refreshing;
}

async function renew(): Promise<Renewal> {
  const used = refreshToken;
  if (!used) { expire(); return 'refused'; }
  let r: Response;
  try {
    r = await fetch('/api/auth/token', {
      method: 'POST', headers: { accept: 'application/json', 'content-type': 'application/json' }, body: JSON.stringify({ refreshToken: used }),
    });
  } catch {
    return 'unreachable';
  }
  // Logged out (or in again) meanwhile: this answer is for a login that is gone.
  if (refreshToken !== used) return token ? 'renewed' : 'refused';
  if (r.ok) {
    const pair = (await r.json()) as { token: string; refreshToken: string };
    session.set(pair.token, pair.refreshToken);
    return 'renewed';
  }
  if (r.status === 401 || r.status === 400 || r.status === 403) { expire(); return 'refused'; }
  return 'unreachable';
}

function expire() {
  if (!token) return;
  session.set(null);
  onExpired();
}

export async function api<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
  let sent = await session.fresh();
  let r = await send(method, path, sent, body);
  // Expired or revoked: renewed once and sent again (a refused renewal ends the login).
  if (r.status === 401 && sent) {
    if (token === sent) await refresh();
    if (token && token !== sent) { sent = token; r = await send(method, path, sent, body); }
  }
  const text = await r.text();
  let json: unknown = null;
  try { json = text ? JSON.parse(text) : null; } catch { json = text; }
  if (!r.ok) {
    const msg = (json && typeof json === 'object' && 'message' in json) ? String((json as { message: unknown }).message) : text;
    throw new ApiError(r.status, msg || `${r.status} ${r.statusText}`, Boolean(msg));
  }
  return json as T;
}

function send(method: string, path: string, jwt: string | null, body?: unknown): Promise<Response> {
  const headers: Record<string, string> = { accept: 'application/json' };
  if (body !== undefined) headers['content-type'] = 'application/json';
  if (jwt) headers['x-authorization'] = `Bearer ${jwt}`;
  return fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
}

export const get = <T>(path: string) => api<T>('GET', path);
export const post = <T>(path: string, body?: unknown) => api<T>('POST', path, body ?? {});
export const del = (path: string) => api('DELETE', path);

/** How long a password check refused as busy (503: the server's password threads are all taken) is tried again. */
const BUSY_RETRY_MS = 30_000;

/** `f()`, tried again every second while the server answers 503 (busy), for up to BUSY_RETRY_MS. */
async function whileBusy<T>(f: () => Promise<T>): Promise<T> {
  const until = Date.now() + BUSY_RETRY_MS;
  for (;;) {
    try {
      return await f();
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 503 && Date.now() < until)) throw e;
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
}

export async function login(username: string, password: string): Promise<void> {
  const r = await whileBusy(() => api<{ token: string; refreshToken: string }>('POST', '/api/auth/login', { username, password }));
  session.set(r.token, r.refreshToken);
}

/** Sets the password of a new user from its activation link (ThingsBoard's `POST /api/noauth/activate`), which logs it in. */
export async function activate(activateToken: string, password: string): Promise<void> {
  const r = await whileBusy(() => api<{ token: string; refreshToken: string }>('POST', '/api/noauth/activate', { activateToken, password }));
  session.set(r.token, r.refreshToken);
}

export async function logout(): Promise<void> {
  const t = token;
  session.set(null);
  // Not through api(): an expired token is not renewed just to end its login.
  try { await send('POST', '/api/auth/logout', t, {}); } catch { /* the token goes anyway */ }
}

export const query = (params: Record<string, string | number | undefined | null>) =>
  Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== '')
    .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`).join('&');

/** A value typed into a form: JSON when it parses (numbers, booleans, objects), else text. */
export function typed(text: string): unknown {
  try { return JSON.parse(text); } catch { return text; }
}

/** ThingsBoard's "no customer" id. */
const NULL_UUID = '13814000-1dd2-11b2-8080-808080808080';

/** The customer a device is assigned to, '' for none. */
export function customerOf(d: Device | null): string {
  const id = d?.customerId?.id ?? '';
  return id === NULL_UUID ? '' : id;
}

export const fmtTime = (ms: number) => (ms ? new Date(ms).toLocaleString() : '');
