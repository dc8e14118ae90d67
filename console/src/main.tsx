// GridLinks' web console: log in, then the pages of the hash route (#/devices, …). Served by
// the gridlinks binary at /, talking to its REST and WebSocket APIs on the same origin.
import '@picocss/pico/css/pico.min.css';
import './style.css';
import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { activate, get, login, logout, session, type User } from './api';
import { ErrorBox, useAction } from './components';
import { closeLive, useLiveStatus } from './live';
import { Alarms } from './pages/alarms';
import { DevicePage } from './pages/device';
import { Devices } from './pages/devices';
import { DashboardPage, Dashboards } from './pages/dashboards';
import { Customers, MqttClients, Profiles, Users } from './pages/entities';
import { Forwarding } from './pages/forwarding';
import { Import } from './pages/import';
import { System } from './pages/system';

function useRoute(): string {
  const [route, setRoute] = useState(location.hash.slice(1) || '/devices');
  useEffect(() => {
    const on = () => setRoute(location.hash.slice(1) || '/devices');
    addEventListener('hashchange', on);
    return () => removeEventListener('hashchange', on);
  }, []);
  return route;
}

function Login({ onIn, expired }: { onIn: () => void; expired: boolean }) {
  const [username, setUsername] = useState('');
  const [password, setPassword] = useState('');
  const action = useAction();
  return (
    <main class="container login">
      <article>
        <h1>GridLinks</h1>
        {expired && !action.error && <p role="alert" class="notice">Your session has expired and live data has stopped: log in again to go on.</p>}
        <form onSubmit={(e) => { e.preventDefault(); void action.run(async () => { await login(username, password); onIn(); }); }}>
          <label>User name<input name="username" autocomplete="username" required value={username} onInput={(e) => setUsername(e.currentTarget.value)} /></label>
          <label>Password<input name="password" type="password" autocomplete="current-password" required value={password} onInput={(e) => setPassword(e.currentTarget.value)} /></label>
          <ErrorBox error={action.error} />
          <button type="submit" aria-busy={action.busy}>Log in</button>
        </form>
      </article>
    </main>
  );
}

/** The page of a new user's activation link (`#/activate?activateToken=`): choose a password, which activates the account and logs in. */
function Activate({ activateToken, onIn }: { activateToken: string; onIn: () => void }) {
  const [password, setPassword] = useState('');
  const [again, setAgain] = useState('');
  const action = useAction();
  const submit = (e: Event) => {
    e.preventDefault();
    void action.run(async () => {
      if (password !== again) throw new Error('The two passwords differ.');
      await activate(activateToken, password);
      location.hash = '#/devices';
      onIn();
    });
  };
  return (
    <main class="container login">
      <article>
        <h1>Activate your GridLinks account</h1>
        {!activateToken ? <p role="alert" class="error">This activation link has no token: ask your administrator for a new link.</p> : (
          <form onSubmit={submit}>
            <label>New password<input name="password" type="password" autocomplete="new-password" required value={password} onInput={(e) => setPassword(e.currentTarget.value)} /></label>
            <label>Repeat the password<input name="again" type="password" autocomplete="new-password" required value={again} onInput={(e) => setAgain(e.currentTarget.value)} /></label>
            <ErrorBox error={action.error} />
            <button type="submit" aria-busy={action.busy}>Activate and log in</button>
          </form>
        )}
      </article>
    </main>
  );
}

/** Said while live data is stopped because the WebSocket session dropped; gone when it is back. */
function LiveNotice() {
  const status = useLiveStatus();
  return status === 'reconnecting' ? <p role="alert" class="notice live-notice">Live data disconnected: reconnecting… (what is shown is not updating)</p> : null;
}

const TENANT_PAGES: [string, string][] = [
  ['/devices', 'Devices'], ['/alarms', 'Alarms'], ['/import', 'Import'], ['/customers', 'Customers'], ['/users', 'Users'],
  ['/profiles', 'Profiles'], ['/dashboards', 'Dashboards'], ['/mqtt', 'MQTT clients'], ['/forwarding', 'Forwarding'], ['/system', 'System'],
];

