// The Data forwarding page of the web console, in a real headless Chromium against a real
// gridlinks (default configuration: sinks may not reach private addresses; 192.0.2.1, a
// documentation address, passes that check and answers nothing): an HTTP sink made through
// the form, first refused with the server's 400 message next to the form (a URL that is not
// http(s)); listed with its statistics, which follow a failing delivery without a reload;
// its stored JSON (headers, filter, the secret write-only); edited to disabled (the secret
// kept); the type selector switching the fields; deleted after a confirmation (dismissed
// once); a customer user told the page is for tenant administrators. axe-core checks each
// view. Every wait is for a condition, with a generous timeout; nothing asserts how fast.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { startGridlinks, login, rest, ADMIN_PASSWORD, CHROMIUM, launchChromium, accessible } from './gridlinks.mjs';

const SHOTS = process.env.CONSOLE_SCREENSHOTS ?? join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'target', 'console-screenshots');
/** How long a wait for something the page should show may take on a busy machine. */
const LONG = { timeout: 60_000 };

let server, browser;
before(async () => {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} missing: make test installs Debian's chromium (or set CHROMIUM_BIN)`);
  mkdirSync(SHOTS, { recursive: true });
  server = await startGridlinks();
  browser = await launchChromium(chromium);
});
after(async () => {
  await browser?.close();
  // A sink still enabled holds the server up at SIGTERM (its task keeps the storage writer
  // alive): whatever a failed run left is deleted first, so the failure is reported, not a hang.
  if (server) {
    const jwt = await login(server.base);
    for (const s of (await rest(server.base, jwt, 'GET', '/api/forwarding/sinks?pageSize=100&page=0')).data) {
      await rest(server.base, jwt, 'DELETE', `/api/forwarding/sink/${s.id.id}`);
    }
  }
  await server?.stop();
});

const menu = (page, name) => page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name, exact: true });
const shot = (page, name) => page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });

async function logIn(page, username, password) {
  await page.goto(`${server.base}/`);
  await page.getByLabel('User name').fill(username);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Log in' }).click();
  await page.getByRole('heading', { name: 'Devices' }).waitFor(LONG);
}

/** A customer user of `customerId`, activated with `password`. */
async function customerUser(jwt, customerId, email, password) {
  const user = await rest(server.base, jwt, 'POST', '/api/user?sendActivationMail=false', { email, authority: 'CUSTOMER_USER', customerId: { entityType: 'CUSTOMER', id: customerId } });
  const link = await rest(server.base, jwt, 'GET', `/api/user/${user.id.id}/activationLink`);
  const activateToken = String(link).split('activateToken=')[1];
  const r = await fetch(`${server.base}/api/noauth/activate`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ activateToken, password }) });
  assert.equal(r.status, 200);
}

