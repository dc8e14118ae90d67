// The console in a real headless Chromium, for what a page left open and a person moving
// around meet: going from one device page to another (by URL and by Back) keeps live data
// flowing and shows nothing of the other device; a dropped live session says so and comes
// back; an access token that expires is renewed (REST and WebSocket) and a login that ends
// says so; "Copy token" without a clipboard shows the token selected; a new user's
// activation link opens a page that sets the password and logs in; at phone width nothing is
// wider than the screen; an RPC failure shows the server's reason.
//
// Every wait is for a condition, with generous timeouts: these run on busy 2-core machines.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import mqtt from 'mqtt';
import { chromium } from 'playwright-core';
import { startGridlinks, login, rest, ADMIN_PASSWORD, CHROMIUM, launchChromium, accessible } from './gridlinks.mjs';


/** Lifetime of an access token on the second server, seconds: a few renewals within a test. */
const SHORT_TTL = 6;
const LONG = { timeout: 60_000 };

let server, shortLived, browser;
before(async () => {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} missing: make test installs Debian's chromium (or set CHROMIUM_BIN)`);
  server = await startGridlinks();
  // Short access tokens, and WebSocket sessions whose token is checked every second.
  shortLived = await startGridlinks({ GRIDLINKS_AUTH_TOKEN_TTL: String(SHORT_TTL), GRIDLINKS_WS_PING_INTERVAL: '1' });
  browser = await launchChromium(chromium);
});
after(async () => {
  await browser?.close();
  await server?.stop();
  await shortLived?.stop();
});

/** A page that collects its JavaScript errors in `page.errors`. */
async function newPage(options = {}) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 }, ...options });
  page.errors = [];
  page.on('pageerror', (e) => page.errors.push(String(e)));
  return page;
}

async function logIn(page, base, username = 'admin', password = ADMIN_PASSWORD) {
  await page.goto(`${base}/`);
  await page.getByLabel('User name').fill(username);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Log in' }).click();
  await page.getByRole('heading', { name: 'Devices' }).waitFor();
}

/** A device with access token `token`; its id. */
async function device(base, jwt, name, token) {
  return (await rest(base, jwt, 'POST', `/api/device?accessToken=${token}`, { name, type: 'meter' })).id.id;
}

/** Telemetry over the HTTP device API. */
async function publish(base, token, values) {
  const r = await fetch(`${base}/api/v1/${token}/telemetry`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(values) });
  assert.equal(r.status, 200);
}

const latest = (page, key, value) => page.locator(`table[aria-label="Latest values"] tr[data-key="${key}"] td.value`, { hasText: String(value) });

