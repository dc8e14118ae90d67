// CSV import: the file's columns mapped to ThingsBoard's column types, then sent in chunks
// to the bulk import API (POST /api/device/bulk_import), each chunk committed before the
// progress bar moves; errors are listed with the file's line numbers. A quoted cell may
// hold line breaks: chunks end between records, never inside one, as the server reads them
// (crates/gridlinks-thingsboard/src/csv.rs).
import { useState } from 'preact/hooks';
import { post } from '../api';
import { ErrorBox, TableBox, useAction } from '../components';

const TYPES = ['NAME', 'TYPE', 'LABEL', 'ACCESS_TOKEN', 'DESCRIPTION', 'IS_GATEWAY', 'SHARED_ATTRIBUTE', 'SERVER_ATTRIBUTE', 'TIMESERIES'];
const KEYED = new Set(['SHARED_ATTRIBUTE', 'SERVER_ATTRIBUTE', 'TIMESERIES']);

interface Column { type: string; key: string }
interface Result { created: number; updated: number; errors: number; errorsList: string[] }

/** A column type guessed from a header cell. */
function guess(header: string): Column {
  const h = header.trim().toLowerCase().replace(/[\s_-]/g, '');
  const by: Record<string, string> = { name: 'NAME', type: 'TYPE', devicetype: 'TYPE', profile: 'TYPE', label: 'LABEL', token: 'ACCESS_TOKEN', accesstoken: 'ACCESS_TOKEN', description: 'DESCRIPTION', gateway: 'IS_GATEWAY', isgateway: 'IS_GATEWAY' };
  return { type: by[h] ?? 'SERVER_ATTRIBUTE', key: header.trim() };
}

/**
 * The file's records as line ranges: [first line, line after the last). A record goes on
 * past a line end only inside a quoted cell; a quote still open at the end of the file
 * leaves its first line a record alone (the server refuses that line). Blank lines are
 * left out.
 */
function records(lines: string[], d: string): [number, number][] {
  const out: [number, number][] = [];
  for (let i = 0; i < lines.length;) {
    let last = i;
    let quoted = false;
    for (;;) {
      quoted = openAfter(lines[last], d, quoted);
      if (!quoted || last + 1 === lines.length) break;
      last += 1;
    }
    const end = quoted ? i + 1 : last + 1;
    if (lines[i].trim() !== '') out.push([i, end]);
    i = end;
  }
  return out;
}

/** Whether a quoted cell is still open at the end of `line`, given whether it was at its start. */
function openAfter(line: string, d: string, quoted: boolean): boolean {
  let state: 'start' | 'quoted' | 'quote' | 'rest' = quoted ? 'quoted' : 'start';
  for (const c of line) {
    if (state === 'quoted') state = c === '"' ? 'quote' : 'quoted';
    else if (state === 'quote') state = c === '"' ? 'quoted' : c === d ? 'start' : 'rest';
    else if (c === d) state = 'start';
    else if (state === 'start' && c === '"') state = 'quoted';
    else if (state === 'start' && c === ' ') state = 'start';
    else state = 'rest';
  }
  return state === 'quoted';
}

/** A record's cells, quotes removed (for the header row's column guesses). */
function cells(record: string, d: string): string[] {
  const out: string[] = [];
  let cell = '';
  let quoted = false;
  for (let i = 0; i < record.length; i++) {
    const c = record[i];
    if (quoted && c === '"' && record[i + 1] === '"') { cell += '"'; i++; }
    else if (c === '"') quoted = !quoted;
    else if (c === d && !quoted) { out.push(cell.trim()); cell = ''; }
    else cell += c;
  }
  return [...out, cell.trim()];
}

/** Rows per request: about 20 steps of progress, at least 500 rows each. */
const chunkSize = (rows: number) => Math.max(500, Math.ceil(rows / 20));

