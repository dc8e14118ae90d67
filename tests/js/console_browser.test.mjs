// The web console in a real headless Chromium (Debian's chromium, driven by playwright-core)
// against a real gridlinks serving it at /: log in, import 1,000 devices from a CSV file and
// watch the progress bar reach 100%, find a device, see its latest value and live chart
// follow an MQTT publish, edit a shared attribute and see it arrive at the
// device subscribed over MQTT, check a customer user sees only its devices, log out; edit a
// customer and a device profile (its provisioning, proved by a device provisioning), build
// a dashboard of widgets that follow a device live, and see it as the customer's user.
// axe-core checks each page for serious accessibility violations. Screenshots are kept in
// target/console-screenshots (CONSOLE_SCREENSHOTS overrides).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import mqtt from 'mqtt';
import { chromium } from 'playwright-core';
import { startGridlinks, login, rest, ADMIN_PASSWORD, CHROMIUM, launchChromium, accessible } from './gridlinks.mjs';

const SHOTS = process.env.CONSOLE_SCREENSHOTS ?? join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'target', 'console-screenshots');

let server, browser;
before(async () => {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} missing: make test installs Debian's chromium (or set CHROMIUM_BIN)`);
  mkdirSync(SHOTS, { recursive: true });
  server = await startGridlinks();
  browser = await launchChromium(chromium);
});
after(async () => {
  await browser?.close();
  await server?.stop();
});

const shot = (page, name) => page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });

async function logIn(page, username, password) {
  await page.goto(`${server.base}/`);
  await page.getByLabel('User name').fill(username);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Log in' }).click();
  await page.getByRole('heading', { name: 'Devices' }).waitFor();
}

