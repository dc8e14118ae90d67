// One WebSocket session to ThingsBoard's WebSocket API (/api/ws) for the whole console:
// authCmd first, then TIMESERIES subscriptions; each update goes to its subscriber. The
// session reopens (and resubscribes) after it drops.
import { useEffect, useState } from 'preact/hooks';
import { session } from './api';

export type Series = Record<string, [number, string][]>;
type Handler = (data: Series) => void;
type OnError = (message: string) => void;

interface Sub { cmd: Record<string, unknown>; handler: Handler; onError?: OnError }

let ws: WebSocket | null = null;
let open = false;
let nextId = 1;
const subs = new Map<number, Sub>();

function send(msg: unknown) {
  if (ws && open) ws.send(JSON.stringify(msg));
}

function connect() {
  const url = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/api/ws`;
  const s = new WebSocket(url);
  ws = s;
  s.onopen = () => {
    open = true;
    s.send(JSON.stringify({ authCmd: { cmdId: 0, token: session.token() }, cmds: [...subs.entries()].map(([id, sub]) => ({ ...sub.cmd, cmdId: id })) }));
  };
  s.onmessage = (ev) => {
    const u = JSON.parse(ev.data as string);
    const sub = subs.get(u.subscriptionId);
    if (sub && u.errorCode === 0) sub.handler(u.data as Series);
    else if (sub) sub.onError?.(String(u.errorMsg ?? `error ${u.errorCode}`));
  };
  s.onclose = () => {
    open = false;
    if (ws === s) ws = null;
    if (subs.size > 0 && session.token()) setTimeout(() => { if (!ws && subs.size > 0) connect(); }, 1000);
  };
}

/** Subscribes to a device's time series (all keys), optionally with a window of past points; returns the unsubscribe. */
export function subscribeTimeseries(deviceId: string, handler: Handler, timeWindow?: number, onError?: OnError): () => void {
  const id = nextId++;
  const cmd: Record<string, unknown> = { type: 'TIMESERIES', entityType: 'DEVICE', entityId: deviceId };
  if (timeWindow) { cmd.timeWindow = timeWindow; cmd.limit = 1000; }
  subs.set(id, { cmd, handler, onError });
  if (!ws) connect(); else send({ cmds: [{ ...cmd, cmdId: id }] });
  return () => {
    subs.delete(id);
    send({ cmds: [{ cmdId: id, type: 'TIMESERIES', unsubscribe: true }] });
    if (subs.size === 0 && ws) { ws.close(); ws = null; }
  };
}

export function closeLive() {
  subs.clear();
  ws?.close();
  ws = null;
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
    return subscribeTimeseries(deviceId, (data) => setValue((old) => fold(old, data)), timeWindow, setError);
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
      next[k] = [...(next[k] ?? []), ...nums].filter(([ts]) => ts >= since).sort((a, b) => a[0] - b[0]).slice(-max);
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
