// The alarms of the caller's devices (a customer user: its customer's), live over the
// WebSocket API (one ALARM_DATA query): filters for status, acknowledgement, severity and
// type, a search, sortable columns (newest first), paging; acknowledge, clear, comments.
import { useEffect, useState } from 'preact/hooks';
import { get, type Page } from '../api';
import { AlarmTable, alarmOrder, DEFAULT_COLUMNS, SEVERITIES } from '../alarms';
import { ErrorBox, Pager, useLoad, type Sort } from '../components';
import { useLiveAlarms, type AlarmQuery } from '../live';

const PAGE_SIZES = [10, 20, 50, 100];

/** Every device the caller may see (the server keeps a customer user to its customer's). */
const ALL_DEVICES = { type: 'entityType', entityType: 'DEVICE' };

export function Alarms() {
  const [status, setStatus] = useState('ACTIVE');
  const [ack, setAck] = useState('');
  const [severity, setSeverity] = useState('');
  const [typeInput, setTypeInput] = useState('');
  const [type, setType] = useState('');
  const [search, setSearch] = useState('');
  const [text, setText] = useState('');
  const [page, setPage] = useState(0);
  const [size, setSize] = useState(20);
  const [sort, setSortState] = useState<Sort>({ property: 'createdTime', desc: true });
  // Typing waits 250 ms before it filters.
  useEffect(() => { const t = setTimeout(() => { setText(search); setPage(0); }, 250); return () => clearTimeout(t); }, [search]);
  useEffect(() => { const t = setTimeout(() => { setType(typeInput.trim()); setPage(0); }, 250); return () => clearTimeout(t); }, [typeInput]);
  const types = useLoad(() => get<Page<{ type: string }>>('/api/alarm/types?pageSize=100&page=0'), []);
  const q: AlarmQuery = {
    entityFilter: ALL_DEVICES,
    pageLink: {
      page, pageSize: size, textSearch: text || null, sortOrder: alarmOrder(sort.property, sort.desc),
      statusList: [status, ack].filter(Boolean), severityList: severity ? [severity] : [], typeList: type ? [type] : [],
    },
  };
  const live = useLiveAlarms(q);
  const total = live.page?.totalPages ?? 0;
  // Fewer alarms than the page needs (cleared, filtered out): back to the last page there is.
  useEffect(() => { if (live.current && page > 0 && page >= total) setPage(Math.max(0, total - 1)); }, [live.current, page, total]);
  const filter = <T,>(set: (v: T) => void) => (v: T) => { set(v); setPage(0); };
  const setSort = filter(setSortState);
  const limited = live.entities && live.entities.total > live.entities.allowed ? live.entities : null;
  return (
    <section>
      <h1>Alarms</h1>
      <div class="grid toolbar">
        <label>Status
          <select value={status} onChange={(e) => filter(setStatus)(e.currentTarget.value)}>
            <option value="">Any</option><option value="ACTIVE">Active</option><option value="CLEARED">Cleared</option>
          </select>
        </label>
        <label>Acknowledgement
          <select value={ack} onChange={(e) => filter(setAck)(e.currentTarget.value)}>
            <option value="">Any</option><option value="UNACK">Unacknowledged</option><option value="ACK">Acknowledged</option>
          </select>
        </label>
        <label>Severity
          <select value={severity} onChange={(e) => filter(setSeverity)(e.currentTarget.value)}>
            <option value="">Any</option>
            {SEVERITIES.map((s) => <option value={s}>{s.charAt(0) + s.slice(1).toLowerCase()}</option>)}
          </select>
        </label>
        <label>Type
          <input list="alarm-types" placeholder="Any" value={typeInput} onInput={(e) => setTypeInput(e.currentTarget.value)} />
        </label>
        <datalist id="alarm-types">{(types.data?.data ?? []).map((t) => <option value={t.type} />)}</datalist>
      </div>
      <div class="grid toolbar">
        <input type="search" placeholder="Search by device, type, severity or status" aria-label="Search alarms" value={search}
          onInput={(e) => setSearch(e.currentTarget.value)} />
        <label>Per page{' '}
          <select value={size} onChange={(e) => filter(setSize)(Number(e.currentTarget.value))}>
            {PAGE_SIZES.map((n) => <option value={n}>{n}</option>)}
          </select>
        </label>
      </div>
      <ErrorBox error={live.error} />
      {limited && <p role="status">These are the alarms of {limited.allowed} of the {limited.total} devices: the most one query looks at.</p>}
      <AlarmTable label="Alarms" alarms={live.page?.data ?? []} busy={!live.current && !live.error} columns={DEFAULT_COLUMNS} sort={sort} setSort={setSort} />
      {live.current && live.page?.totalElements === 0 && <p>No alarms{status || ack || severity || type || text ? ' match these filters' : ''}.</p>}
      {live.page && <Pager page={page} totalPages={live.page.totalPages} total={live.page.totalElements} setPage={setPage} />}
    </section>
  );
}