test('log in, import 1,000 devices, watch a device live, set a shared attribute, log out', async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));

  await page.goto(`${server.base}/`);
  await page.getByLabel('Password').fill('wrong');
  await page.getByLabel('User name').fill('admin');
  await page.getByRole('button', { name: 'Log in' }).click();
  await page.getByRole('alert').waitFor();
  await accessible(page, 'login');
  await shot(page, '01-login-refused');
  await logIn(page, 'admin', ADMIN_PASSWORD);

  // Import: the columns are guessed from the header; the bar reaches 100%.
  await page.getByRole('link', { name: 'Import' }).click();
  // One bad line in the second chunk (file line 702): its error names the file's line. A
  // quoted cell holds a line break and the header's delimiter; a bad line after it is still
  // numbered as in the file.
  // Every row has a cell for each mapped column (the notes one empty): a short row is an error.
  const rows = Array.from({ length: 1000 }, (_, i) => `dev-${String(i).padStart(4, '0')},sensor,TOKEN${i},`);
  rows.splice(700, 0, 'too,many,cells,here,!');
  rows.splice(800, 0, 'dev-0000-notes,sensor,TOKENN,"line one\r\nline two, ""quoted"""');
  rows.splice(900, 0, 'bad,after,the,notes,!');
  const csv = ['name,type,token,"Notes, free text"', ...rows].join('\r\n');
  const lineOf = (text) => csv.slice(0, csv.indexOf(text)).split('\n').length;
  await page.getByLabel('CSV file').setInputFiles({ name: 'devices.csv', mimeType: 'text/csv', buffer: Buffer.from(csv) });
  assert.equal(await page.getByLabel('Column 3 type').inputValue(), 'ACCESS_TOKEN');
  assert.equal(await page.getByLabel('Column 4 key').inputValue(), 'Notes, free text');
  // Every value the bar shows on its way, as it shows it.
  await page.evaluate(() => {
    globalThis.seen = [];
    new MutationObserver(() => {
      const p = document.querySelector('progress');
      if (p) globalThis.seen.push(Number(p.value));
    }).observe(document.body, { subtree: true, childList: true, attributes: true });
  });
  await page.getByRole('button', { name: 'Import devices.csv' }).click();
  await page.getByRole('status').filter({ hasText: '1001 created, 0 updated, 2 with errors.' }).waitFor({ timeout: 30_000 });
  const bar = page.locator('progress');
  assert.deepEqual([await bar.getAttribute('value'), await bar.getAttribute('max')], ['1003', '1003']);
  await page.getByText('Imported 1003 of 1003 rows (100%)').waitFor();
  const importErrors = await page.locator('ul.errors li').allInnerTexts();
  assert.equal(importErrors.length, 2, importErrors.join('\n'));
  assert.match(importErrors[0], /^Line 702: 5 cells\b.* 4 columns are mapped/);
  assert.match(importErrors[1], new RegExp(`^Line ${lineOf('bad,after')}: 5 cells`));
  assert.equal(lineOf('bad,after'), 903);
  const jwt = await login(server.base);
  const notes = await rest(server.base, jwt, 'GET', '/api/tenant/devices?deviceName=dev-0000-notes');
  const attrs = await rest(server.base, jwt, 'GET', `/api/plugins/telemetry/DEVICE/${notes.id.id}/values/attributes/SERVER_SCOPE`);
  assert.equal(attrs.find((a) => a.key === 'Notes, free text')?.value, 'line one\r\nline two, "quoted"');
  const seen = await page.evaluate(() => globalThis.seen);
  assert.ok(seen.some((v) => v > 0 && v < 1003), `progress moved in steps, not at once: ${seen}`);
  await accessible(page, 'import');
  await shot(page, '02-import-done');

  // The list: 1,001 devices, paged; search finds one.
  await page.getByRole('link', { name: 'Devices' }).click();
  await page.getByText('Page 1 of 51 (1001 in all)').waitFor();
  await page.getByRole('button', { name: 'Name' }).click();
  await page.getByRole('button', { name: 'Name ▼' }).waitFor();
  await page.locator('tbody tr').first().locator('td').first().getByText('dev-0999', { exact: true }).waitFor();
  await page.getByLabel('Search devices').fill('dev-0042');
  await page.getByText('Page 1 of 1 (1 in all)').waitFor();
  await accessible(page, 'device list');
  await shot(page, '03-device-list');
  await page.getByRole('link', { name: 'dev-0042' }).click();
  await page.getByRole('heading', { name: 'dev-0042' }).waitFor();

  // The device publishes over MQTT: the page shows it. (How fast is the bench's question
  // (bench_console.mjs), not a test's: this one waits for what it expects.)
  const device = await mqtt.connectAsync(`mqtt://127.0.0.1:${server.mqttPort}`, { username: 'TOKEN42', clientId: 'dev-0042', reconnectPeriod: 0 });
  await device.subscribeAsync('v1/devices/me/attributes', { qos: 1 });
  await page.getByText('No telemetry yet.').waitFor();
  for (const t of [21.5, 22.25]) {
    await device.publishAsync('v1/devices/me/telemetry', JSON.stringify({ temperature: t }), { qos: 1 });
    await page.locator('tr[data-key="temperature"] td.value', { hasText: String(t) }).waitFor();
  }
  await page.waitForFunction(() => Number(document.querySelector('[aria-label="Live telemetry chart"]')?.dataset.points) >= 2);

  // A shared attribute set on the page reaches the device.
  const pushed = new Promise((resolve) => device.on('message', (topic, payload) => resolve(JSON.parse(payload.toString()))));
  const shared = page.locator('form#SHARED_SCOPE-form');
  await shared.getByLabel('Key').fill('target');
  await shared.getByLabel('Value (JSON or text)').fill('23');
  await shared.getByRole('button', { name: 'Save shared attribute' }).click();
  assert.deepEqual(await Promise.race([pushed, new Promise((_, reject) => setTimeout(() => reject(new Error('no attribute update within 30 s')), 30_000))]), { target: 23 });
  await page.getByRole('table', { name: 'Shared attributes' }).getByText('target').waitFor();
  // An RPC from the page: the device answers, the page shows the reply.
  await device.subscribeAsync('v1/devices/me/rpc/request/+', { qos: 1 });
  device.on('message', (topic, payload) => {
    const m = topic.match(/^v1\/devices\/me\/rpc\/request\/(\d+)$/);
    if (m) device.publish(`v1/devices/me/rpc/response/${m[1]}`, JSON.stringify({ echo: JSON.parse(payload.toString()) }));
  });
  await page.getByLabel('Method').fill('getState');
  await page.getByLabel('Params (JSON)').fill('{"verbose":true}');
  await page.getByRole('button', { name: 'Send RPC' }).click();
  await page.getByLabel('RPC reply').getByText('"method": "getState"').waitFor();
  assert.deepEqual(JSON.parse(await page.getByLabel('RPC reply').innerText()), { echo: { method: 'getState', params: { verbose: true } } });
  await device.endAsync();
  await accessible(page, 'device page');
  await shot(page, '04-device');

  await page.getByRole('link', { name: 'System' }).click();
  await page.getByRole('heading', { name: 'Connections' }).waitFor();
  await page.waitForFunction(() => document.querySelector('[data-metric="records"]')?.textContent !== '…');
  await accessible(page, 'system');
  await shot(page, '05-system');

  await page.getByRole('button', { name: 'Log out' }).click();
  await page.getByRole('button', { name: 'Log in' }).waitFor();
  assert.equal(await page.evaluate(() => sessionStorage.getItem('gridlinks.token')), null);
  assert.deepEqual(errors, []);
  await page.close();
});

