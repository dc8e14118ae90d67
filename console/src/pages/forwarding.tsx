// The Data forwarding page (#/forwarding): the tenant's sinks (an HTTP endpoint, a Kafka
// topic, an external MQTT broker) with their delivery statistics, read again every few
// seconds while the page is open; add, edit (the type switches the fields; secrets are
// write-only) and delete. Only tenant administrators may: anyone else is told so.
import { useEffect, useState } from 'preact/hooks';
import { ApiError, del, fmtTime, get, post, type EntityId, type Page } from '../api';
import { Dialog, ErrorBox, TableBox, useAction, useLoad } from '../components';
import {
  bodyOf, DEFAULT_MQTT_TOPIC, FieldError, fieldOfMessage, formOf, SINK_EVENTS, SINK_TYPES, targetOf, TOPIC_FIELDS,
  type Sink, type SinkForm, type SinkType,
} from '../forwarding';
import './forwarding.css';

/** How often the statistics are read again while the page is open. */
const REFRESH_MS = 3000;
const LIST = '/api/forwarding/sinks?pageSize=100&page=0';

/** The sinks, read again every REFRESH_MS (not while the tab is hidden, nor after a 403). */
function useSinks(): { data: Page<Sink> | null; error: Error | null; reload: () => void } {
  const [data, setData] = useState<Page<Sink> | null>(null);
  const [error, setError] = useState<Error | null>(null);
  const [n, setN] = useState(0);
  useEffect(() => {
    let live = true;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const load = async () => {
      let again = true;
      if (!document.hidden) {
        try {
          const d = await get<Page<Sink>>(LIST);
          if (live) { setData(d); setError(null); }
        } catch (e) {
          if (live) setError(e as Error);
          again = !(e instanceof ApiError && e.status === 403);
        }
      }
      if (live && again) timer = setTimeout(() => void load(), REFRESH_MS);
    };
    void load();
    return () => { live = false; clearTimeout(timer); };
  }, [n]);
  return { data, error, reload: () => setN((x) => x + 1) };
}

const TYPE_NAMES: Record<string, string> = { HTTP: 'HTTP', KAFKA: 'Kafka', MQTT: 'MQTT' };
const count = (n: number | undefined) => (n === undefined ? '–' : n.toLocaleString());

