// The device list: search, sort, paging; each device's active alarms (live); create, edit
// (customer assignment), delete; copy a device's access token (or, where the browser gives
// no clipboard, show it selected).
import { useEffect, useMemo, useRef, useState } from 'preact/hooks';
import { api, customerOf, del, get, post, query, fmtTime, type Customer, type Device, type Page, type User } from '../api';
import { alarmOrder, severityRank, SeverityBadge } from '../alarms';
import { Dialog, ErrorBox, FormEnd, Pager, SortHeader, TableBox, useAction, useLoad, type Sort } from '../components';
import { useLiveAlarms } from '../live';

const PAGE_SIZES = [10, 20, 50, 100];

export function Devices({ me }: { me: User }) {
  const [search, setSearch] = useState('');
  const [text, setText] = useState('');
  const [page, setPage] = useState(0);
  const [size, setSize] = useState(20);
  const [sort, setSort] = useState<Sort>({ property: 'name', desc: false });
  const [editing, setEditing] = useState<Device | 'new' | null>(null);
  const [notice, setNotice] = useState<string | null>(null);
  const [shown, setShown] = useState<{ name: string; token: string } | null>(null);
  const action = useAction();
  const admin = me.authority === 'TENANT_ADMIN';
  // Typing waits 250 ms before it searches.
  useEffect(() => { const t = setTimeout(() => { setText(search); setPage(0); }, 250); return () => clearTimeout(t); }, [search]);
  const list = useLoad(() => {
    const q = query({ pageSize: size, page, textSearch: text, sortProperty: sort.property, sortOrder: sort.desc ? 'DESC' : 'ASC' });
    const path = admin ? `/api/tenant/devices?${q}` : `/api/customer/${me.customerId?.id}/devices?${q}`;
    return get<Page<Device>>(path);
  }, [page, size, text, sort.property, sort.desc]);

  const copyToken = (d: Device) => action.run(async () => {
    setNotice(null);
    const c = await get<{ credentialsId: string; credentialsType: string }>(`/api/device/${d.id.id}/credentials`);
    // The clipboard API exists only in a secure context (HTTPS or localhost), and may be refused:
    // then the token is shown, selected, to copy by hand.
    try {
      if (!navigator.clipboard) throw new Error('no clipboard');
      await navigator.clipboard.writeText(c.credentialsId);
      setNotice(`Access token of ${d.name} copied.`);
    } catch {
      setShown({ name: d.name, token: c.credentialsId });
    }
  });
  const remove = (d: Device) => {
    if (!confirm(`Delete device ${d.name} and all its data?`)) return;
    void action.run(async () => { await del(`/api/device/${d.id.id}`); setNotice(`${d.name} deleted.`); list.reload(); });
  };
  const rows = list.data?.data ?? [];
  const alarms = useActiveAlarms(rows.map((d) => d.id.id));
  return (
    <section>
      <div class="bar">
        <h1>Devices</h1>
        {admin && <button type="button" onClick={() => setEditing('new')}>Add device</button>}
      </div>
      <div class="grid toolbar">
        <input type="search" placeholder="Search by name or label" aria-label="Search devices" value={search}
          onInput={(e) => setSearch(e.currentTarget.value)} />
        <label>Per page{' '}
          <select value={size} onChange={(e) => { setSize(Number(e.currentTarget.value)); setPage(0); }}>
            {PAGE_SIZES.map((n) => <option value={n}>{n}</option>)}
          </select>
        </label>
      </div>
      <ErrorBox error={list.error ?? action.error} />
      {notice && <p role="status">{notice}</p>}
      <TableBox label="Devices">
        <table class="striped" aria-label="Devices" aria-busy={list.data === null}>
          <thead>
            <tr>
              <SortHeader label="Name" property="name" sort={sort} setSort={setSort} />
              <SortHeader label="Type" property="type" sort={sort} setSort={setSort} />
              <SortHeader label="Label" property="label" sort={sort} setSort={setSort} />
              <SortHeader label="Created" property="createdTime" sort={sort} setSort={setSort} />
              <th scope="col">Active alarms</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {rows.map((d) => (
              <tr key={d.id.id}>
                <td><a href={`#/devices/${d.id.id}`}>{d.name}</a></td>
                <td>{d.type}</td>
                <td>{d.label}</td>
                <td>{fmtTime(d.createdTime)}</td>
                <AlarmCell summary={alarms.of.get(d.id.id)} state={alarms.state} />
                <td class="actions">
                  <button type="button" class="secondary outline" onClick={() => copyToken(d)} aria-label={`Copy token of ${d.name}`}>Copy token</button>
                  {admin && <button type="button" class="secondary outline" onClick={() => setEditing(d)} aria-label={`Edit ${d.name}`}>Edit</button>}
                  {admin && <button type="button" class="contrast outline" onClick={() => remove(d)} aria-label={`Delete ${d.name}`}>Delete</button>}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </TableBox>
      {list.data && <Pager page={page} totalPages={list.data.totalPages} total={list.data.totalElements} setPage={setPage} />}
      <ErrorBox error={alarms.error} />
      {alarms.partial && <p>The alarm counts are of this page's {ALARMS_COUNTED} most severe active alarms: some devices have more.</p>}
      {shown && <TokenDialog name={shown.name} token={shown.token} onClose={() => setShown(null)} />}
      {editing && <DeviceForm device={editing === 'new' ? null : editing} onClose={(saved) => { setEditing(null); if (saved) list.reload(); }} />}
    </section>
  );
}

/** The most active alarms the device list reads for one page of devices (the server's largest page). */
const ALARMS_COUNTED = 1000;

interface AlarmSummary { count: number; highest: string }
type CellState = 'loading' | 'known' | 'refused';

/**
 * The active alarms of the devices listed: one live `ALARM_DATA` query for the whole page
 * (its devices as an `entityList`, most severe first), not one per device; counted here per
 * device. `state`: whether the answer for these devices is there (or refused); `partial`:
 * some active alarms were not read (more than ALARMS_COUNTED).
 */
function useActiveAlarms(ids: string[]): { of: Map<string, AlarmSummary>; state: CellState; partial: boolean; error: string | null } {
  const live = useLiveAlarms(ids.length === 0 ? null : {
    entityFilter: { type: 'entityList', entityType: 'DEVICE', entityList: ids },
    pageLink: { page: 0, pageSize: ALARMS_COUNTED, sortOrder: alarmOrder('severity', true), statusList: ['ACTIVE'] },
  });
  const of = useMemo(() => {
    const m = new Map<string, AlarmSummary>();
    for (const a of live.page?.data ?? []) {
      const id = (a.entityId ?? a.originator).id;
      const had = m.get(id);
      if (!had) m.set(id, { count: 1, highest: a.severity });
      else m.set(id, { count: had.count + 1, highest: severityRank(a.severity) < severityRank(had.highest) ? a.severity : had.highest });
    }
    return m;
  }, [live.page]);
  const partial = live.current && (live.page?.totalElements ?? 0) > (live.page?.data.length ?? 0);
  const state: CellState = live.error ? 'refused' : live.current || ids.length === 0 ? 'known' : 'loading';
  return { of, state, partial, error: live.error };
}

/** A device's active alarms: how many, and the highest severity. */
function AlarmCell({ summary, state }: { summary?: AlarmSummary; state: CellState }) {
  if (state !== 'known') return <td aria-busy={state === 'loading'} />;
  if (!summary) return <td data-alarms="0">0</td>;
  return <td data-alarms={summary.count} data-severity={summary.highest}>{summary.count} · <SeverityBadge severity={summary.highest} /></td>;
}

/** A device's access token, selected, for a browser that would not copy it (no clipboard on plain HTTP). */
function TokenDialog({ name, token, onClose }: { name: string; token: string; onClose: () => void }) {
  const input = useRef<HTMLInputElement>(null);
  const [copied, setCopied] = useState<boolean | null>(null);
  useEffect(() => { input.current?.focus(); input.current?.select(); }, []);
  const copy = () => {
    input.current?.select();
    // The old way, which works without a secure context while the user clicks.
    let ok = false;
    try { ok = document.execCommand('copy'); } catch { ok = false; }
    setCopied(ok);
  };
  return (
    <Dialog title={`Access token of ${name}`} onClose={onClose}>
      <p>This browser does not let the console write to the clipboard (it does only on HTTPS or localhost). The token is selected: copy it with Ctrl+C (⌘C).</p>
      <input ref={input} readOnly value={token} aria-label={`Access token of ${name}`} class="token" onFocus={(e) => e.currentTarget.select()} />
      {copied === true && <p role="status">Copied.</p>}
      {copied === false && <p role="status">The browser refused to copy: copy the selected token with Ctrl+C (⌘C).</p>}
      <footer>
        <button type="button" class="secondary" onClick={copy}>Copy</button>
        <button type="button" onClick={onClose}>Close</button>
      </footer>
    </Dialog>
  );
}

/** Creates a device (`device` null) or edits one; its customer too. */
function DeviceForm({ device, onClose }: { device: Device | null; onClose: (saved: boolean) => void }) {
  const [name, setName] = useState(device?.name ?? '');
  const [type, setType] = useState(device?.type ?? 'default');
  const [label, setLabel] = useState(device?.label ?? '');
  const [token, setToken] = useState('');
  const [customer, setCustomer] = useState(customerOf(device));
  const customers = useLoad(() => get<Page<Customer>>('/api/customers?pageSize=1000&page=0'), []);
  const profiles = useLoad(() => get<string[] | { name: string }[]>('/api/deviceProfile/names'), []);
  const action = useAction();
  const save = (e: Event) => {
    e.preventDefault();
    void action.run(async () => {
      const body: Record<string, unknown> = { ...(device ?? {}), name, type, label: label || null };
      const saved = await api<Device>('POST', `/api/device${token ? `?accessToken=${encodeURIComponent(token)}` : ''}`, body);
      if (customer !== customerOf(device)) {
        if (customer) await post(`/api/customer/${customer}/device/${saved.id.id}`);
        else await del(`/api/customer/device/${saved.id.id}`);
      }
      onClose(true);
    });
  };
  const names = (profiles.data ?? []).map((p) => (typeof p === 'string' ? p : p.name));
  return (
    <Dialog title={device ? `Edit ${device.name}` : 'Add device'} onClose={() => onClose(false)}>
      <form onSubmit={save}>
        <label>Name<input required value={name} onInput={(e) => setName(e.currentTarget.value)} /></label>
        <label>Type (device profile)<input list="profile-names" required value={type} onInput={(e) => setType(e.currentTarget.value)} /></label>
        <datalist id="profile-names">{names.map((n) => <option value={n} />)}</datalist>
        <label>Label<input value={label} onInput={(e) => setLabel(e.currentTarget.value)} /></label>
        {!device && <label>Access token (empty: generated)<input value={token} onInput={(e) => setToken(e.currentTarget.value)} /></label>}
        <label>Customer
          <select value={customer} onChange={(e) => setCustomer(e.currentTarget.value)}>
            <option value="">None</option>
            {(customers.data?.data ?? []).map((c) => <option value={c.id.id}>{c.title}</option>)}
          </select>
        </label>
        <FormEnd error={action.error} busy={action.busy} onCancel={() => onClose(false)} />
      </form>
    </Dialog>
  );
}
