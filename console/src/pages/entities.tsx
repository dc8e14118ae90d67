// The entity model's other lists: customers, users and device profiles (paged, with create,
// edit and delete; a profile's provisioning strategy and the default profile), and MQTT
// application clients with their ACLs. PagedList serves the dashboards page too.
import type { ComponentChildren } from 'preact';
import { useState } from 'preact/hooks';
import { del, fmtTime, get, post, query, type Customer, type EntityId, type Page, type User } from '../api';
import { Dialog, ErrorBox, FormEnd, Pager, TableBox, useAction, useLoad } from '../components';

/** A paged list of `path` with a search box, its columns, and create, edit and delete forms where given. */
export function PagedList<T extends { id: EntityId }>({ title, path, columns, name, create, edit, deletePath }: {
  title: string; path: string; columns: [string, (t: T) => ComponentChildren][]; name: (t: T) => string;
  create?: (close: (saved: boolean) => void) => ComponentChildren; edit?: (t: T, close: (saved: boolean) => void) => ComponentChildren;
  deletePath?: (t: T) => string;
}) {
  const [page, setPage] = useState(0);
  const [text, setText] = useState('');
  const [creating, setCreating] = useState(false);
  const [editing, setEditing] = useState<T | null>(null);
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
      <TableBox label={title}><table class="striped" aria-label={title}>
        <thead><tr>{columns.map(([h]) => <th scope="col">{h}</th>)}{(edit || deletePath) && <th scope="col">Actions</th>}</tr></thead>
        <tbody>
          {(list.data?.data ?? []).map((t) => (
            <tr key={t.id.id}>
              {columns.map(([, cell]) => <td>{cell(t)}</td>)}
              {(edit || deletePath) && <td class="actions">
                {edit && <button type="button" class="secondary outline" onClick={() => setEditing(t)} aria-label={`Edit ${name(t)}`}>Edit</button>}
                {deletePath?.(t) && <button type="button" class="contrast outline" onClick={() => remove(t)} aria-label={`Delete ${name(t)}`}>Delete</button>}
              </td>}
            </tr>
          ))}
        </tbody>
      </table></TableBox>
      {list.data && <Pager page={page} totalPages={list.data.totalPages} total={list.data.totalElements} setPage={setPage} />}
      {creating && create?.((saved) => { setCreating(false); if (saved) list.reload(); })}
      {editing && edit?.(editing, (saved) => { setEditing(null); if (saved) list.reload(); })}
    </section>
  );
}

/** A dialog with one form whose fields are text inputs, filled from `initial`. */
function FormDialog({ title, fields, initial, onSubmit, onClose, children }: {
  title: string; fields: [key: string, label: string, required: boolean, secret?: boolean][]; initial?: Record<string, string>;
  onSubmit: (values: Record<string, string>) => Promise<void>; onClose: (saved: boolean) => void; children?: ComponentChildren;
}) {
  const [values, setValues] = useState<Record<string, string>>(initial ?? {});
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
      create={(close) => <CustomerForm customer={null} onClose={close} />}
      edit={(c, close) => <CustomerForm customer={c} onClose={close} />} />
  );
}

const CUSTOMER_FIELDS = ['title', 'email', 'phone', 'country', 'city', 'address'] as const;

function CustomerForm({ customer, onClose }: { customer: Customer | null; onClose: (saved: boolean) => void }) {
  const initial = Object.fromEntries(CUSTOMER_FIELDS.map((k) => [k, String(customer?.[k] ?? '')]));
  return (
    <FormDialog title={customer ? `Edit ${customer.title}` : 'Add customer'} initial={initial} onClose={onClose}
      fields={[['title', 'Title', true], ['email', 'Email', false], ['phone', 'Phone', false], ['country', 'Country', false], ['city', 'City', false], ['address', 'Address', false]]}
      onSubmit={async (v) => {
        // The stored customer with the form's fields over it: what the form does not show is kept.
        const base = customer ? await get<Record<string, unknown>>(`/api/customer/${customer.id.id}`) : {};
        await post('/api/customer', { ...base, ...Object.fromEntries(CUSTOMER_FIELDS.map((k) => [k, v[k] || null])) });
      }} />
  );
}