export function Import() {
  const [text, setText] = useState<string | null>(null);
  const [fileName, setFileName] = useState('');
  const [delimiter, setDelimiter] = useState(',');
  const [header, setHeader] = useState(true);
  const [columns, setColumns] = useState<Column[]>([]);
  const [done, setDone] = useState(0);
  const [total, setTotal] = useState(0);
  const [result, setResult] = useState<Result | null>(null);
  const action = useAction();

  const lines = (t: string) => t.split('\n');
  const remap = (t: string, d: string, h: boolean) => {
    const all = lines(t);
    const [first] = records(all, d);
    const header = first ? cells(all.slice(first[0], first[1]).join('\n'), d) : [''];
    setColumns(header.map((c, i) => (h ? guess(c) : { type: i === 0 ? 'NAME' : 'SERVER_ATTRIBUTE', key: `column${i + 1}` })));
  };
  const choose = async (file: File | undefined) => {
    if (!file) return;
    const t = await file.text();
    setFileName(file.name);
    setText(t);
    setResult(null);
    setDone(0);
    remap(t, delimiter, header);
  };
  const run = () => action.run(async () => {
    if (text === null) return;
    const all = lines(text);
    const body = records(all, delimiter).slice(header ? 1 : 0);
    const size = chunkSize(body.length);
    const sum: Result = { created: 0, updated: 0, errors: 0, errorsList: [] };
    setTotal(body.length);
    setDone(0);
    setResult(null);
    const mapping = { columns: columns.map((c) => (KEYED.has(c.type) ? c : { type: c.type })), delimiter, update: true, header: false };
    for (let start = 0; start < body.length; start += size) {
      const chunk = body.slice(start, start + size);
      const firstLine = chunk[0][0];
      const r = await post<Result>('/api/device/bulk_import', { file: all.slice(firstLine, chunk[chunk.length - 1][1]).join('\n'), mapping });
      sum.created += r.created;
      sum.updated += r.updated;
      sum.errors += r.errors;
      // "Line N: …" counts within the chunk, a run of the file's lines: numbered as in the file.
      sum.errorsList.push(...r.errorsList.map((e) => e.replace(/^Line (\d+)/, (_, n: string) => `Line ${Number(n) + firstLine}`)));
      setDone(start + chunk.length);
      setResult({ ...sum, errorsList: [...sum.errorsList] });
    }
  });
  const pct = total ? Math.round((100 * done) / total) : 0;
  return (
    <section>
      <h1>Import devices from CSV</h1>
      <p>One device per line. Map each column to what it holds; a line whose name exists updates that device.</p>
      <div class="grid">
        <label>CSV file<input type="file" accept=".csv,text/csv,text/plain" onChange={(e) => void choose(e.currentTarget.files?.[0])} /></label>
        <label>Delimiter
          <select value={delimiter} onChange={(e) => { setDelimiter(e.currentTarget.value); if (text) remap(text, e.currentTarget.value, header); }}>
            <option value=",">Comma</option><option value=";">Semicolon</option><option value={'\t'}>Tab</option><option value="|">Bar</option>
          </select>
        </label>
        <label><input type="checkbox" checked={header} onChange={(e) => { setHeader(e.currentTarget.checked); if (text) remap(text, delimiter, e.currentTarget.checked); }} /> First line is a header</label>
      </div>
      {text !== null && (
        <>
          <TableBox label="Column mapping"><table aria-label="Column mapping">
            <thead><tr><th scope="col">Column</th><th scope="col">Holds</th><th scope="col">Key</th></tr></thead>
            <tbody>
              {columns.map((c, i) => (
                <tr key={i}>
                  <td>{i + 1}</td>
                  <td><select aria-label={`Column ${i + 1} type`} value={c.type} onChange={(e) => setColumns(columns.map((x, j) => (j === i ? { ...x, type: e.currentTarget.value } : x)))}>
                    {TYPES.map((t) => <option value={t}>{t}</option>)}
                  </select></td>
                  <td><input aria-label={`Column ${i + 1} key`} value={c.key} disabled={!KEYED.has(c.type)} onInput={(e) => setColumns(columns.map((x, j) => (j === i ? { ...x, key: e.currentTarget.value } : x)))} /></td>
                </tr>
              ))}
            </tbody>
          </table></TableBox>
          <button type="button" onClick={() => void run()} aria-busy={action.busy} disabled={action.busy}>Import {fileName}</button>
        </>
      )}
      {total > 0 && (
        <div>
          <label for="import-progress">Imported {done} of {total} rows ({pct}%)</label>
          <progress id="import-progress" value={done} max={total} />
        </div>
      )}
      <ErrorBox error={action.error} />
      {result && (
        <article aria-label="Import result">
          <p role="status">{result.created} created, {result.updated} updated, {result.errors} with errors.</p>
          {result.errorsList.length > 0 && <ul class="errors">{result.errorsList.slice(0, 1000).map((e) => <li>{e}</li>)}</ul>}
        </article>
      )}
    </section>
  );
}