test('data forwarding: an HTTP sink made, refused, listed with live statistics, disabled and deleted in the console; a customer user is told no', async () => {
  const jwt = await login(server.base);
  const meter = await rest(server.base, jwt, 'POST', '/api/deviceProfile', { name: 'meter' });
  await rest(server.base, jwt, 'POST', '/api/device?accessToken=meter-1-token', { name: 'meter-1', type: 'meter' });
  const acme = await rest(server.base, jwt, 'POST', '/api/customer', { title: 'Acme metering' });
  await customerUser(jwt, acme.id.id, 'cleo@acme.test', 'cleo-secret-1');

  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await logIn(page, 'admin', ADMIN_PASSWORD);

  await menu(page, 'Forwarding').click();
  await page.getByRole('heading', { name: 'Data forwarding', level: 1 }).waitFor();
  await page.getByText('No data sinks yet: nothing is forwarded.').waitFor(LONG);
  await accessible(page, 'empty forwarding page');

  // The form: an HTTP sink whose URL is not http(s) is refused with the server's words, next to the form, the URL marked.
  await page.getByRole('button', { name: 'Add sink' }).click();
  const add = page.getByRole('dialog', { name: 'Add data sink' });
  await add.getByLabel('Name', { exact: true }).fill('Webhook');
  assert.equal(await add.getByLabel('Type').inputValue(), 'HTTP');
  assert.equal(await add.getByRole('switch', { name: 'Enabled' }).isChecked(), true);
  await add.getByLabel('URL').fill('ftp://x');
  await add.getByLabel('Headers').fill('Authorization: Bearer t0k\nX-Plant: north');
  await add.getByLabel('Signing secret').fill('hush-hush');
  assert.equal(await add.getByLabel('Signing secret').getAttribute('type'), 'password');
  await add.getByLabel('Events per POST').fill('50');
  for (const e of ['Telemetry', 'Attributes', 'Alarms']) assert.equal(await add.getByRole('checkbox', { name: e }).isChecked(), true);
  await add.getByRole('checkbox', { name: 'Attributes' }).uncheck();
  await add.getByRole('checkbox', { name: 'meter', exact: true }).check();
  await add.getByLabel('Keys').fill('temperature, humidity');
  await add.getByRole('button', { name: 'Save' }).click();
  await add.getByRole('alert').getByText('configuration.url must be an http(s) URL').waitFor(LONG);
  assert.equal(await add.getByLabel('URL').getAttribute('aria-invalid'), 'true');
  await accessible(page, 'sink form with the server\'s error');
  await shot(page, 'sinks-01-refused');
  assert.equal((await rest(server.base, jwt, 'GET', '/api/forwarding/sinks?pageSize=100&page=0')).totalElements, 0);

  // Corrected: saved, listed.
  await add.getByLabel('URL').fill('http://192.0.2.1/hook');
  assert.equal(await add.getByLabel('URL').getAttribute('aria-invalid'), null);
  await add.getByRole('button', { name: 'Save' }).click();
  await add.waitFor({ state: 'detached', ...LONG });
  const table = page.getByRole('table', { name: 'Data sinks' });
  const row = table.locator('tbody tr', { hasText: 'Webhook' });
  await row.waitFor(LONG);
  assert.equal(await row.getAttribute('data-enabled'), 'true');
  const cell = (col) => row.locator(`td[data-col="${col}"]`).innerText();
  assert.deepEqual([await cell('name'), await cell('type'), await cell('enabled')], ['Webhook\nhttp://192.0.2.1/hook', 'HTTP', 'Yes']);
  assert.equal(await row.locator('[data-col="target"]').innerText(), 'http://192.0.2.1/hook');
  const id = await row.getAttribute('data-sink');

  // What was stored: the form's fields, the filter, and the secret only as secretSet.
  const stored = await rest(server.base, jwt, 'GET', `/api/forwarding/sink/${id}`);
  assert.equal(stored.type, 'HTTP');
  assert.equal(stored.enabled, true);
  assert.deepEqual(stored.configuration, { url: 'http://192.0.2.1/hook', headers: { Authorization: 'Bearer t0k', 'X-Plant': 'north' }, batchSize: 50, secretSet: true });
  assert.deepEqual(stored.filter, { deviceProfileIds: [meter.id.id], events: ['TELEMETRY', 'ALARM'], keys: ['temperature', 'humidity'] });

  // A reading the sink takes: its delivery to 192.0.2.1 fails; the page shows the failed tries, the entry
  // pending and the last error by itself (its statistics are read again while it is open).
  const r = await fetch(`${server.base}/api/v1/meter-1-token/telemetry`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ temperature: 21.5 }) });
  assert.equal(r.status, 200);
  await row.locator('td[data-stat="failed"]').filter({ hasNotText: /^0$/ }).waitFor(LONG);
  await row.locator('td[data-stat="last-error"]').filter({ hasNotText: /^none$/ }).waitFor(LONG);
  assert.match(await row.locator('td[data-stat="pending"]').innerText(), /^[1-9]/);
  assert.equal(await row.locator('td[data-stat="delivered"]').innerText(), '0');
  assert.equal(await row.locator('td[data-stat="dropped"]').innerText(), '0');
  const stats = (await rest(server.base, jwt, 'GET', `/api/forwarding/sink/${id}`)).stats;
  assert.ok(stats.running && stats.failedAttempts >= 1 && stats.lastError, JSON.stringify(stats));
  assert.ok((await row.locator('td[data-stat="last-error"]').innerText()).length > 10);
  await accessible(page, 'forwarding page with a sink');
  await shot(page, 'sinks-02-listed');

  // Edited: the stored fields in the form, the secret shown only as set; disabled, saved.
  await page.getByRole('button', { name: 'Edit Webhook' }).click();
  const edit = page.getByRole('dialog', { name: 'Edit Webhook' });
  await edit.getByLabel('URL').waitFor();
  assert.equal(await edit.getByLabel('URL').inputValue(), 'http://192.0.2.1/hook');
  assert.equal(await edit.getByLabel('Headers').inputValue(), 'Authorization: Bearer t0k\nX-Plant: north');
  assert.equal(await edit.getByLabel('Signing secret').inputValue(), '');
  assert.match(await edit.getByLabel('Signing secret').getAttribute('placeholder'), /^set/);
  assert.equal(await edit.getByLabel('Events per POST').inputValue(), '50');
  assert.equal(await edit.getByRole('checkbox', { name: 'Attributes' }).isChecked(), false);
  assert.equal(await edit.getByRole('checkbox', { name: 'Alarms' }).isChecked(), true);
  assert.equal(await edit.getByRole('checkbox', { name: 'meter', exact: true }).isChecked(), true);
  assert.equal(await edit.getByLabel('Keys').inputValue(), 'temperature, humidity');
  await edit.getByRole('switch', { name: 'Enabled' }).uncheck();
  await accessible(page, 'sink edit form');
  await edit.getByRole('button', { name: 'Save' }).click();
  await edit.waitFor({ state: 'detached', ...LONG });
  await table.locator('tbody tr[data-enabled="false"]', { hasText: 'Webhook' }).waitFor(LONG);
  assert.equal(await cell('enabled'), 'No');
  for (const stat of ['delivered', 'failed', 'dropped', 'pending']) assert.equal(await row.locator(`td[data-stat="${stat}"]`).innerText(), '–');
  const disabled = await rest(server.base, jwt, 'GET', `/api/forwarding/sink/${id}`);
  assert.equal(disabled.enabled, false);
  assert.equal(disabled.configuration.secretSet, true, 'the secret is kept when the form leaves it empty');
  assert.deepEqual(disabled.stats, { running: false });
  await shot(page, 'sinks-03-disabled');

  // The type selector switches the fields: a Kafka sink has servers and a topic, an MQTT sink a broker.
  await page.getByRole('button', { name: 'Add sink' }).click();
  await add.getByLabel('Type').selectOption('KAFKA');
  await add.getByLabel('Bootstrap servers').waitFor();
  assert.equal(await add.getByLabel('URL').count(), 0);
  await add.getByLabel('Type').selectOption('MQTT');
  await add.getByLabel('Host', { exact: true }).waitFor();
  assert.equal(await add.getByLabel('Bootstrap servers').count(), 0);
  assert.equal(await add.getByLabel('Topic', { exact: true }).getAttribute('placeholder'), 'gridlinks/${deviceName}/${type}');
  assert.equal(await add.getByLabel('Password', { exact: true }).getAttribute('type'), 'password');
  await accessible(page, 'MQTT sink form');
  await add.getByRole('button', { name: 'Cancel' }).click();
  await add.waitFor({ state: 'detached' });

  // Deleted after a confirmation: dismissed, the sink stays; accepted, it goes.
  let asked = '';
  page.once('dialog', (d) => { asked = d.message(); void d.dismiss(); });
  await page.getByRole('button', { name: 'Delete Webhook' }).click();
  assert.match(asked, /Delete the data sink Webhook\?/);
  assert.equal((await rest(server.base, jwt, 'GET', '/api/forwarding/sinks?pageSize=100&page=0')).totalElements, 1);
  page.once('dialog', (d) => void d.accept());
  await page.getByRole('button', { name: 'Delete Webhook' }).click();
  await row.waitFor({ state: 'detached', ...LONG });
  await page.getByText('No data sinks yet: nothing is forwarded.').waitFor(LONG);
  assert.equal((await rest(server.base, jwt, 'GET', '/api/forwarding/sinks?pageSize=100&page=0')).totalElements, 0);
  await page.getByRole('button', { name: 'Log out' }).click();

  // A customer user: no menu entry; the page itself says who may use it.
  await logIn(page, 'cleo@acme.test', 'cleo-secret-1');
  assert.equal(await menu(page, 'Forwarding').count(), 0);
  await page.goto(`${server.base}/#/forwarding`);
  await page.getByRole('alert').getByText(/Only tenant administrators may see and change data forwarding/).waitFor(LONG);
  assert.equal(await page.getByRole('button', { name: 'Add sink' }).count(), 0);
  await accessible(page, 'forwarding page refused to a customer user');
  await shot(page, 'sinks-04-customer');
  assert.deepEqual(errors, []);
  await page.close();
});
