// One WebSocket session to ThingsBoard's WebSocket API (/api/ws) for the whole console:
// authCmd first, then TIMESERIES and ALARM_DATA subscriptions; each update goes to its
// subscriber.
//
// Each socket has its own state (a command is sent on a socket only once it is open and
// authenticated; until then the subscriptions wait in `subs` and go with the authCmd). The
// session reopens after it drops, with a growing pause, and subscribes again; a renewed
// access token is sent on the open session as a new authCmd, and a session the server ended
// for its token reopens with a renewed one. Its state (`useLiveStatus`) drives the notice
// the console shows while live data is stopped.
import { useEffect, useState } from 'preact/hooks';
import { session, type EntityId, type Page } from './api';

export type Series = Record<string, [number, string][]>;
type Handler = (data: Series) => void;
type OnError = (message: string) => void;

/** What the server sends for a subscription: TIMESERIES updates name it `subscriptionId`, ALARM_DATA answers `cmdId`. */
interface Update {
  subscriptionId?: number; cmdId?: number; errorCode?: number; errorMsg?: string; data?: unknown; update?: unknown;
  /** ALARM_DATA: how many entities the query selected, and of how many at most the alarms are looked at. */
  totalEntities?: number; allowedEntities?: number;
}

/** A subscription: its command, the command that ends it, and where its updates go. */
interface Sub { cmd: Record<string, unknown>; end: Record<string, unknown>; onData: (u: Update) => void; onError?: OnError }

/** `idle`: nothing subscribed; `connecting`: the first socket is opening; `live`; `reconnecting`: it dropped and reopens. */
export type LiveStatus = 'idle' | 'connecting' | 'live' | 'reconnecting';

/** ThingsBoard's WebSocket error code for a missing, invalid or expired token. */
const UNAUTHORIZED = 3;
/** Pauses before reopening a dropped session: 1 s, doubling up to 10 s. */
const RETRY_FIRST_MS = 1000;
const RETRY_MAX_MS = 10_000;
/** How long the session stays open with nothing subscribed (a page change subscribes again at once). */
const LINGER_MS = 3000;

/** The socket and what is known of it. */
interface Conn { ws: WebSocket; ready: boolean }

let conn: Conn | null = null;
let nextId = 1;
const subs = new Map<number, Sub>();
let retryMs = RETRY_FIRST_MS;
let retryTimer: ReturnType<typeof setTimeout> | undefined;
let lingerTimer: ReturnType<typeof setTimeout> | undefined;
let status: LiveStatus = 'idle';
/** Set when the server refused the session's token (expired, revoked): the next session renews it first. */
let refused = false;
const watchers = new Set<(s: LiveStatus) => void>();

function setStatus(s: LiveStatus) {
  if (s === status) return;
  status = s;
  watchers.forEach((f) => f(s));
}

/** Sends on the current socket if it is open and authenticated; otherwise the subscriptions go with the next authCmd. */
function send(msg: unknown) {
  if (conn?.ready) conn.ws.send(JSON.stringify(msg));
}

const allCmds = () => [...subs.entries()].map(([id, sub]) => ({ ...sub.cmd, cmdId: id }));

