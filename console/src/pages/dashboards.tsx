// Dashboards: the tenant's list (create; edit the title, description, configuration and the
// customers it is assigned to; delete), a customer user's assigned ones, and one dashboard
// drawn from ThingsBoard's configuration format: its entity aliases (one device or a list of
// devices) and its time-series (chart), latest-value (table) and alarm (table) widgets, live
// over the WebSocket API. A tenant administrator adds such widgets from the dashboard's page.
import { useEffect, useMemo, useState } from 'preact/hooks';
import { fmtTime, get, post, del, type Device, type EntityId, type Page, type User, type Customer } from '../api';
import { ALARM_FIELDS, alarmField, AlarmTable, alarmOrder, DEFAULT_COLUMNS, type AlarmColumn } from '../alarms';
import { Chart } from '../chart';
import { Dialog, ErrorBox, FormEnd, Pager, TableBox, useAction, useLoad, type Sort } from '../components';
import { useLatest, useLiveAlarms, useLivePoints, type AlarmQuery } from '../live';
import { PagedList } from './entities';

interface Assigned { customerId: EntityId; title: string }
interface DashboardInfo { id: EntityId; title: string; createdTime: number; assignedCustomers?: Assigned[] | null }
interface DataKey { name: string; type?: string; label?: string }
interface Datasource { type?: string; entityAliasId?: string; dataKeys?: DataKey[] }
interface AlarmFilterConfig { statusList?: string[]; severityList?: string[]; typeList?: string[]; searchPropagatedAlarms?: boolean }
interface AlarmSettings {
  defaultPageSize?: number; defaultSortOrder?: string; displayPagination?: boolean;
  allowAcknowledgment?: boolean; allowClear?: boolean; displayComments?: boolean;
}
interface WidgetConfig {
  title?: string; datasources?: Datasource[]; timewindow?: { realtime?: { timewindowMs?: number } };
  /** Alarm widgets: the entity alias whose alarms are shown, and the alarm fields and keys shown as columns. */
  alarmSource?: Datasource;
  alarmFilterConfig?: AlarmFilterConfig;
  /** Older alarm widgets' filter (before `alarmFilterConfig`). */
  alarmStatusList?: string[]; alarmSearchStatus?: string; alarmSeverityList?: string[]; alarmTypeList?: string[];
  settings?: AlarmSettings & Record<string, unknown>;
  [k: string]: unknown;
}
interface Widget { id?: string; type?: string; typeFullFqn?: string; sizeX?: number; sizeY?: number; config?: WidgetConfig }
interface Alias {
  id?: string; alias?: string;
  filter?: { type?: string; singleEntity?: EntityId; entityType?: string; entityList?: string[]; [k: string]: unknown };
}
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
  const used = new Set(rest.flatMap((x) => [...(x.config?.datasources ?? []), x.config?.alarmSource].map((s) => s?.entityAliasId)));
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
  const kind = widget.type === 'timeseries' || widget.type === 'latest' || widget.type === 'alarm' ? widget.type : null;
  const windowMs = widget.config?.timewindow?.realtime?.timewindowMs ?? 10 * 60_000;
  return (
    <article aria-label={title} class="widget">
      <div class="bar">
        <h2>{title}</h2>
        {onRemove && <button type="button" class="contrast outline" onClick={() => { if (confirm(`Remove the widget ${title}?`)) onRemove(); }} aria-label={`Remove widget: ${title}`}>Remove</button>}
      </div>
      {!kind ? <p>Widgets of type {widget.type ?? 'unknown'} are not drawn by the console.</p>
        : kind === 'alarm' ? <AlarmWidget config={widget.config ?? {}} aliases={aliases} title={title} />
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

/** An alarm widget's filter: `alarmFilterConfig`, or the fields older widgets have (read as ThingsBoard's dashboard loader reads them). */
function alarmFilterOf(c: WidgetConfig): AlarmFilterConfig {
  if (c.alarmFilterConfig) return c.alarmFilterConfig;
  const statusList = c.alarmStatusList?.length ? c.alarmStatusList
    : c.alarmSearchStatus && c.alarmSearchStatus !== 'ANY' ? [c.alarmSearchStatus] : [];
  return { statusList, severityList: c.alarmSeverityList ?? [], typeList: c.alarmTypeList ?? [] };
}

/** `settings.defaultSortOrder` ("-createdTime": newest first) as an order the server takes; newest first otherwise. */
function sortOf(order: string | undefined): Sort {
  const name = (order ?? '-createdTime').replace(/^[-+]/, '');
  const key = alarmField(name)?.sortKey;
  return key ? { property: key, desc: (order ?? '-').startsWith('-') } : { property: 'createdTime', desc: true };
}

/** A data key's type as an alarm query names the originator's values of that type. */
const LATEST_TYPES: Partial<Record<string, 'TIME_SERIES' | 'ATTRIBUTE' | 'ENTITY_FIELD'>> = { timeseries: 'TIME_SERIES', attribute: 'ATTRIBUTE', entityField: 'ENTITY_FIELD' };

/**
 * The columns of an alarm widget from its source's keys: alarm fields (`type: "alarm"`),
 * and the originator's time series, attributes and entity fields (its latest values, which
 * the query asks for); the usual five when it names none the console knows.
 */
function alarmColumns(keys: DataKey[]): { columns: AlarmColumn[]; latestValues: NonNullable<AlarmQuery['latestValues']>; entityFields: NonNullable<AlarmQuery['entityFields']> } {
  const columns: AlarmColumn[] = [];
  const latestValues: NonNullable<AlarmQuery['latestValues']> = [];
  const entityFields: NonNullable<AlarmQuery['entityFields']> = [];
  for (const k of keys) {
    const label = k.label || k.name;
    const field = alarmField(k.name);
    const latest = LATEST_TYPES[k.type ?? ''];
    if (k.type === 'alarm' && field) columns.push({ ...field, label });
    else if (latest) {
      if (latest === 'ENTITY_FIELD') entityFields.push({ type: latest, key: k.name });
      else latestValues.push({ type: latest, key: k.name });
      columns.push({ label, cell: (a) => a.latest?.[latest]?.[k.name]?.value ?? '' });
    }
  }
  return { columns: columns.length > 0 ? columns : DEFAULT_COLUMNS, latestValues, entityFields };
}

/**
 * ThingsBoard's alarm widget (`type: "alarm"`, e.g. `system.alarm_widgets.alarms_table`): a
 * live table of the alarms of its alarm source's entity alias (`ALARM_DATA`, the alias's
 * filter as the query's entity filter, so any filter the server resolves works), filtered
 * as its `alarmFilterConfig` says, over its real-time window if it has one; sortable,
 * paged, with acknowledge, clear and comments unless its settings turn them off.
 */
function AlarmWidget({ config, aliases, title }: { config: WidgetConfig; aliases: Record<string, Alias>; title: string }) {
  const source = config.alarmSource ?? (config.datasources ?? []).find((d) => d.entityAliasId);
  const alias = aliases[source?.entityAliasId ?? ''];
  const settings = config.settings ?? {};
  const filter = alarmFilterOf(config);
  const { columns, latestValues, entityFields } = useMemo(() => alarmColumns(source?.dataKeys ?? []), [JSON.stringify(source?.dataKeys ?? [])]);
  const [sort, setSortState] = useState<Sort>(() => sortOf(settings.defaultSortOrder));
  const [page, setPage] = useState(0);
  const pageSize = Math.min(1000, Math.max(1, Math.floor(Number(settings.defaultPageSize) || 10)));
  const windowMs = config.timewindow?.realtime?.timewindowMs;
  const live = useLiveAlarms(alias?.filter ? {
    entityFilter: alias.filter,
    pageLink: {
      page, pageSize, sortOrder: alarmOrder(sort.property, sort.desc), timeWindow: windowMs || undefined,
      statusList: filter.statusList ?? [], severityList: filter.severityList ?? [], typeList: filter.typeList ?? [],
      searchPropagatedAlarms: filter.searchPropagatedAlarms ?? false,
    },
    entityFields, latestValues,
  } : null);
  const total = live.page?.totalPages ?? 0;
  useEffect(() => { if (live.current && page > 0 && page >= total) setPage(Math.max(0, total - 1)); }, [live.current, page, total]);
  if (!alias?.filter) return <p>The entity alias of this alarm widget is missing from the dashboard.</p>;
  const label = `${title}: ${alias.alias ?? 'alarms'}`;
  const actions = { ack: settings.allowAcknowledgment !== false, clear: settings.allowClear !== false, comments: settings.displayComments !== false };
  return (
    <>
      <ErrorBox error={live.error} />
      <AlarmTable label={label} alarms={live.page?.data ?? []} busy={!live.current && !live.error} columns={columns}
        sort={sort} setSort={(s) => { setSortState(s); setPage(0); }} actions={actions} />
      {live.current && live.page?.totalElements === 0 && <p>No alarms.</p>}
      {live.page && settings.displayPagination !== false && live.page.totalPages > 1 && (
        <Pager page={page} totalPages={live.page.totalPages} total={live.page.totalElements} setPage={setPage} />
      )}
    </>
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

/** The keys of the alarm fields an alarms table added here shows, as ThingsBoard's alarm widget names them. */
const ALARM_KEYS = ['createdTime', 'originator', 'type', 'severity', 'status'];

/**
 * Adds a widget in ThingsBoard's configuration format: a chart or latest-values widget of
 * one device's keys, or an alarms table of one device or of all devices.
 */
function AddWidget({ dashboard, onClose }: { dashboard: Dashboard; onClose: (saved: boolean) => void }) {
  const [title, setTitle] = useState('');
  const [type, setType] = useState('timeseries');
  const [deviceName, setDeviceName] = useState('');
  const [keys, setKeys] = useState('');
  const [status, setStatus] = useState('ACTIVE');
  const action = useAction();
  const alarms = type === 'alarm';
  const save = (e: Event) => {
    e.preventDefault();
    void action.run(async () => {
      // An alarms table without a device name: every device (the viewer's, for a customer user).
      const device = alarms && !deviceName.trim() ? null : await get<Device>(`/api/tenant/devices?deviceName=${encodeURIComponent(deviceName)}`);
      const names = keys.split(/[\s,]+/).filter(Boolean);
      if (!alarms && names.length === 0) throw new Error('Name at least one key.');
      const config = dashboard.configuration ?? {};
      const aliasId = uuid();
      const widgetId = uuid();
      const widget: Widget = alarms ? {
        id: widgetId, type, sizeX: 12, sizeY: 6, typeFullFqn: 'system.alarm_widgets.alarms_table',
        config: {
          title, datasources: [],
          alarmSource: { type: 'entity', entityAliasId: aliasId, dataKeys: ALARM_KEYS.map((n) => ({ name: n, type: 'alarm', label: ALARM_FIELDS[n].label })) },
          alarmFilterConfig: { statusList: status ? [status] : [], severityList: [], typeList: [], searchPropagatedAlarms: false },
          settings: { defaultPageSize: 10, defaultSortOrder: '-createdTime', displayPagination: true, allowAcknowledgment: true, allowClear: true, displayComments: true },
        },
      } : {
        id: widgetId, type, sizeX: 8, sizeY: 5,
        typeFullFqn: type === 'timeseries' ? 'system.charts.basic_timeseries' : 'system.cards.attributes_card',
        config: { title, datasources: [{ type: 'entity', entityAliasId: aliasId, dataKeys: names.map((n) => ({ name: n, type: 'timeseries', label: n })) }] },
      };
      const widgets = Array.isArray(config.widgets) ? [...config.widgets, widget] : { ...(config.widgets ?? {}), [widgetId]: widget };
      const alias: Alias = device
        ? { id: aliasId, alias: device.name, filter: { type: 'singleEntity', resolveMultiple: false, singleEntity: device.id } }
        : { id: aliasId, alias: 'All devices', filter: { type: 'entityType', resolveMultiple: true, entityType: 'DEVICE' } };
      const entityAliases = { ...(config.entityAliases ?? {}), [aliasId]: alias };
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
            <option value="timeseries">Time-series chart</option><option value="latest">Latest values</option><option value="alarm">Alarms table</option>
          </select>
        </label>
        <label>{alarms ? 'Device name (empty: all devices)' : 'Device name'}
          <input required={!alarms} value={deviceName} onInput={(e) => setDeviceName(e.currentTarget.value)} />
        </label>
        {alarms ? (
          <label>Alarms shown
            <select value={status} onChange={(e) => setStatus(e.currentTarget.value)}>
              <option value="ACTIVE">Active</option><option value="">Any (active and cleared)</option>
            </select>
          </label>
        ) : <label>Keys (comma separated)<input required value={keys} onInput={(e) => setKeys(e.currentTarget.value)} /></label>}
        <FormEnd error={action.error} busy={action.busy} onCancel={() => onClose(false)} />
      </form>
    </Dialog>
  );
}
