// Data forwarding's sinks as the console edits them (`/api/forwarding/sink`, docs/forwarding.md):
// the API's JSON, the form's flat fields, and the conversions between the two. Secrets
// (an HTTP sink's `secret`, an MQTT sink's `password`) are write-only: the API says only
// `secretSet` / `passwordSet`, and a save that leaves them out keeps the stored ones.
import type { EntityId } from './api';

export const SINK_TYPES = [['HTTP', 'HTTP endpoint'], ['KAFKA', 'Kafka topic'], ['MQTT', 'MQTT broker']] as const;
export type SinkType = typeof SINK_TYPES[number][0];

/** The event types a sink may take, with how the page names them. */
export const SINK_EVENTS = [['TELEMETRY', 'Telemetry'], ['ATTRIBUTES', 'Attributes'], ['ALARM', 'Alarms']] as const;

/** The fields an MQTT sink's topic template may use. */
export const TOPIC_FIELDS = ['deviceId', 'deviceName', 'deviceType', 'tenantId', 'type'];
export const DEFAULT_MQTT_TOPIC = 'gridlinks/${deviceName}/${type}';

/** A sink's delivery statistics, since the server started; only `running` while it does not run (disabled). */
export interface SinkStats {
  running: boolean; deliveredEvents?: number; failedAttempts?: number; droppedEntries?: number; pendingEntries?: number;
  lastDeliveryTime?: number; lastLagMs?: number; lastError?: string | null; lastErrorTime?: number | null;
}

export interface SinkFilter { deviceProfileIds?: string[] | null; events?: string[] | null; keys?: string[] | null }

export interface Sink {
  id: EntityId; name: string; createdTime: number; type: SinkType; enabled?: boolean;
  configuration: Record<string, unknown>; filter?: SinkFilter | null; stats?: SinkStats;
}

/** What the form holds: texts as typed, the event types and profiles checked. */
export interface SinkForm {
  name: string; type: SinkType; enabled: boolean;
  url: string; headers: string; secret: string; batchSize: string;
  bootstrapServers: string; kafkaTopic: string;
  host: string; port: string; mqttTopic: string; clientId: string; username: string; password: string;
  events: string[]; profiles: string[]; keys: string;
}

const str = (v: unknown) => (v === undefined || v === null ? '' : String(v));

/** The form of a stored sink, or of a new one (`null`: HTTP, enabled, every event). */
export function formOf(s: Sink | null): SinkForm {
  const c = s?.configuration ?? {};
  const type = s?.type ?? 'HTTP';
  const headers = type === 'HTTP' && c.headers && typeof c.headers === 'object'
    ? Object.entries(c.headers as Record<string, unknown>).map(([k, v]) => `${k}: ${str(v)}`).join('\n') : '';
  const events = s?.filter?.events?.length ? s.filter.events : SINK_EVENTS.map(([e]) => e);
  return {
    name: s?.name ?? '', type, enabled: s?.enabled !== false,
    url: type === 'HTTP' ? str(c.url) : '', headers, secret: '', batchSize: type === 'HTTP' ? str(c.batchSize) : '',
    bootstrapServers: type === 'KAFKA' ? str(c.bootstrapServers) : '', kafkaTopic: type === 'KAFKA' ? str(c.topic) : '',
    host: type === 'MQTT' ? str(c.host) : '', port: type === 'MQTT' ? str(c.port) : '', mqttTopic: type === 'MQTT' ? str(c.topic) : '',
    clientId: type === 'MQTT' ? str(c.clientId) : '', username: type === 'MQTT' ? str(c.username) : '', password: '',
    events: [...events], profiles: [...(s?.filter?.deviceProfileIds ?? [])], keys: (s?.filter?.keys ?? []).join(', '),
  };
}

/** A number typed into the form, sent as a number when it is one (else as typed, for the server to refuse by name). */
const numberOr = (t: string): unknown => (/^\s*\d+\s*$/.test(t) ? Number(t) : t.trim());

