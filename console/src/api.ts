// The REST API as the console uses it: ThingsBoard's paths, the JWT in X-Authorization, and
// errors carried as ApiError with the server's message.

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
  constructor(readonly status: number, message: string) { super(message); }
}

const TOKEN = 'gridlinks.token';
let token: string | null = sessionStorage.getItem(TOKEN);
let onLogout: () => void = () => {};

export const session = {
  token: () => token,
  set(t: string | null) {
    token = t;
    if (t) sessionStorage.setItem(TOKEN, t); else sessionStorage.removeItem(TOKEN);
  },
  /** Called when the server says the token is no longer good (401). */
  onLogout(f: () => void) { onLogout = f; },
};

export async function api<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { accept: 'application/json' };
  if (body !== undefined) headers['content-type'] = 'application/json';
  if (token) headers['x-authorization'] = `Bearer ${token}`;
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await r.text();
  let json: unknown = null;
  try { json = text ? JSON.parse(text) : null; } catch { json = text; }
  if (!r.ok) {
    if (r.status === 401 && token) { session.set(null); onLogout(); }
    const msg = (json && typeof json === 'object' && 'message' in json) ? String((json as { message: unknown }).message) : text;
    throw new ApiError(r.status, msg || `${r.status} ${r.statusText}`);
  }
  return json as T;
}

export const get = <T>(path: string) => api<T>('GET', path);
export const post = <T>(path: string, body?: unknown) => api<T>('POST', path, body ?? {});
export const del = (path: string) => api('DELETE', path);

export async function login(username: string, password: string): Promise<void> {
  const r = await api<{ token: string }>('POST', '/api/auth/login', { username, password });
  session.set(r.token);
}

export async function logout(): Promise<void> {
  try { await api('POST', '/api/auth/logout'); } catch { /* the token goes anyway */ }
  session.set(null);
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
