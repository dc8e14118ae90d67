// One device: latest values and a live chart over the WebSocket API, its active alarms
// (live, with acknowledge and clear), history with a range and aggregation, attributes
// (shared and server ones editable), and RPC.
import { useEffect, useMemo, useState } from 'preact/hooks';
import { api, ApiError, del, fmtTime, get, post, query, typed, type Attribute, type Device, type User } from '../api';
import { ALARM_FIELDS, AlarmTable, alarmOrder } from '../alarms';
import { Chart, type Line } from '../chart';
import { ErrorBox, Pager, TableBox, useAction, useLoad } from '../components';
import { useLatest, useLiveAlarms, useLivePoints } from '../live';

const LIVE_WINDOW = 10 * 60_000;

export function DevicePage({ id, me }: { id: string; me: User }) {
  const device = useLoad(() => get<Device>(`/api/device/${id}`), [id]);
  if (device.error) return <ErrorBox error={device.error} />;
  if (!device.data) return <p aria-busy="true">Loading…</p>;
  const d = device.data;
  return (
    <section>
      <nav aria-label="breadcrumb"><ul><li><a href="#/devices">Devices</a></li><li>{d.name}</li></ul></nav>
      <h1>{d.name}</h1>
      <p>Type <strong>{d.type}</strong>{d.label ? <> · label <strong>{d.label}</strong></> : null} · created {fmtTime(d.createdTime)} · id <code>{d.id.id}</code></p>
      <Live id={id} />
      <ActiveAlarms id={id} />
      <History id={id} />
      <Attributes id={id} editable={me.authority !== 'SYS_ADMIN'} />
      <Rpc id={id} />
    </section>
  );
}

/** Latest values (one subscription) and the last ten minutes live (another, with a window). */
function Live({ id }: { id: string }) {
  const { latest, error } = useLatest(id);
  const { points } = useLivePoints(id, LIVE_WINDOW);
  const lines: Line[] = useMemo(() => Object.entries(points).map(([key, p]) => ({ key, points: p })), [points]);
  const keys = Object.keys(latest).sort();
  return (
    <article>
      <h2>Latest values</h2>
      <ErrorBox error={error} />
      {keys.length === 0 ? <p>No telemetry yet.</p> : (
        <TableBox label="Latest values">
          <table aria-label="Latest values">
            <thead><tr><th scope="col">Key</th><th scope="col">Value</th><th scope="col">Time</th></tr></thead>
            <tbody>{keys.map((k) => <tr key={k} data-key={k}><td>{k}</td><td class="value">{latest[k][1]}</td><td>{fmtTime(latest[k][0])}</td></tr>)}</tbody>
          </table>
        </TableBox>
      )}
      <h3>Live, last 10 minutes</h3>
      {lines.length === 0 ? <p>No numeric telemetry in the last 10 minutes.</p> : <Chart lines={lines} label="Live telemetry chart" />}
    </article>
  );
}

const ALARM_COLUMNS = ['createdTime', 'type', 'severity', 'status'].map((k) => ALARM_FIELDS[k]);

/** The device's active alarms, newest first, live (`ALARM_DATA` of this one device), with acknowledge, clear and comments. */
function ActiveAlarms({ id }: { id: string }) {
  const [page, setPage] = useState(0);
  const live = useLiveAlarms({
    entityFilter: { type: 'singleEntity', singleEntity: { entityType: 'DEVICE', id } },
    pageLink: { page, pageSize: 10, sortOrder: alarmOrder('createdTime', true), statusList: ['ACTIVE'] },
  });
  const total = live.page?.totalPages ?? 0;
  useEffect(() => { if (live.current && page > 0 && page >= total) setPage(Math.max(0, total - 1)); }, [live.current, page, total]);
  const alarms = live.page?.data ?? [];
  return (
    <article>
      <h2>Active alarms</h2>
      <ErrorBox error={live.error} />
      {/* Kept while empty: a comments dialog opened from it stays open when its alarm clears. */}
      <AlarmTable label="Active alarms" alarms={alarms} busy={!live.current && !live.error} columns={ALARM_COLUMNS} />
      {live.current && alarms.length === 0 && <p>No active alarms.</p>}
      {live.page && live.page.totalPages > 1 && <Pager page={page} totalPages={live.page.totalPages} total={live.page.totalElements} setPage={setPage} />}
    </article>
  );
}

