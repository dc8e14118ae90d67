// Small pieces every page uses: loading a resource, errors, paging, sortable headers, dialogs.
import type { ComponentChildren } from 'preact';
import { useEffect, useRef, useState } from 'preact/hooks';

/** Loads `f()` whenever `deps` change; `reload()` loads again. */
export function useLoad<T>(f: () => Promise<T>, deps: unknown[]): { data: T | null; error: string | null; reload: () => void } {
  const [data, setData] = useState<T | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [n, setN] = useState(0);
  useEffect(() => {
    let live = true;
    f().then((d) => { if (live) { setData(d); setError(null); } }, (e: Error) => { if (live) setError(e.message); });
    return () => { live = false; };
  }, [...deps, n]);
  return { data, error, reload: () => setN((x) => x + 1) };
}

/**
 * A table's box: it scrolls sideways when the table is wider than the screen (a phone), and
 * takes keyboard focus so that it can be scrolled without a pointer.
 */
export function TableBox({ label, children }: { label: string; children: ComponentChildren }) {
  return <div class="overflow-auto" tabIndex={0} role="region" aria-label={`${label} (scrolls sideways)`}>{children}</div>;
}

export function ErrorBox({ error }: { error: string | null }) {
  return error ? <p role="alert" class="error">{error}</p> : null;
}

export function Pager({ page, totalPages, total, setPage }: { page: number; totalPages: number; total: number; setPage: (p: number) => void }) {
  return (
    <nav aria-label="Pages" class="pager">
      <button type="button" class="secondary" disabled={page === 0} onClick={() => setPage(page - 1)}>Previous</button>
      <span>Page {totalPages === 0 ? 0 : page + 1} of {totalPages} ({total} in all)</span>
      <button type="button" class="secondary" disabled={page + 1 >= totalPages} onClick={() => setPage(page + 1)}>Next</button>
    </nav>
  );
}

export interface Sort { property: string; desc: boolean }

/** A column header that sorts the table by `property`. */
export function SortHeader({ label, property, sort, setSort }: { label: string; property: string; sort: Sort; setSort: (s: Sort) => void }) {
  const active = sort.property === property;
  return (
    <th scope="col" aria-sort={active ? (sort.desc ? 'descending' : 'ascending') : 'none'}>
      <button type="button" class="link" onClick={() => setSort({ property, desc: active ? !sort.desc : false })}>
        {label}{active ? (sort.desc ? ' ▼' : ' ▲') : ''}
      </button>
    </th>
  );
}

/** A modal dialog, open while rendered. */
export function Dialog({ title, onClose, children }: { title: string; onClose: () => void; children: ComponentChildren }) {
  const ref = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    const d = ref.current;
    if (d && !d.open) d.showModal();
    return () => d?.close();
  }, []);
  return (
    <dialog ref={ref} aria-label={title} onClose={onClose}>
      <article>
        <header><h2>{title}</h2></header>
        {children}
      </article>
    </dialog>
  );
}

/** Runs an action, keeping its error and whether it runs. */
export function useAction(): { busy: boolean; error: string | null; run: (f: () => Promise<void>) => Promise<void>; setError: (e: string | null) => void } {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const run = async (f: () => Promise<void>) => {
    setBusy(true);
    setError(null);
    try { await f(); } catch (e) { setError((e as Error).message); } finally { setBusy(false); }
  };
  return { busy, error, run, setError };
}

/** The end of a dialog's form: its error, Cancel and Save. */
export function FormEnd({ error, busy, onCancel }: { error: string | null; busy: boolean; onCancel: () => void }) {
  return (
    <>
      <ErrorBox error={error} />
      <footer>
        <button type="button" class="secondary" onClick={onCancel}>Cancel</button>
        <button type="submit" aria-busy={busy}>Save</button>
      </footer>
    </>
  );
}