function connect() {
  clearTimeout(retryTimer);
  retryTimer = undefined;
  const url = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/api/ws`;
  const c: Conn = { ws: new WebSocket(url), ready: false };
  conn = c;
  c.ws.onopen = async () => {
    // A token that is due (or that the server refused last time) is renewed first.
    const token = await session.fresh(refused);
    if (conn !== c) return;
    if (!token) { c.ws.close(); return; }
    refused = false;
    c.ws.send(JSON.stringify({ authCmd: { cmdId: 0, token }, cmds: allCmds() }));
    c.ready = true;
    retryMs = RETRY_FIRST_MS;
    setStatus('live');
  };
  c.ws.onmessage = (ev) => {
    if (conn !== c) return;
    let u: Update;
    try { u = JSON.parse(ev.data as string); } catch { return; }
    if (u.errorCode === UNAUTHORIZED) refused = true;
    const sub = subs.get(u.subscriptionId ?? u.cmdId ?? 0);
    if (sub && u.errorCode === 0) sub.onData(u);
    else if (sub) sub.onError?.(String(u.errorMsg ?? `error ${u.errorCode}`));
  };
  c.ws.onclose = () => {
    if (conn !== c) return;
    conn = null;
    if (subs.size === 0 || !session.token()) { setStatus('idle'); return; }
    setStatus('reconnecting');
    const wait = retryMs;
    retryMs = Math.min(RETRY_MAX_MS, retryMs * 2);
    retryTimer = setTimeout(() => { if (!conn && subs.size > 0 && session.token()) connect(); }, wait);
  };
}

// A renewed token goes to the open session; one still opening takes it with its authCmd.
session.onToken((token) => { send({ authCmd: { cmdId: 0, token } }); });

/** Sends `cmd` (with its own cmdId) now or with the next authCmd; returns the unsubscribe, which sends `end`. */
function subscribe(sub: Sub): () => void {
  const id = nextId++;
  subs.set(id, sub);
  clearTimeout(lingerTimer);
  if (conn) send({ cmds: [{ ...sub.cmd, cmdId: id }] });
  else if (retryTimer === undefined) { setStatus(status === 'reconnecting' ? status : 'connecting'); connect(); }
  return () => {
    if (!subs.delete(id)) return;
    send({ cmds: [{ ...sub.end, cmdId: id }] });
    if (subs.size === 0) {
      clearTimeout(lingerTimer);
      lingerTimer = setTimeout(() => { if (subs.size === 0) closeLive(); }, LINGER_MS);
    }
  };
}

/** Subscribes to a device's time series (all keys), optionally with a window of past points; returns the unsubscribe. */
export function subscribeTimeseries(deviceId: string, handler: Handler, timeWindow?: number, onError?: OnError): () => void {
  const cmd: Record<string, unknown> = { type: 'TIMESERIES', entityType: 'DEVICE', entityId: deviceId };
  if (timeWindow) { cmd.timeWindow = timeWindow; cmd.limit = 1000; }
  return subscribe({ cmd, end: { type: 'TIMESERIES', unsubscribe: true }, onData: (u) => handler((u.data ?? {}) as Series), onError });
}

/** Ends the session and forgets every subscription (logging out). */
export function closeLive() {
  subs.clear();
  clearTimeout(retryTimer);
  retryTimer = undefined;
  clearTimeout(lingerTimer);
  const c = conn;
  conn = null;
  c?.ws.close();
  retryMs = RETRY_FIRST_MS;
  setStatus('idle');
}

/** The live session's state, kept current. */
export function useLiveStatus(): LiveStatus {
  const [s, setS] = useState(status);
  useEffect(() => {
    setS(status);
    watchers.add(setS);
    return () => { watchers.delete(setS); };
  }, []);
  return s;
}

export type Points = Record<string, [number, number][]>;
export type Latest = Record<string, [number, string]>;

/** State folded from a device's time-series updates (reset when the device changes), or the server's refusal. */
function useFolded<T>(deviceId: string, empty: () => T, fold: (old: T, data: Series) => T, timeWindow?: number): { value: T; error: string | null } {
  const [value, setValue] = useState<T>(empty);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    setValue(empty());
    setError(null);
    return subscribeTimeseries(deviceId, (data) => { setError(null); setValue((old) => fold(old, data)); }, timeWindow, setError);
  }, [deviceId, timeWindow]);
  return { value, error };
}

/** The numeric points of a device's time series over the last `windowMs`, kept live (at most `max` per key), or the server's refusal. */
export function useLivePoints(deviceId: string, windowMs: number, max = 1000): { points: Points; error: string | null } {
  const { value, error } = useFolded<Points>(deviceId, () => ({}), (old, data) => {
    const next = { ...old };
    const since = Date.now() - windowMs;
    for (const [k, pts] of Object.entries(data)) {
      const nums = pts.map(([ts, v]) => [ts, Number(v)] as [number, number]).filter(([, v]) => Number.isFinite(v));
      if (nums.length === 0) continue;
      // A resubscription (after a reconnect) sends the window again: points already held are not doubled.
      const merged = new Map([...(next[k] ?? []), ...nums].map((p) => [p[0], p]));
      next[k] = [...merged.values()].filter(([ts]) => ts >= since).sort((a, b) => a[0] - b[0]).slice(-max);
    }
    return next;
  }, windowMs);
  return { points: value, error };
}

/** The newest value of each of a device's time series keys, kept live, or the server's refusal. */
export function useLatest(deviceId: string): { latest: Latest; error: string | null } {
  const { value, error } = useFolded<Latest>(deviceId, () => ({}), (old, data) => {
    const next = { ...old };
    for (const [k, pts] of Object.entries(data)) {
      const newest = pts.reduce((a, b) => (b[0] > a[0] ? b : a), pts[0]);
      if (newest && (!next[k] || newest[0] >= next[k][0])) next[k] = newest;
    }
    return next;
  });
  return { latest: value, error };
}

/** An alarm as `ALARM_DATA` sends it: ThingsBoard's `AlarmInfo` with its entity and that entity's latest values. */
export interface AlarmRow {
  id: EntityId; createdTime: number; type: string; severity: string; status: string;
  acknowledged: boolean; cleared: boolean; originator: EntityId; originatorName?: string | null; originatorLabel?: string | null;
  startTs?: number; endTs?: number; ackTs?: number; clearTs?: number; details?: unknown;
  assignee?: { email?: string | null } | null; entityId?: EntityId;
  latest?: Record<string, Record<string, { ts: number; value: string }>>;
}

/**
 * ThingsBoard's `AlarmDataQuery` (the `query` of an `ALARM_DATA` command): the entities
 * (`entityFilter`, as a dashboard's entity alias has it) and, in `pageLink`, the page, the
 * order and the status, severity and type filters.
 */
export interface AlarmQuery {
  entityFilter: Record<string, unknown>;
  pageLink: {
    page: number; pageSize: number; textSearch?: string | null; timeWindow?: number;
    sortOrder: { key: { type: 'ALARM_FIELD'; key: string }; direction: 'ASC' | 'DESC' };
    statusList?: string[]; severityList?: string[]; typeList?: string[]; searchPropagatedAlarms?: boolean;
  };
  alarmFields?: { type: 'ALARM_FIELD'; key: string }[];
  entityFields?: { type: 'ENTITY_FIELD'; key: string }[];
  latestValues?: { type: 'TIME_SERIES' | 'ATTRIBUTE'; key: string }[];
}

/** How many entities an alarm query selected, and of how many at most their alarms are looked at (ThingsBoard's limit per query). */
export interface Entities { total: number; allowed: number }

/**
 * Subscribes to a page of alarms (`ALARM_DATA`): the handler gets the whole page at once and
 * each time the server answers again (an alarm raised, acknowledged, cleared, …). A server
 * that sends only the changed alarms (`update`, as ThingsBoard does) has them merged into
 * the page held. Returns the unsubscribe.
 */
export function subscribeAlarms(query: AlarmQuery, handler: (page: Page<AlarmRow>, entities: Entities) => void, onError?: OnError): () => void {
  let held: Page<AlarmRow> | null = null;
  let entities: Entities = { total: 0, allowed: 0 };
  const onData = (u: Update) => {
    const page = u.data as Page<AlarmRow> | null | undefined;
    if (page && Array.isArray(page.data)) held = page;
    else if (held && Array.isArray(u.update)) {
      const changed = new Map((u.update as AlarmRow[]).map((a) => [a.id.id, a]));
      held = { ...held, data: held.data.map((a) => changed.get(a.id.id) ?? a) };
    } else return;
    if (u.totalEntities !== undefined) entities = { total: u.totalEntities, allowed: u.allowedEntities ?? u.totalEntities };
    handler(held, entities);
  };
  return subscribe({ cmd: { type: 'ALARM_DATA', query }, end: { type: 'ALARM_DATA_UNSUBSCRIBE' }, onData, onError });
}

/**
 * A page of alarms kept live (`ALARM_DATA`), or the server's refusal; `query` null: none
 * (nothing subscribed). A new query (another page, filter or order) subscribes afresh; the
 * page shown stays until the new one arrives, and `current` says whether it has. `entities`:
 * how many entities the query selected, and of how many the alarms are looked at.
 */
export function useLiveAlarms(query: AlarmQuery | null): { page: Page<AlarmRow> | null; entities: Entities | null; error: string | null; current: boolean } {
  const key = query ? JSON.stringify(query) : '';
  const [got, setGot] = useState<{ key: string; page: Page<AlarmRow>; entities: Entities } | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    setError(null);
    if (!query) { setGot(null); return undefined; }
    return subscribeAlarms(query, (page, entities) => { setError(null); setGot({ key, page, entities }); }, setError);
  }, [key]);
  return { page: got?.page ?? null, entities: got?.entities ?? null, error, current: got !== null && got.key === key };
}