/** A customer user of `customerId`, activated with `password`. */
async function customerUser(jwt, customerId, email, password) {
  const user = await rest(server.base, jwt, 'POST', '/api/user?sendActivationMail=false', { email, authority: 'CUSTOMER_USER', customerId: { entityType: 'CUSTOMER', id: customerId } });
  const link = await rest(server.base, jwt, 'GET', `/api/user/${user.id.id}/activationLink`);
  const activateToken = String(link).split('activateToken=')[1];
  const r = await fetch(`${server.base}/api/noauth/activate`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ activateToken, password }) });
  assert.equal(r.status, 200);
}

test('a customer user sees only its customer\'s devices', async () => {
  const jwt = await login(server.base);
  const customer = await rest(server.base, jwt, 'POST', '/api/customer', { title: 'Acme' });
  const mine = await rest(server.base, jwt, 'POST', '/api/device', { name: 'acme-meter', type: 'meter' });
  await rest(server.base, jwt, 'POST', '/api/device', { name: 'not-acmes', type: 'meter' });
  await rest(server.base, jwt, 'POST', `/api/customer/${customer.id.id}/device/${mine.id.id}`);
  await customerUser(jwt, customer.id.id, 'ann@acme.test', 'ann-secret-1');

  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await logIn(page, 'ann@acme.test', 'ann-secret-1');
  await page.getByText('Page 1 of 1 (1 in all)').waitFor();
  assert.deepEqual(await page.locator('tbody tr td:first-child').allInnerTexts(), ['acme-meter']);
  assert.equal(await page.getByRole('link', { name: 'Import' }).count(), 0, 'no tenant pages');
  await accessible(page, 'customer device list');
  await shot(page, '06-customer-user');
  await page.close();
});

