// One WebSocket session to ThingsBoard's WebSocket API (/api/ws) for the whole console:
// authCmd first, then TIMESERIES subscriptions; each update goes to its subscriber. The
// session reopens (and resubscribes) after it drops.
import { session } from './api';

export type Series = Record<string, [number, string][]>;
type Handler = (data: Series) => void;

interface Sub { cmd: Record<string, unknown>; handler: Handler }

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
  };
  s.onclose = () => {
    open = false;
    if (ws === s) ws = null;
    if (subs.size > 0 && session.token()) setTimeout(() => { if (!ws && subs.size > 0) connect(); }, 1000);
  };
}

/** Subscribes to a device's time series (all keys), optionally with a window of past points; returns the unsubscribe. */
export function subscribeTimeseries(deviceId: string, handler: Handler, timeWindow?: number): () => void {
  const id = nextId++;
  const cmd: Record<string, unknown> = { type: 'TIMESERIES', entityType: 'DEVICE', entityId: deviceId };
  if (timeWindow) { cmd.timeWindow = timeWindow; cmd.limit = 1000; }
  subs.set(id, { cmd, handler });
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