test('from one device page to another by URL and by Back: live data follows, nothing of the other device stays', async () => {
  const jwt = await login(server.base);
  const a = await device(server.base, jwt, 'nav-a', 'NAVA');
  const b = await device(server.base, jwt, 'nav-b', 'NAVB');
  // A dashboard charting nav-b, in ThingsBoard's configuration shape.
  const board = await rest(server.base, jwt, 'POST', '/api/dashboard', {
    title: 'Nav board',
    configuration: {
      entityAliases: { al: { id: 'al', alias: 'nav-b', filter: { type: 'singleEntity', singleEntity: { entityType: 'DEVICE', id: b } } } },
      widgets: { w1: { id: 'w1', type: 'timeseries', config: { title: 'Power', datasources: [{ type: 'entity', entityAliasId: 'al', dataKeys: [{ name: 'power', type: 'timeseries' }] }] } } },
    },
  });
  // nav-a answers RPC over MQTT.
  const devA = await mqtt.connectAsync(`mqtt://127.0.0.1:${server.mqttPort}`, { username: 'NAVA', clientId: 'nav-a', reconnectPeriod: 0 });
  await devA.subscribeAsync('v1/devices/me/rpc/request/+', { qos: 1 });
  devA.on('message', (topic, payload) => {
    const m = topic.match(/^v1\/devices\/me\/rpc\/request\/(\d+)$/);
    if (m) devA.publish(`v1/devices/me/rpc/response/${m[1]}`, JSON.stringify({ from: 'nav-a', echo: JSON.parse(payload.toString()) }));
  });

  const page = await newPage();
  await logIn(page, server.base);
  await page.goto(`${server.base}/#/devices/${a}`);
  await page.getByRole('heading', { name: 'nav-a', level: 1 }).waitFor();
  await page.getByText('No telemetry yet.').waitFor();
  await publish(server.base, 'NAVA', { power: 11 });
  await latest(page, 'power', 11).waitFor();
  // State of nav-a's page: its history drawn, an RPC form filled and answered.
  await page.getByRole('button', { name: 'Show' }).click();
  await page.getByRole('img', { name: 'History chart' }).waitFor();
  await page.getByLabel('Method').fill('whoAreYou');
  await page.getByRole('button', { name: 'Send RPC' }).click();
  await page.getByLabel('RPC reply').getByText('"from": "nav-a"').waitFor();

  // By URL to nav-b: its own page, live, with none of nav-a's values, history, form or reply.
  await page.goto(`${server.base}/#/devices/${b}`);
  await page.getByRole('heading', { name: 'nav-b', level: 1 }).waitFor();
  await page.getByText('No telemetry yet.').waitFor();
  assert.equal(await page.getByLabel('Method').inputValue(), '', "nav-a's RPC method is not kept");
  assert.equal(await page.getByLabel('RPC reply').count(), 0, "nav-a's RPC reply is not shown");
  assert.equal(await page.getByRole('img', { name: 'History chart' }).count(), 0, "nav-a's history is not shown");
  await publish(server.base, 'NAVB', { power: 22 });
  await latest(page, 'power', 22).waitFor();
  await page.waitForFunction(() => Number(document.querySelector('[aria-label="Live telemetry chart"]')?.dataset.points) >= 1);

  // Back to nav-a: live again.
  await page.goBack();
  await page.getByRole('heading', { name: 'nav-a', level: 1 }).waitFor();
  await latest(page, 'power', 11).waitFor();
  await publish(server.base, 'NAVA', { power: 12 });
  await latest(page, 'power', 12).waitFor();
  assert.equal(await latest(page, 'power', 22).count(), 0);

  // Forward, and quickly on to the dashboard: its chart follows nav-b.
  await page.goForward();
  await page.getByRole('heading', { name: 'nav-b', level: 1 }).waitFor();
  await page.goto(`${server.base}/#/dashboards/${board.id.id}`);
  await page.getByRole('article', { name: 'Power' }).waitFor();
  await publish(server.base, 'NAVB', { power: 23 });
  await page.waitForFunction(() => Number(document.querySelector('[aria-label="Power: nav-b"]')?.dataset.points) >= 2, null, LONG);

  await devA.endAsync();
  assert.deepEqual(page.errors, [], 'no JavaScript errors (a send on a socket still connecting was one)');
  await page.close();
});

test('a dropped live session is announced, and the page is live again when it is back', async () => {
  const jwt = await login(server.base);
  const id = await device(server.base, jwt, 'drop-meter', 'DROP');
  const page = await newPage();
  // The WebSocket goes through the test, which can drop it and refuse new ones.
  const open = [];
  let refuse = false;
  await page.routeWebSocket(/\/api\/ws$/, (ws) => {
    if (refuse) { ws.close({ code: 4000, reason: 'refused by the test' }); return; }
    open.push({ ws, server: ws.connectToServer() });
  });
  await logIn(page, server.base);
  await page.goto(`${server.base}/#/devices/${id}`);
  await page.getByRole('heading', { name: 'drop-meter', level: 1 }).waitFor();
  await publish(server.base, 'DROP', { level: 1 });
  await latest(page, 'level', 1).waitFor();
  const notice = page.getByRole('alert').filter({ hasText: 'Live data disconnected' });
  assert.equal(await notice.count(), 0);

  refuse = true;
  for (const c of open.splice(0)) { c.server.close(); c.ws.close({ code: 4001, reason: 'dropped by the test' }); }
  await notice.waitFor(LONG);
  await accessible(page, 'disconnected notice');
  refuse = false;
  // Back: the subscriptions are made again, new points arrive, the notice goes.
  await publish(server.base, 'DROP', { level: 2 });
  await latest(page, 'level', 2).waitFor(LONG);
  await notice.waitFor({ state: 'detached', ...LONG });
  assert.deepEqual(page.errors, []);
  await page.close();
});

/** The page's access token. */
const tokenOf = (page) => page.evaluate(() => sessionStorage.getItem('gridlinks.token'));

