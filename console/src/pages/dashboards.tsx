// Dashboards: the tenant's list (create; edit the title, description, configuration and the
// customers it is assigned to; delete), a customer user's assigned ones, and one dashboard
// drawn from ThingsBoard's configuration format: its entity aliases (one device or a list of
// devices) and its time-series (chart) and latest-value (table) widgets, live over the
// WebSocket API. A tenant administrator adds such widgets from the dashboard's page.
import { useMemo, useState } from 'preact/hooks';
import { fmtTime, get, post, del, type Device, type EntityId, type Page, type User, type Customer } from '../api';
import { Chart } from '../chart';
import { Dialog, ErrorBox, FormEnd, TableBox, useAction, useLoad } from '../components';
import { useLatest, useLivePoints } from '../live';
import { PagedList } from './entities';

interface Assigned { customerId: EntityId; title: string }
interface DashboardInfo { id: EntityId; title: string; createdTime: number; assignedCustomers?: Assigned[] | null }
interface DataKey { name: string; type?: string; label?: string }
interface Datasource { type?: string; entityAliasId?: string; dataKeys?: DataKey[] }
interface Widget {
  id?: string; type?: string; typeFullFqn?: string; sizeX?: number; sizeY?: number;
  config?: { title?: string; datasources?: Datasource[]; timewindow?: { realtime?: { timewindowMs?: number } } };
}
interface Alias { id?: string; alias?: string; filter?: { type?: string; singleEntity?: EntityId; entityType?: string; entityList?: string[] } }
interface Config { description?: string; widgets?: Record<string, Widget> | Widget[]; entityAliases?: Record<string, Alias>; [k: string]: unknown }
interface Dashboard extends DashboardInfo { configuration?: Config | null }

const assigned = (d: DashboardInfo) => (d.assignedCustomers ?? []).map((c) => c.title).join(', ');
const link = (d: DashboardInfo) => <a href={`#/dashboards/${d.id.id}`}>{d.title}</a>;

export function Dashboards({ me }: { me: User }) {
  if (me.authority !== 'TENANT_ADMIN') {
    return <PagedList<DashboardInfo> title="Dashboards" path={`/api/customer/${me.customerId?.id}/dashboards`} name={(d) => d.title}
      columns={[['Title', link], ['Created', (d) => fmtTime(d.createdTime)]]} />;
  }
  return (
    <PagedList<DashboardInfo> title="Dashboards" path="/api/tenant/dashboards" name={(d) => d.title}
      columns={[['Title', link], ['Customers', assigned], ['Created', (d) => fmtTime(d.createdTime)]]}
      deletePath={(d) => `/api/dashboard/${d.id.id}`}
      create={(close) => <DashboardForm id={null} onClose={close} />}
      edit={(d, close) => <DashboardForm id={d.id.id} onClose={close} />} />
  );
}

/** Creates a dashboard (`id` null) or edits one: title, description, configuration JSON, customers. */
function DashboardForm({ id, onClose }: { id: string | null; onClose: (saved: boolean) => void }) {
  const loaded = useLoad(() => (id ? get<Dashboard>(`/api/dashboard/${id}`) : Promise.resolve(null)), [id]);
  const customers = useLoad(() => get<Page<Customer>>('/api/customers?pageSize=1000&page=0'), []);
  if (loaded.error || customers.error) return <Dialog title="Dashboard" onClose={() => onClose(false)}><ErrorBox error={loaded.error ?? customers.error} /></Dialog>;
  if ((id && !loaded.data) || !customers.data) return null;
  return <DashboardFields dashboard={loaded.data} customers={customers.data.data} onClose={onClose} />;
}

function DashboardFields({ dashboard, customers, onClose }: { dashboard: Dashboard | null; customers: Customer[]; onClose: (saved: boolean) => void }) {
  const config = dashboard?.configuration ?? {};
  const [title, setTitle] = useState(dashboard?.title ?? '');
  const [description, setDescription] = useState(config.description ?? '');
  const { description: _, ...rest } = config;
  const [json, setJson] = useState(JSON.stringify(rest, null, 2));
  const before = new Set((dashboard?.assignedCustomers ?? []).map((c) => c.customerId.id));
  const [chosen, setChosen] = useState(before);
  const action = useAction();
  const save = (e: Event) => {
    e.preventDefault();
    void action.run(async () => {
      let parsed: unknown;
      try { parsed = JSON.parse(json || '{}'); } catch (err) { throw new Error(`The configuration is not JSON: ${(err as Error).message}`); }
      if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) throw new Error('The configuration must be a JSON object.');
      const saved = await post<Dashboard>('/api/dashboard', {
        ...(dashboard ? { id: dashboard.id } : {}), title, configuration: { ...parsed, description: description || undefined },
      });
      for (const c of customers) {
        const on = chosen.has(c.id.id);
        if (on && !before.has(c.id.id)) await post(`/api/customer/${c.id.id}/dashboard/${saved.id.id}`);
        if (!on && before.has(c.id.id)) await del(`/api/customer/${c.id.id}/dashboard/${saved.id.id}`);
      }
      onClose(true);
    });
  };
  const toggle = (c: string, on: boolean) => { const next = new Set(chosen); if (on) next.add(c); else next.delete(c); setChosen(next); };
  return (
    <Dialog title={dashboard ? `Edit ${dashboard.title}` : 'Add dashboard'} onClose={() => onClose(false)}>
      <form onSubmit={save}>
        <label>Title<input required value={title} onInput={(e) => setTitle(e.currentTarget.value)} /></label>
        <label>Description<input value={description} onInput={(e) => setDescription(e.currentTarget.value)} /></label>
        <label>Configuration (ThingsBoard's dashboard JSON: widgets, entityAliases, states, …)
          <textarea rows={8} spellcheck={false} value={json} onInput={(e) => setJson(e.currentTarget.value)} />
        </label>
        {customers.length > 0 && <fieldset><legend>Assigned to customers</legend>
          {customers.map((c) => <label><input type="checkbox" checked={chosen.has(c.id.id)} onChange={(e) => toggle(c.id.id, e.currentTarget.checked)} />{c.title}</label>)}
        </fieldset>}
        <FormEnd error={action.error} busy={action.busy} onCancel={() => onClose(false)} />
      </form>
    </Dialog>
  );
}

