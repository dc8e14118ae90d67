// The entity model's other lists: customers, users, device profiles, dashboards (paged, with
// create and delete), and MQTT application clients with their ACLs.
import type { ComponentChildren } from 'preact';
import { useState } from 'preact/hooks';
import { del, fmtTime, get, post, query, type Customer, type EntityId, type Page, type User } from '../api';
import { Dialog, ErrorBox, FormEnd, Pager, useAction, useLoad } from '../components';

/** A paged list of `path` with a search box, its columns, a create form and deletion. */
function PagedList<T extends { id: EntityId }>({ title, path, columns, name, create, deletePath }: {
  title: string; path: string; columns: [string, (t: T) => ComponentChildren][]; name: (t: T) => string;
  create?: (close: (saved: boolean) => void) => ComponentChildren; deletePath?: (t: T) => string;
}) {
  const [page, setPage] = useState(0);
  const [text, setText] = useState('');
  const [creating, setCreating] = useState(false);
  const list = useLoad(() => get<Page<T>>(`${path}${path.includes('?') ? '&' : '?'}${query({ pageSize: 20, page, textSearch: text })}`), [path, page, text]);
  const action = useAction();
  const remove = (t: T) => {
    if (deletePath && confirm(`Delete ${name(t)}?`)) void action.run(async () => { await del(deletePath(t)); list.reload(); });
  };
  return (
    <section>
      <div class="bar">
        <h1>{title}</h1>
        {create && <button type="button" onClick={() => setCreating(true)}>Add</button>}
      </div>
      <input type="search" aria-label={`Search ${title.toLowerCase()}`} placeholder="Search" value={text} onInput={(e) => { setText(e.currentTarget.value); setPage(0); }} />
      <ErrorBox error={list.error ?? action.error} />
      <table class="striped" aria-label={title}>
        <thead><tr>{columns.map(([h]) => <th scope="col">{h}</th>)}{deletePath && <th scope="col">Actions</th>}</tr></thead>
        <tbody>
          {(list.data?.data ?? []).map((t) => (
            <tr key={t.id.id}>
              {columns.map(([, cell]) => <td>{cell(t)}</td>)}
              {deletePath && <td>{deletePath(t) && <button type="button" class="contrast outline" onClick={() => remove(t)} aria-label={`Delete ${name(t)}`}>Delete</button>}</td>}
            </tr>
          ))}
        </tbody>
      </table>
      {list.data && <Pager page={page} totalPages={list.data.totalPages} total={list.data.totalElements} setPage={setPage} />}
      {creating && create?.((saved) => { setCreating(false); if (saved) list.reload(); })}
    </section>
  );
}

/** A dialog with one form whose fields are text inputs. */
function FormDialog({ title, fields, onSubmit, onClose, children }: {
  title: string; fields: [key: string, label: string, required: boolean, secret?: boolean][]; onSubmit: (values: Record<string, string>) => Promise<void>;
  onClose: (saved: boolean) => void; children?: ComponentChildren;
}) {
  const [values, setValues] = useState<Record<string, string>>({});
  const action = useAction();
  return (
    <Dialog title={title} onClose={() => onClose(false)}>
      <form onSubmit={(e) => { e.preventDefault(); void action.run(async () => { await onSubmit(values); onClose(true); }); }}>
        {fields.map(([key, label, required, secret]) => {
          const props = { required, value: values[key] ?? '', onInput: (e: { currentTarget: HTMLInputElement }) => setValues({ ...values, [key]: e.currentTarget.value }) };
          return <label>{label}{secret ? <input type="password" {...props} /> : <input {...props} />}</label>;
        })}
        {children}
        <FormEnd error={action.error} busy={action.busy} onCancel={() => onClose(false)} />
      </form>
    </Dialog>
  );
}

export function Customers() {
  return (
    <PagedList<Customer> title="Customers" path="/api/customers" name={(c) => c.title}
      columns={[['Title', (c) => c.title], ['Email', (c) => c.email], ['Created', (c) => fmtTime(c.createdTime)]]}
      deletePath={(c) => `/api/customer/${c.id.id}`}
      create={(close) => <FormDialog title="Add customer" fields={[['title', 'Title', true], ['email', 'Email', false]]}
        onSubmit={async (v) => { await post('/api/customer', { title: v.title, email: v.email || null }); }} onClose={close} />} />
  );
}