function Page({ route, me }: { route: string; me: User }) {
  const admin = me.authority === 'TENANT_ADMIN';
  // Keyed by id: another device's (or dashboard's) page starts afresh, none of its state kept.
  const device = route.match(/^\/devices\/([0-9a-f-]{36})$/);
  if (device) return <DevicePage key={device[1]} id={device[1]} me={me} />;
  const dashboard = route.match(/^\/dashboards\/([0-9a-f-]{36})$/);
  if (dashboard) return <DashboardPage key={dashboard[1]} id={dashboard[1]} me={me} />;
  if (route === '/dashboards') return <Dashboards me={me} />;
  if (route === '/alarms') return <Alarms />;
  // Not in a customer user's menu; opened anyway, the page says the server refuses it (403).
  if (route === '/forwarding') return <Forwarding />;
  switch (admin ? route : '/devices') {
    case '/import': return <Import />;
    case '/customers': return <Customers />;
    case '/users': return <Users me={me} />;
    case '/profiles': return <Profiles />;
    case '/mqtt': return <MqttClients />;
    case '/system': return <System />;
    default: return <Devices me={me} />;
  }
}

function App() {
  const [me, setMe] = useState<User | null>(null);
  const [signedIn, setSignedIn] = useState(session.token() !== null);
  const [error, setError] = useState<string | null>(null);
  const [expired, setExpired] = useState(false);
  const route = useRoute();
  useEffect(() => { session.onExpired(() => { closeLive(); setMe(null); setSignedIn(false); setExpired(true); }); }, []);
  // Counts logins: logging in again (an activation link opened in a signed-in tab) loads the new user.
  const [logins, setLogins] = useState(0);
  const signIn = () => { setExpired(false); setError(null); setMe(null); setSignedIn(true); setLogins((n) => n + 1); };
  useEffect(() => {
    if (!signedIn) return;
    get<User>('/api/auth/user').then(setMe, (e: Error) => setError(e.message));
  }, [signedIn, logins]);
  const activation = route.match(/^\/activate(?:\?(.*))?$/);
  if (activation) return <Activate activateToken={new URLSearchParams(activation[1] ?? '').get('activateToken') ?? ''} onIn={signIn} />;
  if (!signedIn) return <Login expired={expired} onIn={signIn} />;
  if (!me) return <main class="container"><ErrorBox error={error} />{!error && <p aria-busy="true">Loading…</p>}</main>;
  if (me.authority === 'SYS_ADMIN') {
    return <main class="container"><p role="alert">The console is for tenant administrators and customer users; the system administrator manages tenants over the REST API.</p>
      <button type="button" onClick={() => void logout().then(() => setSignedIn(false))}>Log out</button></main>;
  }
  const pages = me.authority === 'TENANT_ADMIN' ? TENANT_PAGES : TENANT_PAGES.filter(([p]) => p === '/devices' || p === '/alarms' || p === '/dashboards');
  const out = async () => { closeLive(); await logout(); setMe(null); setSignedIn(false); };
  return (
    <>
      <header class="container">
        <nav aria-label="Main" class="main-nav">
          <ul><li><strong>GridLinks</strong></li></ul>
          <ul class="menu">
            {pages.map(([path, label]) => (
              <li><a href={`#${path}`} aria-current={route === path || route.startsWith(`${path}/`) ? 'page' : undefined}>{label}</a></li>
            ))}
            <li><span class="who">{me.email}</span></li>
            <li><button type="button" class="secondary outline" onClick={() => void out()}>Log out</button></li>
          </ul>
        </nav>
      </header>
      <main class="container"><LiveNotice /><Page route={route} me={me} /></main>
    </>
  );
}

render(<App />, document.getElementById('app')!);