export function Forwarding() {
  const sinks = useSinks();
  const [editing, setEditing] = useState<string | null | undefined>(undefined);
  const action = useAction();
  const forbidden = sinks.error instanceof ApiError && sinks.error.status === 403;
  if (forbidden) {
    return (
      <section>
        <h1>Data forwarding</h1>
        <p role="alert" class="notice">Only tenant administrators may see and change data forwarding: ask one of yours to set up where your data is sent.</p>
      </section>
    );
  }
  const remove = (s: Sink) => {
    if (confirm(`Delete the data sink ${s.name}? What it has not sent yet will not be sent.`)) {
      void action.run(async () => { await del(`/api/forwarding/sink/${s.id.id}`); sinks.reload(); });
    }
  };
  const list = sinks.data?.data ?? [];
  return (
    <section>
      <div class="bar">
        <h1>Data forwarding</h1>
        <button type="button" onClick={() => setEditing(null)}>Add sink</button>
      </div>
      <p>
        Sinks receive your devices' committed telemetry, attribute changes and alarm changes, at least once and in order per
        device; a failed delivery is tried again until it succeeds. Delivered counts events; dropped and pending count entries of
        the outbox (a committed message the sink wants) that it lost because the outbox was full, or has not sent yet. The
        statistics count since the server started and are read again every {REFRESH_MS / 1000} seconds.
      </p>
      <ErrorBox error={sinks.error?.message ?? action.error} />
      <TableBox label="Data sinks">
        <table class="striped sinks" aria-label="Data sinks" aria-busy={!sinks.data && !sinks.error}>
          <thead>
            <tr>
              <th scope="col">Name, where it sends</th><th scope="col">Type</th><th scope="col">Enabled</th>
              <th scope="col">Delivered</th><th scope="col">Failed tries</th><th scope="col">Dropped</th>
              <th scope="col">Pending</th><th scope="col">Last delivery</th><th scope="col">Last error</th><th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {list.map((s) => {
              const st = s.stats ?? { running: false };
              const on = s.enabled !== false;
              return (
                <tr key={s.id.id} data-sink={s.id.id} data-enabled={String(on)} data-running={String(st.running)}>
                  <td data-col="name" class="sink-name">{s.name}<small class="target" data-col="target">{targetOf(s)}</small></td>
                  <td data-col="type">{TYPE_NAMES[s.type] ?? s.type}</td>
                  <td data-col="enabled">{on ? (st.running ? 'Yes' : 'Yes (not running)') : 'No'}</td>
                  <td data-stat="delivered">{count(st.deliveredEvents)}</td>
                  <td data-stat="failed">{count(st.failedAttempts)}</td>
                  <td data-stat="dropped">{count(st.droppedEntries)}</td>
                  <td data-stat="pending">{count(st.pendingEntries)}</td>
                  <td data-stat="last-delivery">{st.lastDeliveryTime ? <>{fmtTime(st.lastDeliveryTime)}{st.lastLagMs !== undefined && <small class="lag">{st.lastLagMs.toLocaleString()} ms after commit</small>}</> : (st.running ? 'none yet' : '–')}</td>
                  <td data-stat="last-error" class="last-error">{st.lastError ? <><small class="when">{fmtTime(st.lastErrorTime ?? 0)}</small>{st.lastError}</> : (st.running ? 'none' : '–')}</td>
                  <td class="actions">
                    <button type="button" class="secondary outline" aria-label={`Edit ${s.name}`} onClick={() => setEditing(s.id.id)}>Edit</button>
                    <button type="button" class="contrast outline" aria-label={`Delete ${s.name}`} onClick={() => remove(s)}>Delete</button>
                  </td>
                </tr>
              );
            })}
          </tbody>
        </table>
      </TableBox>
      {sinks.data && list.length === 0 && <p>No data sinks yet: nothing is forwarded.</p>}
      {sinks.data && sinks.data.totalElements > list.length && <p>The first {list.length} of {sinks.data.totalElements} sinks.</p>}
      {editing !== undefined && <SinkDialog id={editing} onClose={(saved) => { setEditing(undefined); if (saved) sinks.reload(); }} />}
    </section>
  );
}

interface ProfileInfo { id: EntityId; name: string }

/** Adds a sink (`id` null) or edits one, read afresh from the server. */
function SinkDialog({ id, onClose }: { id: string | null; onClose: (saved: boolean) => void }) {
  const sink = useLoad(() => (id ? get<Sink>(`/api/forwarding/sink/${id}`) : Promise.resolve(null)), [id]);
  const profiles = useLoad(() => get<Page<ProfileInfo>>('/api/deviceProfileInfos?pageSize=100&page=0'), []);
  const title = id ? `Edit ${sink.data?.name ?? 'data sink'}` : 'Add data sink';
  if (sink.error) return <Dialog title={title} onClose={() => onClose(false)}><ErrorBox error={sink.error} /><footer><button type="button" class="secondary" onClick={() => onClose(false)}>Close</button></footer></Dialog>;
  if (id && !sink.data) return null;
  return <SinkFields title={title} sink={sink.data} profiles={profiles.data?.data ?? []} profilesError={profiles.error} onClose={onClose} />;
}

/** The ids of the form's elements (one dialog is open at a time). */
const ID = (field: string) => `sink-${field}`;
const ERROR_ID = 'sink-form-error';