/** `Name: value` lines as a headers object; throws naming the first line that is not one. */
export function parseHeaders(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  text.split('\n').forEach((line, i) => {
    if (!line.trim()) return;
    const at = line.indexOf(':');
    if (at <= 0) throw new FieldError('headers', `Headers, line ${i + 1}: write each header as "Name: value".`);
    out[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  });
  return out;
}

/** A problem the form finds before sending: which field (`SinkForm` key) and why. */
export class FieldError extends Error {
  constructor(readonly field: keyof SinkForm, message: string) { super(message); }
}

/**
 * The JSON to POST for form `f`: the stored sink `base` (its id and any field the form does
 * not show) with the form's fields over it. Empty optional fields are left out, so the
 * server's defaults apply; empty secrets are left out, so the stored ones are kept.
 */
export function bodyOf(f: SinkForm, base: Sink | null): Record<string, unknown> {
  let configuration: Record<string, unknown>;
  const opt = (o: Record<string, unknown>) => Object.fromEntries(Object.entries(o).filter(([, v]) => v !== '' && v !== undefined));
  switch (f.type) {
    case 'HTTP': {
      const headers = parseHeaders(f.headers);
      configuration = opt({
        url: f.url.trim(), headers: Object.keys(headers).length ? headers : undefined, secret: f.secret,
        batchSize: f.batchSize.trim() ? numberOr(f.batchSize) : undefined,
      });
      break;
    }
    case 'KAFKA':
      configuration = opt({ bootstrapServers: f.bootstrapServers.replace(/\s+/g, ''), topic: f.kafkaTopic.trim() });
      break;
    case 'MQTT':
      configuration = opt({
        host: f.host.trim(), port: f.port.trim() ? numberOr(f.port) : undefined, topic: f.mqttTopic.trim(),
        clientId: f.clientId.trim(), username: f.username, password: f.password,
      });
      break;
  }
  if (f.events.length === 0) throw new FieldError('events', 'Choose at least one kind of event to forward.');
  const keys = f.keys.split(',').map((k) => k.trim()).filter(Boolean);
  // The stored sink's other fields are kept; its statistics are not the sink's to send.
  const kept: Record<string, unknown> = { ...(base ?? {}) };
  delete kept.stats;
  return {
    ...kept, name: f.name.trim(), type: f.type, enabled: f.enabled, configuration,
    filter: { deviceProfileIds: f.profiles, events: SINK_EVENTS.map(([e]) => e).filter((e) => f.events.includes(e)), keys },
  };
}

/**
 * The form field a server's 400 message is about (its messages start with the JSON path,
 * `configuration.url …`, or name the address refused), if one can be told.
 */
export function fieldOfMessage(message: string, type: SinkType): keyof SinkForm | null {
  const m = message.match(/^(configuration|filter)\.(\w+)/);
  if (m) {
    const [, part, key] = m;
    if (part === 'filter') return key === 'deviceProfileIds' ? 'profiles' : key === 'events' ? 'events' : key === 'keys' ? 'keys' : null;
    if (key === 'topic') return type === 'KAFKA' ? 'kafkaTopic' : 'mqttTopic';
    const known: (keyof SinkForm)[] = ['url', 'headers', 'secret', 'batchSize', 'bootstrapServers', 'host', 'port', 'clientId', 'username', 'password'];
    return (known as string[]).includes(key) ? key as keyof SinkForm : null;
  }
  if (/name should be specified/i.test(message)) return 'name';
  if (/Device profile with id/.test(message)) return 'profiles';
  // "host:port: the address is loopback, private or link-local (…)": where the sink sends.
  if (/the address is loopback, private or link-local/.test(message)) return type === 'HTTP' ? 'url' : type === 'KAFKA' ? 'bootstrapServers' : 'host';
  return null;
}

/** Where a sink sends, in a few words. */
export function targetOf(s: Sink): string {
  const c = s.configuration ?? {};
  switch (s.type) {
    case 'HTTP': return str(c.url);
    case 'KAFKA': return `${str(c.topic)} @ ${str(c.bootstrapServers)}`;
    case 'MQTT': return `${str(c.host)}:${str(c.port ?? 1883)} ${str(c.topic ?? DEFAULT_MQTT_TOPIC)}`;
    default: return '';
  }
}