const AGGS = ['NONE', 'AVG', 'MIN', 'MAX', 'SUM', 'COUNT'];
const toInput = (ms: number) => new Date(ms - new Date(ms).getTimezoneOffset() * 60_000).toISOString().slice(0, 16);

/** History over a chosen range, raw or aggregated (the REST API's `agg` and `interval`). */
function History({ id }: { id: string }) {
  const now = Date.now();
  const [from, setFrom] = useState(toInput(now - 24 * 3600_000));
  const [to, setTo] = useState(toInput(now + 60_000));
  const [agg, setAgg] = useState('NONE');
  const [intervals, setIntervals] = useState(100);
  const [lines, setLines] = useState<Line[] | null>(null);
  const action = useAction();
  const load = (e?: Event) => {
    e?.preventDefault();
    void action.run(async () => {
      const keys = await get<string[]>(`/api/plugins/telemetry/DEVICE/${id}/keys/timeseries`);
      if (keys.length === 0) { setLines([]); return; }
      const startTs = new Date(from).getTime();
      const endTs = new Date(to).getTime();
      if (!(endTs > startTs)) throw new Error('The end must be after the start.');
      const interval = Math.max(1, Math.ceil((endTs - startTs) / Math.max(1, intervals)));
      const q = query({ keys: keys.join(','), startTs, endTs, agg, interval: agg === 'NONE' ? undefined : interval, limit: agg === 'NONE' ? 10000 : undefined });
      const data = await get<Record<string, { ts: number; value: string }[]>>(`/api/plugins/telemetry/DEVICE/${id}/values/timeseries?${q}`);
      setLines(Object.entries(data).map(([key, pts]) => ({
        key,
        points: pts.map((p) => [p.ts, Number(p.value)] as [number, number]).filter(([, v]) => Number.isFinite(v)).sort((a, b) => a[0] - b[0]),
      })).filter((l) => l.points.length > 0));
    });
  };
  return (
    <article>
      <h2>History</h2>
      <form class="grid" onSubmit={load}>
        <label>From<input type="datetime-local" value={from} onInput={(e) => setFrom(e.currentTarget.value)} /></label>
        <label>To<input type="datetime-local" value={to} onInput={(e) => setTo(e.currentTarget.value)} /></label>
        <label>Aggregation
          <select value={agg} onChange={(e) => setAgg(e.currentTarget.value)}>{AGGS.map((a) => <option value={a}>{a}</option>)}</select>
        </label>
        <label>Intervals<input type="number" min={1} max={1000} value={intervals} disabled={agg === 'NONE'} onInput={(e) => setIntervals(Number(e.currentTarget.value))} /></label>
        <button type="submit" aria-busy={action.busy}>Show</button>
      </form>
      <ErrorBox error={action.error} />
      {lines && (lines.length === 0 ? <p>No numeric points in this range.</p> : <Chart lines={lines} label="History chart" />)}
    </article>
  );
}

const SCOPES = [['CLIENT_SCOPE', 'Client attributes'], ['SHARED_SCOPE', 'Shared attributes'], ['SERVER_SCOPE', 'Server attributes']] as const;

function Attributes({ id, editable }: { id: string; editable: boolean }) {
  return (
    <article>
      <h2>Attributes</h2>
      {SCOPES.map(([scope, title]) => <AttributeScope key={scope} id={id} scope={scope} title={title} editable={editable && scope !== 'CLIENT_SCOPE'} />)}
    </article>
  );
}