test('the entity pages: each passes axe; a customer and an MQTT client with its ACL made through them', async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await logIn(page, 'admin', ADMIN_PASSWORD);
  for (const [link, heading] of [['Customers', 'Customers'], ['Users', 'Users'], ['Profiles', 'Device profiles'], ['Dashboards', 'Dashboards'], ['MQTT clients', 'MQTT application clients']]) {
    await page.getByRole('link', { name: link, exact: true }).click();
    await page.getByRole('heading', { name: heading, exact: true }).waitFor();
    await accessible(page, heading);
  }
  await page.getByRole('button', { name: 'Add' }).click();
  const dialog = page.getByRole('dialog', { name: 'Add MQTT client' });
  await dialog.getByLabel('User name').fill('dash-app');
  await dialog.getByLabel('Password').fill('dash-secret-1');
  await dialog.getByLabel('May publish to (topic filters, comma separated)').fill('app/out/#');
  await dialog.getByLabel('May subscribe to (topic filters, comma separated)').fill('app/in/+, gridlinks/devices/#');
  await accessible(page, 'MQTT client dialog');
  await dialog.getByRole('button', { name: 'Save' }).click();
  await page.getByRole('cell', { name: 'dash-app', exact: true }).waitFor();
  const jwt = await login(server.base);
  const saved = await rest(server.base, jwt, 'GET', '/api/mqtt/clients/dash-app');
  assert.deepEqual([saved.publish, saved.subscribe], [['app/out/#'], ['app/in/+', 'gridlinks/devices/#']]);
  // The credential works, within its ACL.
  const app = await mqtt.connectAsync(`mqtt://127.0.0.1:${server.mqttPort}`, { username: 'dash-app', password: 'dash-secret-1', clientId: 'dash-app-1', reconnectPeriod: 0 });
  assert.equal((await app.subscribeAsync('app/in/x', { qos: 1 }))[0].qos, 1);
  await assert.rejects(app.subscribeAsync('elsewhere/x', { qos: 1 }), /Subscribe error/, 'outside its ACL: refused');
  await app.endAsync();

  await page.getByRole('link', { name: 'Customers', exact: true }).click();
  await page.getByRole('button', { name: 'Add' }).click();
  await page.getByRole('dialog', { name: 'Add customer' }).getByLabel('Title').fill('Globex');
  await page.getByRole('dialog', { name: 'Add customer' }).getByRole('button', { name: 'Save' }).click();
  await page.getByRole('cell', { name: 'Globex', exact: true }).waitFor();
  await shot(page, '07-customers');
  await page.close();
});

