// The system page: what the server's /metrics says, read every two seconds; rates and the
// commit latency are over the last interval.
import { useEffect, useRef, useState } from 'preact/hooks';
import { ErrorBox } from '../components';

type Samples = Map<string, number>;

/** The samples of an OpenMetrics text (`name{labels} value` lines). */
function parseMetrics(text: string): Samples {
  const m: Samples = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    m.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return m;
}

interface View {
  connections: [string, number][];
  recordsPerSecond: number | null;
  publishesPerSecond: number | null;
  commitMs: number | null;
  commitP99Ms: number | null;
  storageBytes: number;
  queueDepth: number;
  health: number;
}

/** The upper bound of the bucket holding quantile `q` of what landed between two scrapes. */
function quantile(prev: Samples, cur: Samples, name: string, q: number): number | null {
  const buckets = [...cur.keys()].filter((k) => k.startsWith(`${name}_bucket{`))
    .map((k) => ({ le: Number(k.match(/le="([^"]+)"/)?.[1]), n: (cur.get(k) ?? 0) - (prev.get(k) ?? 0) }))
    .sort((a, b) => a.le - b.le);
  const total = buckets.at(-1)?.n ?? 0;
  if (total <= 0) return null;
  return buckets.find((b) => b.n >= q * total)?.le ?? null;
}

function view(prev: Samples | null, cur: Samples, seconds: number): View {
  const v = (k: string) => cur.get(k) ?? 0;
  const rate = (k: string) => (prev ? (v(k) - (prev.get(k) ?? 0)) / seconds : null);
  const commits = prev ? v('gridlinks_storage_commit_seconds_count') - (prev.get('gridlinks_storage_commit_seconds_count') ?? 0) : 0;
  const commitSum = prev ? v('gridlinks_storage_commit_seconds_sum') - (prev.get('gridlinks_storage_commit_seconds_sum') ?? 0) : 0;
  const p99 = prev ? quantile(prev, cur, 'gridlinks_storage_commit_seconds', 0.99) : null;
  return {
    connections: [
      ['MQTT (TCP and WebSocket)', v('gridlinks_mqtt_connections')],
      ['Custom TCP protocols', v('gridlinks_tcp_connections')],
      ['CoAP observations', v('gridlinks_coap_observations')],
      ['WebSocket API sessions', v('gridlinks_ws_sessions')],
    ],
    recordsPerSecond: rate('gridlinks_storage_records_total'),
    publishesPerSecond: rate('gridlinks_mqtt_publishes_total'),
    commitMs: commits > 0 ? (1000 * commitSum) / commits : null,
    commitP99Ms: p99 === null ? null : p99 * 1000,
    storageBytes: v('gridlinks_storage_bytes'),
    queueDepth: v('gridlinks_storage_queue_depth'),
    health: v('gridlinks_storage_health'),
  };
}

const num = (x: number | null, digits = 1) => (x === null ? '…' : x.toLocaleString(undefined, { maximumFractionDigits: digits }));
const size = (b: number) => (b < 1 << 20 ? `${(b / 1024).toFixed(1)} KiB` : b < 1 << 30 ? `${(b / (1 << 20)).toFixed(1)} MiB` : `${(b / (1 << 30)).toFixed(2)} GiB`);

export function System() {
  const [state, setState] = useState<View | null>(null);
  const [error, setError] = useState<string | null>(null);
  const last = useRef<{ at: number; samples: Samples } | null>(null);
  useEffect(() => {
    let live = true;
    const scrape = async () => {
      try {
        const r = await fetch('/metrics');
        if (!r.ok) throw new Error(`/metrics: ${r.status}`);
        const samples = parseMetrics(await r.text());
        const at = performance.now();
        const prev = last.current;
        if (live) setState(view(prev?.samples ?? null, samples, prev ? (at - prev.at) / 1000 : 1));
        last.current = { at, samples };
        setError(null);
      } catch (e) { if (live) setError((e as Error).message); }
    };
    void scrape();
    const t = setInterval(scrape, 2000);
    return () => { live = false; clearInterval(t); };
  }, []);
  return (
    <section>
      <h1>System</h1>
      <ErrorBox error={error} />
      {state && (
        <div class="grid">
          <article aria-label="Connections">
            <h2>Connections</h2>
            <table><tbody>{state.connections.map(([k, n]) => <tr><th scope="row">{k}</th><td>{num(n, 0)}</td></tr>)}</tbody></table>
          </article>
          <article aria-label="Throughput">
            <h2>Throughput</h2>
            <table><tbody>
              <tr><th scope="row">Records stored / s</th><td data-metric="records">{num(state.recordsPerSecond)}</td></tr>
              <tr><th scope="row">MQTT publishes / s</th><td>{num(state.publishesPerSecond)}</td></tr>
              <tr><th scope="row">Commit time, mean</th><td>{state.commitMs === null ? 'no commits' : `${num(state.commitMs, 2)} ms`}</td></tr>
              <tr><th scope="row">Commit time, p99 (bucket bound)</th><td>{state.commitP99Ms === null ? 'no commits' : `≤ ${num(state.commitP99Ms, 2)} ms`}</td></tr>
            </tbody></table>
          </article>
          <article aria-label="Storage">
            <h2>Storage</h2>
            <table><tbody>
              <tr><th scope="row">On disk</th><td data-metric="storage-bytes">{size(state.storageBytes)}</td></tr>
              <tr><th scope="row">Write queue</th><td>{num(state.queueDepth, 0)}</td></tr>
              <tr><th scope="row">Health</th><td>{['ok', 'disk full', 'failed'][state.health] ?? String(state.health)}</td></tr>
            </tbody></table>
          </article>
        </div>
      )}
    </section>
  );
}
