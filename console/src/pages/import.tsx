// CSV import: the file's columns mapped to ThingsBoard's column types, then sent in chunks
// to the bulk import API (POST /api/device/bulk_import), each chunk committed before the
// progress bar moves; errors are listed with the file's line numbers.
import { useState } from 'preact/hooks';
import { post } from '../api';
import { ErrorBox, useAction } from '../components';

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

  const lines = (t: string) => t.split(/\r?\n/).filter((l) => l.trim() !== '');
  const remap = (t: string, d: string, h: boolean) => {
    const first = lines(t)[0] ?? '';
    const cells = first.split(d);
    setColumns(cells.map((c, i) => (h ? guess(c) : { type: i === 0 ? 'NAME' : 'SERVER_ATTRIBUTE', key: `column${i + 1}` })));
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
    const body = header ? all.slice(1) : all;
    const firstLine = header ? 2 : 1;
    const size = chunkSize(body.length);
    const sum: Result = { created: 0, updated: 0, errors: 0, errorsList: [] };
    setTotal(body.length);
    setDone(0);
    setResult(null);
    const mapping = { columns: columns.map((c) => (KEYED.has(c.type) ? c : { type: c.type })), delimiter, update: true, header: false };
    for (let start = 0; start < body.length; start += size) {
      const chunk = body.slice(start, start + size);
      const r = await post<Result>('/api/device/bulk_import', { file: chunk.join('\n'), mapping });
      sum.created += r.created;
      sum.updated += r.updated;
      sum.errors += r.errors;
      // "Line N: …" counts within the chunk: numbered as in the file.
      sum.errorsList.push(...r.errorsList.map((e) => e.replace(/^Line (\d+)/, (_, n: string) => `Line ${Number(n) + start + firstLine - 1}`)));
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
          <table aria-label="Column mapping">
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
          </table>
          <button type="button" onClick={() => void run()} aria-busy={action.busy} disabled={action.busy}>Import {fileName}</button>
        </>
      )}
      {total > 0 && (
        <div>
          <label for="import-progress">Imported {done} of {total} lines ({pct}%)</label>
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
