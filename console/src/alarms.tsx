// What the alarm views share (the Alarms page, the device list and page, the dashboards'
// alarm widget): severities and statuses as people read them, a table of live alarms with
// acknowledge, clear and comments (the REST API; a refusal shows the server's message).
import type { ComponentChildren } from 'preact';
import { useState } from 'preact/hooks';
import { fmtTime, get, post, query, type EntityId, type Page } from './api';
import { Dialog, ErrorBox, SortHeader, TableBox, useAction, useLoad, type Sort } from './components';
import type { AlarmQuery, AlarmRow } from './live';

/** ThingsBoard's alarm severities, highest first. */
export const SEVERITIES = ['CRITICAL', 'MAJOR', 'MINOR', 'WARNING', 'INDETERMINATE'] as const;

/** A severity's rank: 0 for the highest, more for lower ones (and for one not known). */
export const severityRank = (s: string) => { const i = SEVERITIES.indexOf(s as typeof SEVERITIES[number]); return i < 0 ? SEVERITIES.length : i; };

const word = (s: string) => s.charAt(0) + s.slice(1).toLowerCase();

export function SeverityBadge({ severity }: { severity: string }) {
  return <span class={`severity severity-${severity.toLowerCase()}`} data-severity={severity}>{word(severity)}</span>;
}

const STATUS: Record<string, string> = {
  ACTIVE_UNACK: 'Active, unacknowledged', ACTIVE_ACK: 'Active, acknowledged',
  CLEARED_UNACK: 'Cleared, unacknowledged', CLEARED_ACK: 'Cleared, acknowledged',
};
export const statusText = (status: string) => STATUS[status] ?? status;

/** The `pageLink.sortOrder` of an alarm query. */
export const alarmOrder = (key: string, desc: boolean): AlarmQuery['pageLink']['sortOrder'] =>
  ({ key: { type: 'ALARM_FIELD', key }, direction: desc ? 'DESC' : 'ASC' });

/** The originator: a device links to its page. */
function Originator({ a }: { a: AlarmRow }) {
  const o: EntityId = a.entityId ?? a.originator;
  const name = a.originatorName || o.id;
  return o.entityType === 'DEVICE' ? <a href={`#/devices/${o.id}`}>{name}</a> : <>{name}</>;
}

/** A column of an alarm table: its header, the ALARM_FIELD it sorts by (if it does), its cell. */
export interface AlarmColumn { label: string; sortKey?: string; cell: (a: AlarmRow) => ComponentChildren }

const when = (ms?: number) => (ms ? fmtTime(ms) : '');

/** The alarm fields a table can show (the names ThingsBoard's alarm widget keys use), with their usual headers. */
export const ALARM_FIELDS: Record<string, AlarmColumn> = {
  createdTime: { label: 'Created', sortKey: 'createdTime', cell: (a) => fmtTime(a.createdTime) },
  originator: { label: 'Originator', sortKey: 'originator', cell: (a) => <Originator a={a} /> },
  originatorLabel: { label: 'Originator label', cell: (a) => a.originatorLabel ?? '' },
  type: { label: 'Type', sortKey: 'type', cell: (a) => a.type },
  severity: { label: 'Severity', sortKey: 'severity', cell: (a) => <SeverityBadge severity={a.severity} /> },
  status: { label: 'Status', sortKey: 'status', cell: (a) => statusText(a.status) },
  startTime: { label: 'Start time', sortKey: 'startTs', cell: (a) => when(a.startTs) },
  endTime: { label: 'End time', sortKey: 'endTs', cell: (a) => when(a.endTs) },
  ackTime: { label: 'Acknowledged', sortKey: 'ackTs', cell: (a) => when(a.ackTs) },
  clearTime: { label: 'Cleared', sortKey: 'clearTs', cell: (a) => when(a.clearTs) },
  assignee: { label: 'Assignee', cell: (a) => a.assignee?.email ?? '' },
  details: { label: 'Details', cell: (a) => (a.details && typeof a.details === 'object' && Object.keys(a.details).length > 0 ? <code>{JSON.stringify(a.details)}</code> : '') },
};

/** The column of alarm field `name` (a key of a widget's configuration), if the console knows it. */
export const alarmField = (name: string): AlarmColumn | undefined => (Object.hasOwn(ALARM_FIELDS, name) ? ALARM_FIELDS[name] : undefined);

/** The columns of the Alarms page. */
export const DEFAULT_COLUMNS = ['createdTime', 'originator', 'type', 'severity', 'status'].map((k) => ALARM_FIELDS[k]);

/** Which actions an alarm table offers. */
export interface AlarmActions { ack: boolean; clear: boolean; comments: boolean }
const ALL_ACTIONS: AlarmActions = { ack: true, clear: true, comments: true };

