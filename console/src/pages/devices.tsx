// The device list: search, sort, paging; create, edit (customer assignment), delete; copy a
// device's access token (or, where the browser gives no clipboard, show it selected).
import { useEffect, useRef, useState } from 'preact/hooks';
import { api, customerOf, del, get, post, query, fmtTime, type Customer, type Device, type Page, type User } from '../api';
import { Dialog, ErrorBox, FormEnd, Pager, SortHeader, TableBox, useAction, useLoad, type Sort } from '../components';

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
      {shown && <TokenDialog name={shown.name} token={shown.token} onClose={() => setShown(null)} />}
      {editing && <DeviceForm device={editing === 'new' ? null : editing} onClose={(saved) => { setEditing(null); if (saved) list.reload(); }} />}
    </section>
  );
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