test('an expiring access token is renewed with the refresh token: live data and REST go on past its lifetime', async () => {
  const jwt = await login(shortLived.base);
  const id = await device(shortLived.base, jwt, 'wall-meter', 'WALL');
  const page = await newPage();
  await logIn(page, shortLived.base);
  await page.goto(`${shortLived.base}/#/devices/${id}`);
  await page.getByRole('heading', { name: 'wall-meter', level: 1 }).waitFor();
  await publish(shortLived.base, 'WALL', { temperature: 1 });
  await latest(page, 'temperature', 1).waitFor();

  // Three renewals: well past the first token's expiry (each comes after 3/4 of a lifetime).
  const seen = new Set([await tokenOf(page)]);
  while (seen.size < 4) {
    await page.waitForFunction((known) => !known.includes(sessionStorage.getItem('gridlinks.token')), [...seen], LONG);
    seen.add(await tokenOf(page));
  }
  assert.ok(!seen.has(null), 'never logged out');
  const first = JSON.parse(Buffer.from([...seen][0].split('.')[1], 'base64url').toString());
  const now = await page.evaluate(() => Date.now() / 1000);
  assert.ok(now > first.exp, `the first token (exp ${first.exp}) has expired (now ${now})`);

  // The WebSocket session followed the new tokens: new points still arrive.
  await publish(shortLived.base, 'WALL', { temperature: 2 });
  await latest(page, 'temperature', 2).waitFor(LONG);
  // And REST calls work.
  await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Devices', exact: true }).click();
  await page.getByRole('link', { name: 'wall-meter' }).waitFor();
  assert.equal(await page.getByRole('alert').count(), 0, 'no error, no notice');
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('a login that ends (its refresh token refused) says so, and logging in again brings the page back', async () => {
  const jwt = await login(shortLived.base);
  const id = await device(shortLived.base, jwt, 'ended-meter', 'ENDED');
  const page = await newPage();
  await logIn(page, shortLived.base);
  await page.goto(`${shortLived.base}/#/devices/${id}`);
  await publish(shortLived.base, 'ENDED', { temperature: 5 });
  await latest(page, 'temperature', 5).waitFor();

  // The login ends elsewhere (as a password change or an administrator would end it).
  const r = await fetch(`${shortLived.base}/api/auth/logout`, { method: 'POST', headers: { 'x-authorization': `Bearer ${await tokenOf(page)}` } });
  assert.equal(r.status, 200);
  await page.getByRole('alert').filter({ hasText: 'Your session has expired' }).waitFor(LONG);
  assert.equal(await tokenOf(page), null);
  await accessible(page, 'session expired');

  // Logging in again returns to the same device page, live.
  await page.getByLabel('User name').fill('admin');
  await page.getByLabel('Password').fill(ADMIN_PASSWORD);
  await page.getByRole('button', { name: 'Log in' }).click();
  await page.getByRole('heading', { name: 'ended-meter', level: 1 }).waitFor();
  await publish(shortLived.base, 'ENDED', { temperature: 6 });
  await latest(page, 'temperature', 6).waitFor(LONG);
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('"Copy token" without a clipboard (plain HTTP from another machine) shows the token, selected', async () => {
  const jwt = await login(server.base);
  await device(server.base, jwt, 'copy-meter', 'COPY-ME-123');
  const page = await newPage();
  // As on http://192.0.2.1:8080/: not a secure context, so no navigator.clipboard.
  await page.addInitScript(() => { Object.defineProperty(Navigator.prototype, 'clipboard', { get: () => undefined, configurable: true }); });
  await logIn(page, server.base);
  assert.equal(await page.evaluate(() => navigator.clipboard), undefined);
  await page.getByLabel('Search devices').fill('copy-meter');
  await page.getByRole('button', { name: 'Copy token of copy-meter' }).click();
  const dialog = page.getByRole('dialog', { name: 'Access token of copy-meter' });
  await dialog.waitFor();
  const field = dialog.getByRole('textbox');
  assert.equal(await field.inputValue(), 'COPY-ME-123');
  // Selected, whole, ready for Ctrl+C.
  await page.waitForFunction(() => {
    const e = document.activeElement;
    return e instanceof HTMLInputElement && e.selectionStart === 0 && e.selectionEnd === e.value.length && e.value === 'COPY-ME-123';
  });
  assert.equal(await page.getByRole('alert').count(), 0, 'no error shown');
  await accessible(page, 'token dialog');
  await dialog.getByRole('button', { name: 'Close' }).click();
  await dialog.waitFor({ state: 'detached' });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test("a new user's activation link opens the console's page: set a password, logged in", async () => {
  const jwt = await login(server.base);
  const user = await rest(server.base, jwt, 'POST', '/api/user?sendActivationMail=false', { email: 'new@plant.test', authority: 'TENANT_ADMIN' });
  const link = String(await rest(server.base, jwt, 'GET', `/api/user/${user.id.id}/activationLink`));
  const token = link.split('activateToken=')[1];
  // The link redirects to the console's page, the token in the fragment.
  const r = await fetch(link, { redirect: 'manual' });
  assert.equal(r.status, 303);
  assert.equal(r.headers.get('location'), `/#/activate?activateToken=${token}`);

  const page = await newPage();
  await page.goto(link);
  await page.getByRole('heading', { name: 'Activate your GridLinks account' }).waitFor();
  await accessible(page, 'activation page');
  await page.getByLabel('New password').fill('plant-secret-1');
  await page.getByLabel('Repeat the password').fill('plant-secret-2');
  await page.getByRole('button', { name: 'Activate and log in' }).click();
  await page.getByRole('alert').getByText('The two passwords differ.').waitFor();
  // The server's refusal is shown as it says it (too short).
  await page.getByLabel('New password').fill('x');
  await page.getByLabel('Repeat the password').fill('x');
  await page.getByRole('button', { name: 'Activate and log in' }).click();
  await page.getByRole('alert').getByText(/Password must be/).waitFor();
  await page.getByLabel('New password').fill('plant-secret-1');
  await page.getByLabel('Repeat the password').fill('plant-secret-1');
  await page.getByRole('button', { name: 'Activate and log in' }).click();
  await page.getByRole('heading', { name: 'Devices' }).waitFor();
  await page.getByText('new@plant.test').waitFor();
  // The password works for a new login; the link does not work twice.
  const again = await fetch(`${server.base}/api/auth/login`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ username: 'new@plant.test', password: 'plant-secret-1' }) });
  assert.equal(again.status, 200);
  const reused = await fetch(`${server.base}/api/noauth/activate`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ activateToken: token, password: 'other-secret-1' }) });
  assert.equal(reused.status, 404);
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('at phone width (390 px) the page is no wider than the screen: the menu wraps, tables scroll in their box', async () => {
  const jwt = await login(server.base);
  const id = await device(server.base, jwt, 'phone-meter-with-a-rather-long-name', 'PHONE');
  await publish(server.base, 'PHONE', { temperature: 21.5, a_long_key_name_for_a_phone_screen: 'a long value that does not fit on a phone screen at all', n: 3 });
  await rest(server.base, jwt, 'POST', `/api/plugins/telemetry/DEVICE/${id}/attributes/SERVER_SCOPE`, { description: 'x'.repeat(120) });
  const page = await newPage({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true });
  await logIn(page, server.base);
  const width = async (what) => {
    const w = await page.evaluate(() => ({ scroll: document.documentElement.scrollWidth, client: document.documentElement.clientWidth }));
    assert.ok(w.scroll <= 390, `${what}: the page is ${w.scroll} px wide at 390 px`);
  };
  await page.getByRole('link', { name: 'phone-meter-with-a-rather-long-name' }).waitFor();
  await width('device list');
  // Every menu entry is on the screen.
  for (const box of await page.getByRole('navigation', { name: 'Main' }).getByRole('link').evaluateAll((ls) => ls.map((l) => l.getBoundingClientRect().right))) {
    assert.ok(box <= 390, `a menu entry ends at ${box} px`);
  }
  await page.goto(`${server.base}/#/devices/${id}`);
  await latest(page, 'temperature', 21.5).waitFor();
  await page.getByRole('table', { name: 'Server attributes' }).getByText('description').waitFor();
  await page.waitForFunction(() => Number(document.querySelector('[aria-label="Live telemetry chart"]')?.dataset.points) >= 1);
  await width('device page');
  await accessible(page, 'device page at phone width');
  for (const [path, heading] of [['/alarms', 'Alarms'], ['/users', 'Users'], ['/customers', 'Customers'], ['/dashboards', 'Dashboards'], ['/mqtt', 'MQTT application clients'], ['/import', 'Import devices from CSV'], ['/system', 'System']]) {
    await page.goto(`${server.base}/#${path}`);
    await page.getByRole('heading', { name: heading, exact: true, level: 1 }).waitFor();
    await width(heading);
  }
  await accessible(page, 'system page at phone width');
  assert.deepEqual(page.errors, []);
  await page.close();
});

test("an RPC failure shows the server's reason, not a bare status", async () => {
  const jwt = await login(server.base);
  const id = await device(server.base, jwt, 'rpc-offline', 'RPCOFF');
  const page = await newPage();
  await logIn(page, server.base);
  await page.goto(`${server.base}/#/devices/${id}`);
  await page.getByLabel('Method').fill('reboot');
  await page.getByRole('button', { name: 'Send RPC' }).click();
  const alert = page.getByRole('alert').filter({ hasText: 'not connected' });
  await alert.waitFor();
  assert.doesNotMatch(await alert.innerText(), /^409/);
  assert.deepEqual(page.errors, []);
  await page.close();
});