export function Users({ me }: { me: User }) {
  const [link, setLink] = useState<string | null>(null);
  const [authority, setAuthority] = useState('TENANT_ADMIN');
  const [customer, setCustomer] = useState('');
  const customers = useLoad(() => get<Page<Customer>>('/api/customers?pageSize=1000&page=0'), []);
  return (
    <>
      {link && <div role="status"><p>Activation link (valid 24 hours; no mail is sent):</p><pre>{link}</pre></div>}
      <PagedList<User> title="Users" path="/api/users" name={(u) => u.email}
        columns={[['Email', (u) => u.email], ['Name', (u) => `${u.firstName ?? ''} ${u.lastName ?? ''}`.trim()], ['Authority', (u) => u.authority]]}
        // Not yourself: no Delete on your own row.
        deletePath={(u) => (u.id.id === me.id.id ? '' : `/api/user/${u.id.id}`)}
        create={(close) => (
          <FormDialog title="Add user" fields={[['email', 'Email', true], ['firstName', 'First name', false], ['lastName', 'Last name', false]]}
            onClose={close}
            onSubmit={async (v) => {
              if (authority === 'CUSTOMER_USER' && !customer) throw new Error('Choose the customer.');
              const u = await post<User>('/api/user?sendActivationMail=false', {
                email: v.email, firstName: v.firstName || null, lastName: v.lastName || null, authority,
                customerId: authority === 'CUSTOMER_USER' ? { entityType: 'CUSTOMER', id: customer } : null,
              });
              setLink(await get<string>(`/api/user/${u.id.id}/activationLink`));
            }}>
            <label>Authority
              <select value={authority} onChange={(e) => setAuthority(e.currentTarget.value)}>
                <option value="TENANT_ADMIN">Tenant administrator</option><option value="CUSTOMER_USER">Customer user</option>
              </select>
            </label>
            {authority === 'CUSTOMER_USER' && <label>Customer
              <select required value={customer} onChange={(e) => setCustomer(e.currentTarget.value)}>
                <option value="">Choose…</option>
                {(customers.data?.data ?? []).map((c) => <option value={c.id.id}>{c.title}</option>)}
              </select>
            </label>}
          </FormDialog>
        )} />
    </>
  );
}

interface Profile { id: EntityId; name: string; default: boolean; transportType?: string; type?: string }

export function Profiles() {
  return (
    <PagedList<Profile> title="Device profiles" path="/api/deviceProfileInfos" name={(p) => p.name}
      columns={[['Name', (p) => p.name], ['Transport', (p) => p.transportType], ['Default', (p) => (p.default ? 'Yes' : '')]]}
      deletePath={(p) => `/api/deviceProfile/${p.id.id}`}
      create={(close) => <FormDialog title="Add device profile" fields={[['name', 'Name', true], ['description', 'Description', false]]}
        onSubmit={async (v) => { await post('/api/deviceProfile', { name: v.name, description: v.description || null, type: 'DEFAULT', transportType: 'DEFAULT' }); }} onClose={close} />} />
  );
}

interface Dashboard { id: EntityId; title: string; createdTime: number }

export function Dashboards() {
  return (
    <PagedList<Dashboard> title="Dashboards" path="/api/tenant/dashboards" name={(d) => d.title}
      columns={[['Title', (d) => d.title], ['Created', (d) => fmtTime(d.createdTime)]]}
      deletePath={(d) => `/api/dashboard/${d.id.id}`}
      create={(close) => <FormDialog title="Add dashboard" fields={[['title', 'Title', true]]}
        onSubmit={async (v) => { await post('/api/dashboard', { title: v.title, configuration: {} }); }} onClose={close} />} />
  );
}

interface MqttClient { username: string; clientId: string | null; publish: string[]; subscribe: string[]; createdTime: number }

const filters = (s: string) => s.split(/[\s,]+/).map((f) => f.trim()).filter(Boolean);

export function MqttClients() {
  const list = useLoad(() => get<MqttClient[]>('/api/mqtt/clients'), []);
  const [creating, setCreating] = useState(false);
  const action = useAction();
  const remove = (c: MqttClient) => {
    if (confirm(`Delete MQTT client ${c.username}? Its connections close.`)) {
      void action.run(async () => { await del(`/api/mqtt/clients/${encodeURIComponent(c.username)}`); list.reload(); });
    }
  };
  return (
    <section>
      <div class="bar"><h1>MQTT application clients</h1><button type="button" onClick={() => setCreating(true)}>Add</button></div>
      <p>Applications log in to the broker with these credentials; each may publish and subscribe only within its ACL's topic filters.</p>
      <ErrorBox error={list.error ?? action.error} />
      <table class="striped" aria-label="MQTT application clients">
        <thead><tr><th scope="col">User name</th><th scope="col">Client id</th><th scope="col">May publish to</th><th scope="col">May subscribe to</th><th scope="col">Created</th><th scope="col">Actions</th></tr></thead>
        <tbody>
          {(list.data ?? []).map((c) => (
            <tr key={c.username}>
              <td>{c.username}</td><td>{c.clientId ?? 'any'}</td><td>{c.publish.join(', ')}</td><td>{c.subscribe.join(', ')}</td><td>{fmtTime(c.createdTime)}</td>
              <td><button type="button" class="contrast outline" onClick={() => remove(c)} aria-label={`Delete ${c.username}`}>Delete</button></td>
            </tr>
          ))}
        </tbody>
      </table>
      {creating && <FormDialog title="Add MQTT client"
        fields={[['username', 'User name', true], ['password', 'Password', true, true], ['clientId', 'Client id (empty: any)', false], ['publish', 'May publish to (topic filters, comma separated)', false], ['subscribe', 'May subscribe to (topic filters, comma separated)', false]]}
        onSubmit={async (v) => { await post('/api/mqtt/clients', { username: v.username, password: v.password, clientId: v.clientId || null, publish: filters(v.publish ?? ''), subscribe: filters(v.subscribe ?? '') }); }}
        onClose={(saved) => { setCreating(false); if (saved) list.reload(); }} />}
    </section>
  );
}