export function Users({ me }: { me: User }) {
  const [link, setLink] = useState<string | null>(null);
  const [authority, setAuthority] = useState('TENANT_ADMIN');
  const [customer, setCustomer] = useState('');
  const customers = useLoad(() => get<Page<Customer>>('/api/customers?pageSize=1000&page=0'), []);
  return (
    <>
      {link && <div role="status"><p>Activation link (valid 24 hours; no mail is sent): it opens the console's page where the user chooses a password.</p><pre class="wrap">{link}</pre></div>}
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
  const action = useAction();
  const [n, setN] = useState(0);
  const makeDefault = (p: Profile) => void action.run(async () => { await post(`/api/deviceProfile/${p.id.id}/default`); setN(n + 1); });
  return (
    <>
      <ErrorBox error={action.error} />
      <PagedList<Profile> key={n} title="Device profiles" path="/api/deviceProfiles" name={(p) => p.name}
        columns={[['Name', (p) => p.name], ['Transport', (p) => p.transportType],
          ['Default', (p) => (p.default ? 'Yes' : <button type="button" class="secondary outline" onClick={() => makeDefault(p)} aria-label={`Make default: ${p.name}`}>Make default</button>)]]}
        deletePath={(p) => `/api/deviceProfile/${p.id.id}`}
        create={(close) => <ProfileForm id={null} onClose={close} />}
        edit={(p, close) => <ProfileForm id={p.id.id} onClose={close} />} />
    </>
  );
}

const PROVISIONING = [
  ['DISABLED', 'Disabled'], ['ALLOW_CREATE_NEW_DEVICES', 'Allow creating new devices'], ['CHECK_PRE_PROVISIONED_DEVICES', 'Check pre-provisioned devices'],
] as const;

interface FullProfile {
  id?: EntityId; name: string; description?: string | null; provisionType?: string; provisionDeviceKey?: string | null;
  profileData?: { provisionConfiguration?: { provisionDeviceSecret?: string | null } } & Record<string, unknown>;
}

/** Creates a profile (`id` null) or edits one: name, description, and how devices provision into it. */
function ProfileForm({ id, onClose }: { id: string | null; onClose: (saved: boolean) => void }) {
  const loaded = useLoad(() => (id ? get<FullProfile>(`/api/deviceProfile/${id}`) : Promise.resolve(null)), [id]);
  if (loaded.error) return <Dialog title="Device profile" onClose={() => onClose(false)}><ErrorBox error={loaded.error} /></Dialog>;
  if (id && !loaded.data) return null;
  return <ProfileFields profile={loaded.data} onClose={onClose} />;
}

function ProfileFields({ profile, onClose }: { profile: FullProfile | null; onClose: (saved: boolean) => void }) {
  const [provisionType, setProvisionType] = useState(profile?.provisionType ?? 'DISABLED');
  const initial = {
    name: profile?.name ?? '', description: profile?.description ?? '', key: profile?.provisionDeviceKey ?? '',
    secret: profile?.profileData?.provisionConfiguration?.provisionDeviceSecret ?? '',
  };
  return (
    <FormDialog title={profile ? `Edit ${profile.name}` : 'Add device profile'} initial={initial} onClose={onClose}
      fields={[['name', 'Name', true], ['description', 'Description', false], ['key', 'Provision key', false], ['secret', 'Provision secret', false]]}
      onSubmit={async (v) => {
        const on = provisionType !== 'DISABLED';
        if (on && !(v.key && v.secret)) throw new Error('Provisioning needs a provision key and secret.');
        const base: FullProfile = profile ?? { name: v.name };
        const profileData = base.profileData ?? {};
        await post('/api/deviceProfile', {
          type: 'DEFAULT', transportType: 'DEFAULT', ...base, name: v.name, description: v.description || null,
          provisionType, provisionDeviceKey: on ? v.key : null,
          profileData: { ...profileData, provisionConfiguration: { type: provisionType, provisionDeviceSecret: on ? v.secret : null } },
        });
      }}>
      <label>Device provisioning
        <select value={provisionType} onChange={(e) => setProvisionType(e.currentTarget.value)}>
          {PROVISIONING.map(([value, label]) => <option value={value}>{label}</option>)}
        </select>
      </label>
    </FormDialog>
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
      <TableBox label="MQTT application clients"><table class="striped" aria-label="MQTT application clients">
        <thead><tr><th scope="col">User name</th><th scope="col">Client id</th><th scope="col">May publish to</th><th scope="col">May subscribe to</th><th scope="col">Created</th><th scope="col">Actions</th></tr></thead>
        <tbody>
          {(list.data ?? []).map((c) => (
            <tr key={c.username}>
              <td>{c.username}</td><td>{c.clientId ?? 'any'}</td><td>{c.publish.join(', ')}</td><td>{c.subscribe.join(', ')}</td><td>{fmtTime(c.createdTime)}</td>
              <td><button type="button" class="contrast outline" onClick={() => remove(c)} aria-label={`Delete ${c.username}`}>Delete</button></td>
            </tr>
          ))}
        </tbody>
      </table></TableBox>
      {creating && <FormDialog title="Add MQTT client"
        fields={[['username', 'User name', true], ['password', 'Password', true, true], ['clientId', 'Client id (empty: any)', false], ['publish', 'May publish to (topic filters, comma separated)', false], ['subscribe', 'May subscribe to (topic filters, comma separated)', false]]}
        onSubmit={async (v) => { await post('/api/mqtt/clients', { username: v.username, password: v.password, clientId: v.clientId || null, publish: filters(v.publish ?? ''), subscribe: filters(v.subscribe ?? '') }); }}
        onClose={(saved) => { setCreating(false); if (saved) list.reload(); }} />}
    </section>
  );
}