/**
 * A table of alarms (a page of `ALARM_DATA`) with Acknowledge and Clear (while the alarm is
 * not yet) and its comments, unless `actions` leaves them out. What an action changes comes
 * back on the live page; a refusal is shown as the server's message.
 */
export function AlarmTable({ label, alarms, busy, columns, sort, setSort, actions = ALL_ACTIONS }: {
  label: string; alarms: AlarmRow[]; busy: boolean; columns: AlarmColumn[];
  sort?: Sort; setSort?: (s: Sort) => void; actions?: AlarmActions;
}) {
  const anyAction = actions.ack || actions.clear || actions.comments;
  const action = useAction();
  const [comments, setComments] = useState<AlarmRow | null>(null);
  const act = (a: AlarmRow, verb: 'ack' | 'clear') => void action.run(async () => { await post(`/api/alarm/${a.id.id}/${verb}`); });
  const what = (a: AlarmRow) => `${a.type} on ${a.originatorName || a.originator.id}`;
  return (
    <>
      <ErrorBox error={action.error} />
      <TableBox label={label}>
        <table class="striped alarms" aria-label={label} aria-busy={busy}>
          <thead>
            <tr>
              {columns.map((c) => (c.sortKey && sort && setSort
                ? <SortHeader label={c.label} property={c.sortKey} sort={sort} setSort={setSort} />
                : <th scope="col">{c.label}</th>))}
              {anyAction && <th scope="col">Actions</th>}
            </tr>
          </thead>
          <tbody>
            {alarms.map((a) => (
              <tr key={a.id.id} data-alarm={a.id.id} data-status={a.status}>
                {columns.map((c) => <td>{c.cell(a)}</td>)}
                {anyAction && <td class="actions">
                  {actions.ack && !a.acknowledged && <button type="button" class="secondary outline" aria-label={`Acknowledge ${what(a)}`} onClick={() => act(a, 'ack')}>Acknowledge</button>}
                  {actions.clear && !a.cleared && <button type="button" class="contrast outline" aria-label={`Clear ${what(a)}`} onClick={() => act(a, 'clear')}>Clear</button>}
                  {actions.comments && <button type="button" class="secondary outline" aria-label={`Comments on ${what(a)}`} onClick={() => setComments(a)}>Comments</button>}
                </td>}
              </tr>
            ))}
          </tbody>
        </table>
      </TableBox>
      {comments && <Comments alarm={comments} title={what(comments)} onClose={() => setComments(null)} />}
    </>
  );
}

interface Comment {
  id: { id: string }; createdTime: number; type: string; email?: string | null;
  comment: { text?: string } | null;
}

/** At most this many comments are shown (the newest). */
const COMMENTS_SHOWN = 100;

/** An alarm's comments (people's and the system's: acknowledged, cleared, …), newest last, and a form to add one. */
function Comments({ alarm, title, onClose }: { alarm: AlarmRow; title: string; onClose: () => void }) {
  const path = `/api/alarm/${alarm.id.id}/comment`;
  const list = useLoad(() => get<Page<Comment>>(`${path}?${query({ pageSize: COMMENTS_SHOWN, page: 0, sortProperty: 'createdTime', sortOrder: 'DESC' })}`), [path]);
  const [text, setText] = useState('');
  const action = useAction();
  const add = (e: Event) => {
    e.preventDefault();
    void action.run(async () => { await post(path, { comment: { text } }); setText(''); list.reload(); });
  };
  const shown = [...(list.data?.data ?? [])].reverse();
  return (
    <Dialog title={`Comments: ${title}`} onClose={onClose}>
      <p>{statusText(alarm.status)} · <SeverityBadge severity={alarm.severity} /> · created {fmtTime(alarm.createdTime)}</p>
      <ErrorBox error={list.error} />
      {list.data && (shown.length === 0 ? <p>No comments yet.</p> : (
        <ul class="comments" aria-label="Comments">
          {shown.map((c) => (
            <li key={c.id.id} data-type={c.type}>
              <small>{fmtTime(c.createdTime)} · {c.type === 'SYSTEM' ? 'System' : (c.email ?? 'unknown user')}</small>
              <p>{c.comment?.text ?? ''}</p>
            </li>
          ))}
        </ul>
      ))}
      {list.data && list.data.totalElements > shown.length && <p>The {shown.length} newest of {list.data.totalElements} comments.</p>}
      <form onSubmit={add}>
        <label>New comment<textarea rows={3} required value={text} onInput={(e) => setText(e.currentTarget.value)} /></label>
        <ErrorBox error={action.error} />
        <footer>
          <button type="button" class="secondary" onClick={onClose}>Close</button>
          <button type="submit" aria-busy={action.busy}>Add comment</button>
        </footer>
      </form>
    </Dialog>
  );
}
