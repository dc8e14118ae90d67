// Alarms in the web console, in a real headless Chromium against a real gridlinks: a device
// profile with alarm rules made over REST, devices posting telemetry that raises alarms;
// the Alarms page shows them live (no reload), filters them, acknowledges one (its status
// changes on the page) and takes a comment (a too long one is refused with the server's
// message); the device list counts each device's active alarms live; the device page lists
// its active alarms and clears one; a dashboard's alarm widgets (one added in the console,
// one in ThingsBoard's exported shape) show the alarms and follow a second one live; a
// customer user sees only its customer's alarms. axe-core checks each view. Every wait is
// for a condition, with a generous timeout; nothing asserts how fast.
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
  await server?.stop();
});

/** An entry of the main menu (the device page's breadcrumb has a Devices link too). */
const menu = (page, name) => page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name, exact: true });

const shot = (page, name) => page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });

async function logIn(page, username, password) {
  await page.goto(`${server.base}/`);
  await page.getByLabel('User name').fill(username);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Log in' }).click();
  await page.getByRole('heading', { name: 'Devices' }).waitFor(LONG);
}

const numeric = (key, operation, value) => ({
  key: { type: 'TIME_SERIES', key }, valueType: 'NUMERIC',
  predicate: { type: 'NUMERIC', operation, value: { defaultValue: value } },
});

/** A boiler: Overheat (CRITICAL) above 90 °C, cleared below 50; Low pressure (MAJOR) below 1 bar, cleared at 1 or more. */
const BOILER = {
  name: 'boiler',
  profileData: {
    configuration: { type: 'DEFAULT' },
    alarms: [
      { id: 'overheat', alarmType: 'Overheat', createRules: { CRITICAL: { condition: { condition: [numeric('temperature', 'GREATER', 90)] } } },
        clearRule: { condition: { condition: [numeric('temperature', 'LESS', 50)] } } },
      { id: 'pressure', alarmType: 'Low pressure', createRules: { MAJOR: { condition: { condition: [numeric('pressure', 'LESS', 1)] } } },
        clearRule: { condition: { condition: [numeric('pressure', 'GREATER_OR_EQUAL', 1)] } } },
    ],
  },
};

async function telemetry(token, values) {
  const r = await fetch(`${server.base}/api/v1/${token}/telemetry`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(values),
  });
  assert.equal(r.status, 200, await r.text());
}

/** A customer user of `customerId`, activated with `password`. */
async function customerUser(jwt, customerId, email, password) {
  const user = await rest(server.base, jwt, 'POST', '/api/user?sendActivationMail=false', { email, authority: 'CUSTOMER_USER', customerId: { entityType: 'CUSTOMER', id: customerId } });
  const link = await rest(server.base, jwt, 'GET', `/api/user/${user.id.id}/activationLink`);
  const activateToken = String(link).split('activateToken=')[1];
  const r = await fetch(`${server.base}/api/noauth/activate`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ activateToken, password }) });
  assert.equal(r.status, 200);
}