function SinkFields({ title, sink, profiles, profilesError, onClose }: {
  title: string; sink: Sink | null; profiles: ProfileInfo[]; profilesError: string | null; onClose: (saved: boolean) => void;
}) {
  const [form, setForm] = useState<SinkForm>(() => formOf(sink));
  const [invalid, setInvalid] = useState<keyof SinkForm | null>(null);
  const action = useAction();
  const set = <K extends keyof SinkForm>(k: K, v: SinkForm[K]) => { setForm((f) => ({ ...f, [k]: v })); if (invalid === k) setInvalid(null); };
  const conf = sink?.configuration ?? {};
  const submit = (e: Event) => {
    e.preventDefault();
    setInvalid(null);
    void action.run(async () => {
      try {
        await post<Sink>('/api/forwarding/sink', bodyOf(form, sink));
      } catch (err) {
        if (err instanceof FieldError) setInvalid(err.field);
        else if (err instanceof ApiError && err.status === 400) setInvalid(fieldOfMessage(err.message, form.type));
        throw err;
      }
      onClose(true);
    });
  };
  /** What marks field `k` as the one the error is about. */
  const mark = (k: keyof SinkForm, hinted = false) => {
    const described = [hinted && ID(`${k}-hint`), invalid === k && ERROR_ID].filter(Boolean).join(' ');
    return { id: ID(k), 'aria-invalid': invalid === k ? true : undefined, 'aria-describedby': described || undefined };
  };
  const text = (k: keyof SinkForm, label: string, opts: { required?: boolean; type?: 'text' | 'url' | 'number' | 'password'; hint?: string; placeholder?: string; autocomplete?: string; min?: number; max?: number } = {}) => (
    <div>
      <label for={ID(k)}>{label}</label>
      <input type={(opts.type ?? 'text') as 'text'} name={k} required={opts.required} placeholder={opts.placeholder} autocomplete={opts.autocomplete}
        min={opts.min} max={opts.max} value={form[k] as string} onInput={(e) => set(k, e.currentTarget.value as never)} {...mark(k, Boolean(opts.hint))} />
      {opts.hint && <small id={ID(`${k}-hint`)}>{opts.hint}</small>}
    </div>
  );
  /** A write-only secret: empty keeps the stored one. */
  const secret = (k: 'secret' | 'password', label: string, isSet: boolean, hint: string) =>
    text(k, label, { type: 'password', autocomplete: 'new-password', placeholder: isSet ? 'set (leave empty to keep it)' : 'not set', hint: `${hint} ${isSet ? 'One is set; it is never shown. Type a new one to replace it.' : ''}`.trim() });
  const toggle = (k: 'events' | 'profiles', v: string, on: boolean) => set(k, on ? [...form[k], v] : form[k].filter((x) => x !== v));
  const known = new Set(profiles.map((p) => p.id.id));
  const unknownProfiles = form.profiles.filter((p) => !known.has(p));
  return (
    <Dialog title={title} onClose={() => onClose(false)}>
      <form onSubmit={submit}>
        <label>Name
          <input name="name" required value={form.name} onInput={(e) => set('name', e.currentTarget.value)} {...mark('name')} />
        </label>
        <div class="grid">
          <div>
            <label for={ID('type')}>Type</label>
            <select id={ID('type')} name="type" value={form.type} onChange={(e) => set('type', e.currentTarget.value as SinkType)}>
              {SINK_TYPES.map(([v, l]) => <option value={v}>{l}</option>)}
            </select>
          </div>
          <label class="switch-label">
            <input type="checkbox" role="switch" name="enabled" checked={form.enabled} onChange={(e) => set('enabled', e.currentTarget.checked)} />
            Enabled
          </label>
        </div>
        {form.type === 'HTTP' && (
          <fieldset>
            <legend>HTTP endpoint</legend>
            {text('url', 'URL', { required: true, type: 'url', placeholder: 'https://example.com/ingest', hint: 'Each delivery POSTs a JSON array of events here; any 2xx answer acknowledges it.' })}
            <div>
              <label for={ID('headers')}>Headers</label>
              <textarea name="headers" rows={2} placeholder="Authorization: Bearer …" value={form.headers} onInput={(e) => set('headers', e.currentTarget.value)} {...mark('headers', true)} />
              <small id={ID('headers-hint')}>One a line, as Name: value; sent with every POST.</small>
            </div>
            {secret('secret', 'Signing secret', conf.secretSet === true && sink?.type === 'HTTP', 'With a secret, each POST carries X-GridLinks-Timestamp and X-GridLinks-Signature (sha256= an HMAC of the timestamp, a dot and the body).')}
            {text('batchSize', 'Events per POST', { type: 'number', min: 1, max: 1000, placeholder: '100', hint: '1 to 1000; empty: 100.' })}
          </fieldset>
        )}
        {form.type === 'KAFKA' && (
          <fieldset>
            <legend>Kafka topic</legend>
            {text('bootstrapServers', 'Bootstrap servers', { required: true, placeholder: 'kafka-1:9092,kafka-2:9092', hint: 'host:port, comma-separated.' })}
            {text('kafkaTopic', 'Topic', { required: true, hint: 'Each event is a record keyed by its device id (acks=all).' })}
          </fieldset>
        )}
        {form.type === 'MQTT' && (
          <fieldset>
            <legend>MQTT broker</legend>
            <div class="grid">
              {text('host', 'Host', { required: true })}
              {text('port', 'Port', { type: 'number', min: 1, max: 65535, placeholder: '1883' })}
            </div>
            {text('mqttTopic', 'Topic', { placeholder: DEFAULT_MQTT_TOPIC, hint: `Empty: ${DEFAULT_MQTT_TOPIC}. May use ${TOPIC_FIELDS.map((f) => `\${${f}}`).join(', ')}. Published at QoS 1.` })}
            {text('clientId', 'Client id', { placeholder: 'gridlinks-sink-…', hint: 'Empty: gridlinks-sink- and the sink\'s id.' })}
            <div class="grid">
              {text('username', 'User name', { autocomplete: 'off' })}
              {secret('password', 'Password', conf.passwordSet === true && sink?.type === 'MQTT', '')}
            </div>
          </fieldset>
        )}
        <fieldset aria-describedby={invalid === 'events' ? ERROR_ID : undefined}>
          <legend>Events forwarded</legend>
          {SINK_EVENTS.map(([v, l]) => (
            <label><input type="checkbox" name="events" value={v} checked={form.events.includes(v)} onChange={(e) => toggle('events', v, e.currentTarget.checked)} />{l}</label>
          ))}
        </fieldset>
        <fieldset class="profiles" aria-describedby={[ID('profiles-hint'), invalid === 'profiles' && ERROR_ID].filter(Boolean).join(' ')}>
          <legend>Device profiles</legend>
          <small id={ID('profiles-hint')}>The devices of the profiles checked; none checked: every device.</small>
          <ErrorBox error={profilesError} />
          {profiles.map((p) => (
            <label><input type="checkbox" name="profiles" value={p.id.id} checked={form.profiles.includes(p.id.id)} onChange={(e) => toggle('profiles', p.id.id, e.currentTarget.checked)} />{p.name}</label>
          ))}
          {unknownProfiles.map((p) => (
            <label><input type="checkbox" name="profiles" value={p} checked onChange={(e) => toggle('profiles', p, e.currentTarget.checked)} />Profile {p} (not among those listed)</label>
          ))}
        </fieldset>
        {text('keys', 'Keys', { placeholder: 'temperature, humidity', hint: 'Telemetry and attribute keys, comma-separated; empty: every key.' })}
        {action.error && <p role="alert" class="error" id={ERROR_ID}>{action.error}</p>}
        <footer>
          <button type="button" class="secondary" onClick={() => onClose(false)}>Cancel</button>
          <button type="submit" aria-busy={action.busy}>Save</button>
        </footer>
      </form>
    </Dialog>
  );
}