/** The widgets of a configuration, in order, with their ids. */
function widgetsOf(config: Config): Widget[] {
  const w = config.widgets ?? {};
  return Array.isArray(w) ? w : Object.entries(w).map(([id, x]) => ({ ...x, id: x.id ?? id }));
}

/** The devices an alias names: a single device or a list of them; other filters are not resolved here. */
function devicesOf(alias: Alias | undefined): string[] | null {
  const f = alias?.filter;
  if (f?.type === 'singleEntity' && f.singleEntity?.entityType === 'DEVICE') return [f.singleEntity.id];
  if (f?.type === 'entityList' && f.entityType === 'DEVICE') return f.entityList ?? [];
  return null;
}

export function DashboardPage({ id, me }: { id: string; me: User }) {
  const dashboard = useLoad(() => get<Dashboard>(`/api/dashboard/${id}`), [id]);
  const [adding, setAdding] = useState(false);
  const action = useAction();
  if (dashboard.error) return <ErrorBox error={dashboard.error} />;
  if (!dashboard.data) return <p aria-busy="true">Loading…</p>;
  const d = dashboard.data;
  const config = d.configuration ?? {};
  const widgets = widgetsOf(config);
  return (
    <section>
      <nav aria-label="breadcrumb"><ul><li><a href="#/dashboards">Dashboards</a></li><li>{d.title}</li></ul></nav>
      <div class="bar">
        <h1>{d.title}</h1>
        {me.authority === 'TENANT_ADMIN' && <button type="button" onClick={() => setAdding(true)}>Add widget</button>}
      </div>
      {config.description && <p>{config.description}</p>}
      <ErrorBox error={action.error} />
      {widgets.length === 0 ? <p>This dashboard has no widgets yet.</p> : (
        <div class="widgets">{widgets.map((w) => (
          <WidgetCard key={w.id} widget={w} aliases={config.entityAliases ?? {}}
            onRemove={me.authority === 'TENANT_ADMIN' ? () => void action.run(async () => { await saveConfig(d, withoutWidget(config, w)); dashboard.reload(); }) : undefined} />
        ))}</div>
      )}
      {adding && <AddWidget dashboard={d} onClose={(saved) => { setAdding(false); if (saved) dashboard.reload(); }} />}
    </section>
  );
}

/** Saves a dashboard with a new configuration. */
const saveConfig = (d: Dashboard, configuration: Config) => post('/api/dashboard', { id: d.id, title: d.title, configuration });

/** The configuration without widget `w`, and without the aliases only it used. */
function withoutWidget(config: Config, w: Widget): Config {
  const rest = widgetsOf(config).filter((x) => x.id !== w.id);
  const used = new Set(rest.flatMap((x) => (x.config?.datasources ?? []).map((s) => s.entityAliasId)));
  const aliases = Object.fromEntries(Object.entries(config.entityAliases ?? {}).filter(([id]) => used.has(id)));
  const widgets = Array.isArray(config.widgets) ? rest : Object.fromEntries(rest.map((x) => [x.id, x]));
  return { ...config, widgets, entityAliases: aliases };
}