test('alarms: the Alarms page live, acknowledge and comment; counts on the device list; the device page; alarm widgets; a customer user', async () => {
  const jwt = await login(server.base);
  await rest(server.base, jwt, 'POST', '/api/deviceProfile', BOILER);
  const b1 = await rest(server.base, jwt, 'POST', '/api/device?accessToken=boiler-1-token', { name: 'boiler-1', type: 'boiler' });
  const b2 = await rest(server.base, jwt, 'POST', '/api/device?accessToken=boiler-2-token', { name: 'boiler-2', type: 'boiler' });
  const acme = await rest(server.base, jwt, 'POST', '/api/customer', { title: 'Acme heating' });
  await rest(server.base, jwt, 'POST', `/api/customer/${acme.id.id}/device/${b2.id.id}`);
  await customerUser(jwt, acme.id.id, 'cara@acme.test', 'cara-secret-1');

  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await logIn(page, 'admin', ADMIN_PASSWORD);

  // The Alarms page, open before any alarm: the one raised next appears without a reload.
  await menu(page, 'Alarms').click();
  await page.getByRole('heading', { name: 'Alarms' }).waitFor();
  await page.getByText('No alarms match these filters.').waitFor(LONG);
  await telemetry('boiler-1-token', { temperature: 99, pressure: 2 });
  const table = page.getByRole('table', { name: 'Alarms', exact: true });
  const overheat = table.locator('tbody tr', { hasText: 'boiler-1' }).filter({ hasText: 'Overheat' });
  await overheat.waitFor(LONG);
  assert.equal(await overheat.locator('[data-severity]').innerText(), 'Critical');
  assert.equal(await overheat.getAttribute('data-status'), 'ACTIVE_UNACK');
  await overheat.getByText('Active, unacknowledged').waitFor();
  assert.equal(await overheat.getByRole('link', { name: 'boiler-1' }).getAttribute('href'), `#/devices/${b1.id.id}`);
  await accessible(page, 'alarms page');
  await shot(page, 'alarms-01-page');

  // Acknowledged on the page: the status changes in place, the button goes.
  await page.getByRole('button', { name: 'Acknowledge Overheat on boiler-1' }).click();
  await table.locator('tbody tr[data-status="ACTIVE_ACK"]', { hasText: 'boiler-1' }).getByText('Active, acknowledged').waitFor(LONG);
  await page.getByRole('button', { name: 'Acknowledge Overheat on boiler-1' }).waitFor({ state: 'detached' });
  assert.equal((await rest(server.base, jwt, 'GET', `/api/alarm/info/${await overheat.getAttribute('data-alarm')}`)).status, 'ACTIVE_ACK');
  // The filters: unacknowledged alarms only, then none of this type, then back to all.
  await page.getByLabel('Acknowledgement').selectOption('UNACK');
  await page.getByText('No alarms match these filters.').waitFor(LONG);
  await page.getByLabel('Acknowledgement').selectOption('');
  await overheat.waitFor(LONG);
  await page.getByLabel('Severity').selectOption('MAJOR');
  await page.getByText('No alarms match these filters.').waitFor(LONG);
  await page.getByLabel('Severity').selectOption('');
  await page.getByLabel('Type').fill('Low pressure');
  await page.getByText('No alarms match these filters.').waitFor(LONG);
  await page.getByLabel('Type').fill('Overheat');
  await overheat.waitFor(LONG);

  // Comments: the system's (acknowledged by …), then one added here; one too long is refused with the server's words.
  await page.getByRole('button', { name: 'Comments on Overheat on boiler-1' }).click();
  const comments = page.getByRole('dialog', { name: 'Comments: Overheat on boiler-1' });
  await comments.getByRole('list', { name: 'Comments' }).getByText(/Alarm was acknowledged by user/).waitFor(LONG);
  await comments.getByLabel('New comment').fill('x'.repeat(10_001));
  await comments.getByRole('button', { name: 'Add comment' }).click();
  await comments.getByRole('alert').getByText(/Alarm comment should be specified: a text of at most 10000 bytes/).waitFor(LONG);
  await comments.getByLabel('New comment').fill('Burner checked, valve replaced.');
  await comments.getByRole('button', { name: 'Add comment' }).click();
  await comments.getByRole('list', { name: 'Comments' }).getByText('Burner checked, valve replaced.').waitFor(LONG);
  assert.equal(await comments.getByLabel('New comment').inputValue(), '');
  await accessible(page, 'comments dialog');
  await shot(page, 'alarms-02-comments');
  await comments.getByRole('button', { name: 'Close' }).click();
  await comments.waitFor({ state: 'detached' });
  const stored = await rest(server.base, jwt, 'GET', `/api/alarm/${await overheat.getAttribute('data-alarm')}/comment?pageSize=10&page=0`);
  assert.ok(stored.data.some((c) => c.type === 'OTHER' && c.comment.text === 'Burner checked, valve replaced.'), JSON.stringify(stored));

  // The device list: each device's active alarms (count and highest severity), live.
  await menu(page, 'Devices').click();
  const cell = (name) => page.getByRole('row', { name: new RegExp(`^${name}\\b`) }).locator('td[data-alarms]');
  await page.getByRole('row', { name: /^boiler-1\b/ }).locator('td[data-alarms="1"][data-severity="CRITICAL"]').waitFor(LONG);
  assert.equal(await cell('boiler-2').getAttribute('data-alarms'), '0');
  await telemetry('boiler-1-token', { pressure: 0.5 });
  await page.getByRole('row', { name: /^boiler-1\b/ }).locator('td[data-alarms="2"][data-severity="CRITICAL"]').waitFor(LONG);
  assert.match(await cell('boiler-1').innerText(), /^2 · Critical$/);
  await accessible(page, 'device list with alarms');
  await shot(page, 'alarms-03-device-list');

  // The device page: its active alarms, live; Low pressure cleared there leaves Overheat.
  await page.getByRole('link', { name: 'boiler-1' }).click();
  const active = page.getByRole('table', { name: 'Active alarms' });
  await active.locator('tbody tr', { hasText: 'Low pressure' }).waitFor(LONG);
  await active.locator('tbody tr', { hasText: 'Overheat' }).waitFor(LONG);
  await page.getByRole('button', { name: 'Clear Low pressure on boiler-1' }).click();
  await active.locator('tbody tr', { hasText: 'Low pressure' }).waitFor({ state: 'detached', ...LONG });
  assert.deepEqual(await active.locator('tbody tr td:nth-child(2)').allInnerTexts(), ['Overheat']);
  await accessible(page, 'device page with alarms');
  await shot(page, 'alarms-04-device');
  await menu(page, 'Devices').click();
  await page.getByRole('row', { name: /^boiler-1\b/ }).locator('td[data-alarms="1"]').waitFor(LONG);

  // A dashboard with an alarm widget in ThingsBoard's exported shape (older filter fields,
  // boiler-2's alias, a time-series column), and one added in the console over all devices.
  const dashboard = await rest(server.base, jwt, 'POST', '/api/dashboard', {
    title: 'Boiler room',
    configuration: {
      widgets: {
        'a1b2c3d4-0000-4000-8000-000000000001': {
          typeFullFqn: 'system.alarm_widgets.alarms_table', type: 'alarm', sizeX: 12, sizeY: 7,
          config: {
            title: 'Boiler 2 alarms', showTitle: true, datasources: [],
            alarmSource: { type: 'entity', name: 'alarms', entityAliasId: 'alias-boiler-2', filterId: null, dataKeys: [
              { name: 'createdTime', type: 'alarm', label: 'Created' }, { name: 'type', type: 'alarm', label: 'Type' },
              { name: 'severity', type: 'alarm', label: 'Severity' }, { name: 'status', type: 'alarm', label: 'Status' },
              { name: 'temperature', type: 'timeseries', label: 'Temperature' },
            ] },
            alarmSearchStatus: 'ANY', alarmsPollingInterval: 5,
            settings: { enableSearch: true, displayPagination: true, defaultPageSize: 10, defaultSortOrder: '-createdTime', allowAcknowledgment: true, allowClear: true },
          },
        },
      },
      entityAliases: {
        'alias-boiler-2': { id: 'alias-boiler-2', alias: 'Boiler 2', filter: { type: 'singleEntity', resolveMultiple: false, singleEntity: { entityType: 'DEVICE', id: b2.id.id } } },
      },
    },
  });
  await rest(server.base, jwt, 'POST', `/api/customer/${acme.id.id}/dashboard/${dashboard.id.id}`);
  await menu(page, 'Dashboards').click();
  await page.getByRole('link', { name: 'Boiler room' }).click();
  await page.getByRole('button', { name: 'Add widget' }).click();
  const add = page.getByRole('dialog', { name: 'Add widget' });
  await add.getByLabel('Title').fill('All alarms');
  await add.getByLabel('Kind').selectOption('alarm');
  await add.getByLabel('Alarms shown').selectOption('ACTIVE');
  await accessible(page, 'add alarm widget dialog');
  await add.getByRole('button', { name: 'Save' }).click();
  const all = page.getByRole('table', { name: 'All alarms: All devices' });
  await all.locator('tbody tr', { hasText: 'boiler-1' }).filter({ hasText: 'Overheat' }).waitFor(LONG);
  const twoTable = page.getByRole('table', { name: 'Boiler 2 alarms: Boiler 2' });
  await page.getByRole('article', { name: 'Boiler 2 alarms' }).getByText('No alarms.').waitFor(LONG);
  // A second alarm, on boiler-2: both widgets show it, without a reload.
  await telemetry('boiler-2-token', { temperature: 95, pressure: 3 });
  await all.locator('tbody tr', { hasText: 'boiler-2' }).filter({ hasText: 'Overheat' }).waitFor(LONG);
  assert.equal(await all.locator('tbody tr').count(), 2);
  const b2row = twoTable.locator('tbody tr', { hasText: 'Overheat' });
  await b2row.waitFor(LONG);
  await b2row.getByRole('cell', { name: '95', exact: true }).waitFor(LONG);
  assert.deepEqual(await twoTable.locator('thead th').allInnerTexts(), ['Created ▼', 'Type', 'Severity', 'Status', 'Temperature', 'Actions']);
  const config = (await rest(server.base, jwt, 'GET', `/api/dashboard/${dashboard.id.id}`)).configuration;
  const added = Object.values(config.widgets).find((w) => w.config.title === 'All alarms');
  assert.deepEqual([added.type, added.typeFullFqn], ['alarm', 'system.alarm_widgets.alarms_table']);
  assert.deepEqual(config.entityAliases[added.config.alarmSource.entityAliasId].filter, { type: 'entityType', resolveMultiple: true, entityType: 'DEVICE' });
  assert.deepEqual(added.config.alarmFilterConfig.statusList, ['ACTIVE']);
  await accessible(page, 'dashboard with alarm widgets');
  await shot(page, 'alarms-05-dashboard');
  await page.getByRole('button', { name: 'Log out' }).click();

  // Acme's user: boiler-2's alarm only, on the Alarms page and on the dashboard's widget over all devices.
  await logIn(page, 'cara@acme.test', 'cara-secret-1');
  await menu(page, 'Alarms').click();
  await table.locator('tbody tr', { hasText: 'boiler-2' }).waitFor(LONG);
  assert.deepEqual(await table.locator('tbody tr td:nth-child(2)').allInnerTexts(), ['boiler-2']);
  await menu(page, 'Dashboards').click();
  await page.getByRole('link', { name: 'Boiler room' }).click();
  await all.locator('tbody tr', { hasText: 'boiler-2' }).waitFor(LONG);
  assert.equal(await all.locator('tbody tr').count(), 1);
  await accessible(page, 'customer alarm views');
  await shot(page, 'alarms-06-customer');
  assert.deepEqual(errors, []);
  await page.close();
});