function AttributeScope({ id, scope, title, editable }: { id: string; scope: string; title: string; editable: boolean }) {
  const list = useLoad(() => get<Attribute[]>(`/api/plugins/telemetry/DEVICE/${id}/values/attributes/${scope}`), [id, scope]);
  const [key, setKey] = useState('');
  const [value, setValue] = useState('');
  const action = useAction();
  const save = (k: string, v: string) => action.run(async () => {
    await post(`/api/plugins/telemetry/DEVICE/${id}/attributes/${scope}`, { [k]: typed(v) });
    setKey('');
    setValue('');
    list.reload();
  });
  const remove = (k: string) => action.run(async () => {
    await del(`/api/plugins/telemetry/DEVICE/${id}/${scope}?keys=${encodeURIComponent(k)}`);
    list.reload();
  });
  const fid = `${scope}-form`;
  return (
    <section>
      <h3>{title}</h3>
      <ErrorBox error={list.error ?? action.error} />
      <TableBox label={title}><table aria-label={title}>
        <thead><tr><th scope="col">Key</th><th scope="col">Value</th><th scope="col">Updated</th>{editable && <th scope="col">Actions</th>}</tr></thead>
        <tbody>
          {(list.data ?? []).map((a) => (
            <tr key={a.key}>
              <td>{a.key}</td>
              <td>{typeof a.value === 'string' ? a.value : JSON.stringify(a.value)}</td>
              <td>{fmtTime(a.lastUpdateTs)}</td>
              {editable && <td class="actions">
                <button type="button" class="secondary outline" onClick={() => { setKey(a.key); setValue(typeof a.value === 'string' ? a.value : JSON.stringify(a.value)); }} aria-label={`Edit ${a.key}`}>Edit</button>
                <button type="button" class="contrast outline" onClick={() => remove(a.key)} aria-label={`Delete ${a.key}`}>Delete</button>
              </td>}
            </tr>
          ))}
        </tbody>
      </table></TableBox>
      {editable && (
        <form id={fid} class="grid" onSubmit={(e) => { e.preventDefault(); void save(key, value); }}>
          <label>Key<input required value={key} onInput={(e) => setKey(e.currentTarget.value)} /></label>
          <label>Value (JSON or text)<input required value={value} onInput={(e) => setValue(e.currentTarget.value)} /></label>
          <button type="submit" aria-busy={action.busy}>Save {title.toLowerCase().replace(' attributes', '')} attribute</button>
        </form>
      )}
    </section>
  );
}

/** What ThingsBoard's RPC statuses mean, for an answer without a message. */
const RPC_STATUS: Record<number, string> = {
  409: 'the device is not connected (no session subscribed to RPC requests).',
  408: 'the device did not answer within the timeout.',
  504: 'the device did not answer within the timeout.',
  406: 'the device answered with something that is not JSON.',
};

/** Sends an RPC to the device and shows its reply (two-way) or that it was delivered (one-way). */
function Rpc({ id }: { id: string }) {
  const [method, setMethod] = useState('');
  const [params, setParams] = useState('{}');
  const [twoWay, setTwoWay] = useState(true);
  const [timeout, setTimeoutMs] = useState(10000);
  const [reply, setReply] = useState<string | null>(null);
  const action = useAction();
  const send = (e: Event) => {
    e.preventDefault();
    setReply(null);
    void action.run(async () => {
      try {
        const r = await api('POST', `/api/plugins/rpc/${twoWay ? 'twoway' : 'oneway'}/${id}`, { method, params: typed(params), timeout });
        setReply(r === null ? 'Delivered.' : JSON.stringify(r, null, 2));
      } catch (err) {
        // The server says why in its body; a server that does not gets its status explained here.
        if (err instanceof ApiError && !err.explained && RPC_STATUS[err.status]) throw new Error(`RPC failed (${err.status}): ${RPC_STATUS[err.status]}`);
        throw err;
      }
    });
  };
  return (
    <article>
      <h2>RPC</h2>
      <form onSubmit={send}>
        <div class="grid">
          <label>Method<input required value={method} onInput={(e) => setMethod(e.currentTarget.value)} /></label>
          <label>Params (JSON)<input value={params} onInput={(e) => setParams(e.currentTarget.value)} /></label>
          <label>Timeout (ms)<input type="number" min={100} max={600000} value={timeout} onInput={(e) => setTimeoutMs(Number(e.currentTarget.value))} /></label>
        </div>
        <label><input type="checkbox" role="switch" checked={twoWay} onChange={(e) => setTwoWay(e.currentTarget.checked)} /> Two-way (wait for the reply)</label>
        <button type="submit" aria-busy={action.busy}>Send RPC</button>
      </form>
      <ErrorBox error={action.error} />
      {reply !== null && <><h3>Reply</h3><pre aria-label="RPC reply">{reply}</pre></>}
    </article>
  );
}