function WidgetCard({ widget, aliases, onRemove }: { widget: Widget; aliases: Record<string, Alias>; onRemove?: () => void }) {
  const title = widget.config?.title ?? 'Widget';
  const sources = (widget.config?.datasources ?? []).map((s) => ({
    alias: aliases[s.entityAliasId ?? ''], devices: devicesOf(aliases[s.entityAliasId ?? '']),
    keys: (s.dataKeys ?? []).filter((k) => (k.type ?? 'timeseries') === 'timeseries').map((k) => k.name),
  }));
  const kind = widget.type === 'timeseries' || widget.type === 'latest' ? widget.type : null;
  const windowMs = widget.config?.timewindow?.realtime?.timewindowMs ?? 10 * 60_000;
  return (
    <article aria-label={title} class="widget">
      <div class="bar">
        <h2>{title}</h2>
        {onRemove && <button type="button" class="contrast outline" onClick={() => { if (confirm(`Remove the widget ${title}?`)) onRemove(); }} aria-label={`Remove widget: ${title}`}>Remove</button>}
      </div>
      {!kind ? <p>Widgets of type {widget.type ?? 'unknown'} are not drawn by the console.</p>
        : sources.map((s) => (s.devices === null
          ? <p>The entity alias {s.alias?.alias ?? '(missing)'} ({s.alias?.filter?.type ?? 'no filter'}) is not resolved by the console: it draws single devices and device lists.</p>
          : s.devices.map((dev) => (kind === 'timeseries'
            ? <DeviceChart device={dev} keys={s.keys} windowMs={windowMs} label={`${title}: ${s.alias?.alias ?? dev}`} />
            : <DeviceLatest device={dev} keys={s.keys} label={`${title}: ${s.alias?.alias ?? dev}`} />))))}
    </article>
  );
}

function DeviceChart({ device, keys, windowMs, label }: { device: string; keys: string[]; windowMs: number; label: string }) {
  const { points, error } = useLivePoints(device, windowMs);
  const lines = useMemo(() => keys.filter((k) => points[k]).map((k) => ({ key: k, points: points[k] })), [points, keys.join('\u0000')]);
  if (error) return <ErrorBox error={error} />;
  return lines.length === 0 ? <p>No numeric points of {keys.join(', ')} yet.</p> : <Chart lines={lines} label={label} />;
}

function DeviceLatest({ device, keys, label }: { device: string; keys: string[]; label: string }) {
  const { latest, error } = useLatest(device);
  if (error) return <ErrorBox error={error} />;
  return (
    <TableBox label={label}>
      <table aria-label={label}>
        <tbody>{keys.map((k) => <tr data-key={k}><th scope="row">{k}</th><td class="value">{latest[k]?.[1] ?? '–'}</td><td>{latest[k] ? fmtTime(latest[k][0]) : ''}</td></tr>)}</tbody>
      </table>
    </TableBox>
  );
}

/** A random (version 4) UUID; `crypto.randomUUID` needs a secure context, a console on plain http does not have. */
function uuid(): string {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** Adds a chart or latest-values widget of one device's keys, in ThingsBoard's configuration format. */
function AddWidget({ dashboard, onClose }: { dashboard: Dashboard; onClose: (saved: boolean) => void }) {
  const [title, setTitle] = useState('');
  const [type, setType] = useState('timeseries');
  const [deviceName, setDeviceName] = useState('');
  const [keys, setKeys] = useState('');
  const action = useAction();
  const save = (e: Event) => {
    e.preventDefault();
    void action.run(async () => {
      const device = await get<Device>(`/api/tenant/devices?deviceName=${encodeURIComponent(deviceName)}`);
      const names = keys.split(/[\s,]+/).filter(Boolean);
      if (names.length === 0) throw new Error('Name at least one key.');
      const config = dashboard.configuration ?? {};
      const aliasId = uuid();
      const widgetId = uuid();
      const widget: Widget = {
        id: widgetId, type, sizeX: 8, sizeY: 5,
        typeFullFqn: type === 'timeseries' ? 'system.charts.basic_timeseries' : 'system.cards.attributes_card',
        config: { title, datasources: [{ type: 'entity', entityAliasId: aliasId, dataKeys: names.map((n) => ({ name: n, type: 'timeseries', label: n })) }] },
      };
      const widgets = Array.isArray(config.widgets) ? [...config.widgets, widget] : { ...(config.widgets ?? {}), [widgetId]: widget };
      const entityAliases = {
        ...(config.entityAliases ?? {}),
        [aliasId]: { id: aliasId, alias: device.name, filter: { type: 'singleEntity', resolveMultiple: false, singleEntity: device.id } },
      };
      await saveConfig(dashboard, { ...config, widgets, entityAliases });
      onClose(true);
    });
  };
  return (
    <Dialog title="Add widget" onClose={() => onClose(false)}>
      <form onSubmit={save}>
        <label>Title<input required value={title} onInput={(e) => setTitle(e.currentTarget.value)} /></label>
        <label>Kind
          <select value={type} onChange={(e) => setType(e.currentTarget.value)}>
            <option value="timeseries">Time-series chart</option><option value="latest">Latest values</option>
          </select>
        </label>
        <label>Device name<input required value={deviceName} onInput={(e) => setDeviceName(e.currentTarget.value)} /></label>
        <label>Keys (comma separated)<input required value={keys} onInput={(e) => setKeys(e.currentTarget.value)} /></label>
        <FormEnd error={action.error} busy={action.busy} onCancel={() => onClose(false)} />
      </form>
    </Dialog>
  );
}