test('customers, profiles and dashboards edited in the console; widgets follow a device live; a customer user sees its dashboard', async () => {
  const jwt = await login(server.base);
  const initech = await rest(server.base, jwt, 'POST', '/api/customer', { title: 'Initech', additionalInfo: { tier: 'gold' } });
  const meter = await rest(server.base, jwt, 'POST', '/api/device', { name: 'dash-meter', type: 'meter' });
  const token = (await rest(server.base, jwt, 'GET', `/api/device/${meter.id.id}/credentials`)).credentialsId;
  await customerUser(jwt, initech.id.id, 'bob@initech.test', 'bob-secret-1');
  await rest(server.base, jwt, 'POST', '/api/dashboard', { title: 'Unassigned board', configuration: {} });
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await logIn(page, 'admin', ADMIN_PASSWORD);

  // A customer edited: the form's fields change, what it does not show is kept.
  await page.getByRole('link', { name: 'Customers', exact: true }).click();
  await page.getByRole('button', { name: 'Edit Initech' }).click();
  const editCustomer = page.getByRole('dialog', { name: 'Edit Initech' });
  assert.equal(await editCustomer.getByLabel('Title').inputValue(), 'Initech');
  await editCustomer.getByLabel('Phone').fill('+1 555 0100');
  await editCustomer.getByRole('button', { name: 'Save' }).click();
  await editCustomer.waitFor({ state: 'detached' });
  const customer = await rest(server.base, jwt, 'GET', `/api/customer/${initech.id.id}`);
  assert.deepEqual([customer.title, customer.phone, customer.additionalInfo], ['Initech', '+1 555 0100', { tier: 'gold' }]);

  // A profile with provisioning: a device provisions into it with the key and secret set here.
  await page.getByRole('link', { name: 'Profiles', exact: true }).click();
  await page.getByRole('button', { name: 'Add' }).click();
  const addProfile = page.getByRole('dialog', { name: 'Add device profile' });
  await addProfile.getByLabel('Name').fill('sensors');
  await addProfile.getByLabel('Device provisioning').selectOption('ALLOW_CREATE_NEW_DEVICES');
  await addProfile.getByRole('button', { name: 'Save' }).click();
  await addProfile.getByRole('alert').getByText('Provisioning needs a provision key and secret.').waitFor();
  await addProfile.getByLabel('Provision key').fill('prov-key-1');
  await addProfile.getByLabel('Provision secret').fill('prov-secret-1');
  await accessible(page, 'profile dialog');
  await addProfile.getByRole('button', { name: 'Save' }).click();
  await page.getByRole('cell', { name: 'sensors', exact: true }).waitFor();
  const provision = async () => (await fetch(`${server.base}/api/v1/provision`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ deviceName: `sensor-${Math.random()}`, provisionDeviceKey: 'prov-key-1', provisionDeviceSecret: 'prov-secret-1' }),
  })).json();
  assert.equal((await provision()).status, 'SUCCESS');
  await page.getByRole('button', { name: 'Edit sensors' }).click();
  const editProfile = page.getByRole('dialog', { name: 'Edit sensors' });
  assert.equal(await editProfile.getByLabel('Provision secret').inputValue(), 'prov-secret-1');
  await editProfile.getByLabel('Description').fill('outdoor sensors');
  await editProfile.getByLabel('Device provisioning').selectOption('DISABLED');
  await editProfile.getByRole('button', { name: 'Save' }).click();
  await editProfile.waitFor({ state: 'detached' });
  assert.equal((await provision()).status, 'NOT_FOUND', 'provisioning disabled from the console');
  await page.getByRole('button', { name: 'Make default: sensors' }).click();
  await page.getByRole('row', { name: /sensors/ }).getByRole('cell', { name: 'Yes', exact: true }).waitFor();
  assert.equal((await rest(server.base, jwt, 'GET', '/api/deviceProfileInfo/default')).name, 'sensors');
  await accessible(page, 'profiles');

  // A dashboard for Initech, with a chart and a latest-values widget of dash-meter.
  await page.getByRole('link', { name: 'Dashboards', exact: true }).click();
  await page.getByRole('button', { name: 'Add' }).click();
  const addDashboard = page.getByRole('dialog', { name: 'Add dashboard' });
  await addDashboard.getByLabel('Title').fill('Plant');
  await addDashboard.getByLabel('Description').fill('Line 1 meters');
  await addDashboard.getByLabel(/^Configuration/).fill('{"widgets": ');
  await addDashboard.getByLabel('Initech').check();
  await addDashboard.getByRole('button', { name: 'Save' }).click();
  await addDashboard.getByRole('alert').getByText(/The configuration is not JSON/).waitFor();
  await addDashboard.getByLabel(/^Configuration/).fill('{}');
  await accessible(page, 'dashboard dialog');
  await addDashboard.getByRole('button', { name: 'Save' }).click();
  await page.getByRole('row', { name: /Plant/ }).getByRole('cell', { name: 'Initech', exact: true }).waitFor();
  await page.getByRole('link', { name: 'Plant' }).click();
  await page.getByText('This dashboard has no widgets yet.').waitFor();
  for (const [title, kind] of [['Temperature', 'timeseries'], ['Now', 'latest'], ['Scratch', 'latest']]) {
    await page.getByRole('button', { name: 'Add widget' }).click();
    const add = page.getByRole('dialog', { name: 'Add widget' });
    await add.getByLabel('Title').fill(title);
    await add.getByLabel('Kind').selectOption(kind);
    await add.getByLabel('Device name').fill('dash-meter');
    await add.getByLabel('Keys (comma separated)').fill('temperature, humidity');
    await add.getByRole('button', { name: 'Save' }).click();
    await page.getByRole('article', { name: title }).waitFor();
  }
  page.once('dialog', (d) => d.accept());
  await page.getByRole('button', { name: 'Remove widget: Scratch' }).click();
  await page.getByRole('article', { name: 'Scratch' }).waitFor({ state: 'detached' });
  const publish = async (t) => assert.equal((await fetch(`${server.base}/api/v1/${token}/telemetry`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ temperature: t, humidity: 40 }),
  })).status, 200);
  await publish(21.5);
  await publish(22.5);
  await page.waitForFunction(() => Number(document.querySelector('[aria-label="Temperature: dash-meter"]')?.dataset.points) >= 4);
  await page.getByRole('table', { name: 'Now: dash-meter' }).locator('tr[data-key="temperature"] .value').getByText('22.5').waitFor();
  const stored = await rest(server.base, jwt, 'GET', `/api/dashboard/${(await rest(server.base, jwt, 'GET', '/api/tenant/dashboards?pageSize=10&page=0&textSearch=Plant')).data[0].id.id}`);
  assert.equal(Object.keys(stored.configuration.widgets).length, 2, 'widgets kept in ThingsBoard\'s configuration shape');
  assert.equal(Object.values(stored.configuration.entityAliases)[0].filter.singleEntity.id, meter.id.id);
  await accessible(page, 'dashboard');
  await shot(page, '08-dashboard');
  await page.getByRole('button', { name: 'Log out' }).click();

  // Bob, Initech's user, sees Plant (and not the unassigned board), live.
  await logIn(page, 'bob@initech.test', 'bob-secret-1');
  await page.getByRole('link', { name: 'Dashboards', exact: true }).click();
  await page.getByText('Page 1 of 1 (1 in all)').waitFor();
  assert.deepEqual(await page.locator('tbody tr td:first-child').allInnerTexts(), ['Plant']);
  await page.getByRole('link', { name: 'Plant' }).click();
  // The dashboard is Initech's, the device not yet: its widgets say so and show nothing.
  await page.getByRole('article', { name: 'Now' }).getByRole('alert').getByText("You don't have permission to perform this operation!").waitFor();
  await page.getByRole('article', { name: 'Temperature' }).getByRole('alert').waitFor();
  await shot(page, '09-customer-dashboard-refused');
  await rest(server.base, jwt, 'POST', `/api/customer/${initech.id.id}/device/${meter.id.id}`);
  await page.reload();
  await page.getByRole('table', { name: 'Now: dash-meter' }).locator('tr[data-key="temperature"] .value').getByText('22.5').waitFor();
  assert.equal(await page.getByRole('button', { name: 'Add widget' }).count(), 0, 'a customer user does not edit');
  await publish(23.5);
  await page.getByRole('table', { name: 'Now: dash-meter' }).locator('tr[data-key="temperature"] .value').getByText('23.5').waitFor();
  await accessible(page, 'customer dashboard');
  await shot(page, '10-customer-dashboard');
  assert.deepEqual(errors, []);
  await page.close();
});

test('the console is served from the binary: gzip, caching, a strict Content-Security-Policy', async () => {
  const index = await fetch(`${server.base}/`, { headers: { 'accept-encoding': 'gzip' } });
  assert.equal(index.status, 200);
  assert.equal(index.headers.get('content-encoding'), 'gzip');
  assert.equal(index.headers.get('cache-control'), 'no-cache');
  assert.match(index.headers.get('content-security-policy'), /script-src 'self';.*frame-ancestors 'none'/);
  const html = await index.text();
  const assets = [...html.matchAll(/(?:src|href)="(\/assets\/[^"]+)"/g)].map((m) => m[1]);
  assert.ok(assets.length >= 2, html);
  for (const a of assets) {
    const r = await fetch(`${server.base}${a}`);
    assert.equal(r.status, 200, a);
    assert.equal(r.headers.get('cache-control'), 'public, max-age=31536000, immutable');
    assert.equal(r.headers.get('x-content-type-options'), 'nosniff');
  }
  for (const missing of ['/assets/nope.js', '/assets/..%2F..%2FCargo.toml']) {
    assert.equal((await fetch(`${server.base}${missing}`)).status, 404, missing);
  }
});
