// Console benchmark (not part of `make test`; `make bench-console`): against a gridlinks
// (GRIDLINKS_BIN, the release build) holding 1,000 devices,
// - the first load's size: index.html and its assets as a browser gets them (gzip);
// - time to interactive of the device list in headless Chromium, cold (new profile) and
//   warm (cached assets): from navigation start until the first page of rows is rendered
//   and the search box takes input, median of RUNS;
// - a 30,000-row CSV import through the page: click to "30000 created".
// Prints a JSON summary.
import { startGridlinks, login, rest, launchChromium } from './gridlinks.mjs';
import { chromium } from 'playwright-core';

const RUNS = Number(process.env.RUNS ?? 7);
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const server = await startGridlinks({ GRIDLINKS_LOG: 'error' });
try {
  const jwt = await login(server.base);
  const file = Array.from({ length: 1000 }, (_, i) => `dev-${String(i).padStart(4, '0')},sensor,BENCH${i}`).join('\n');
  await rest(server.base, jwt, 'POST', '/api/device/bulk_import',
    { file, mapping: { columns: [{ type: 'NAME' }, { type: 'TYPE' }, { type: 'ACCESS_TOKEN' }], delimiter: ',', update: true, header: false } });

  // First load, as transferred.
  const index = await fetch(`${server.base}/`, { headers: { 'accept-encoding': 'gzip' } });
  const html = await index.text();
  const parts = [['/', Number(index.headers.get('content-length'))]];
  for (const [, path] of html.matchAll(/(?:src|href)="(\/assets\/[^"]+)"/g)) {
    const a = await fetch(`${server.base}${path}`, { headers: { 'accept-encoding': 'gzip' } });
    await a.arrayBuffer();
    parts.push([path, Number(a.headers.get('content-length'))]);
  }
  const firstLoadBytes = parts.reduce((n, [, b]) => n + b, 0);

  const browser = await launchChromium(chromium);
  const tti = async (context) => {
    const page = await context.newPage();
    await page.addInitScript((t) => sessionStorage.setItem('gridlinks.token', t), jwt);
    await page.goto(`${server.base}/#/devices`);
    await page.waitForFunction(() => document.querySelectorAll('tbody tr').length === 20);
    await page.getByLabel('Search devices').fill('dev-0999');
    const ms = await page.evaluate(() => performance.now());
    await page.close();
    return ms;
  };
  const cold = [];
  for (let i = 0; i < RUNS; i++) {
    const context = await browser.newContext();
    cold.push(await tti(context));
    await context.close();
  }
  const warmContext = await browser.newContext();
  await tti(warmContext);
  const warm = [];
  for (let i = 0; i < RUNS; i++) warm.push(await tti(warmContext));
  await warmContext.close();

  // 30,000 rows through the page.
  const page = await browser.newPage();
  await page.addInitScript((t) => sessionStorage.setItem('gridlinks.token', t), jwt);
  await page.goto(`${server.base}/#/import`);
  const csv = ['name,type,token', ...Array.from({ length: 30000 }, (_, i) => `big-${i},sensor,BIG${i}`)].join('\n');
  await page.getByLabel('CSV file').setInputFiles({ name: 'big.csv', mimeType: 'text/csv', buffer: Buffer.from(csv) });
  const t0 = Date.now();
  await page.getByRole('button', { name: 'Import big.csv' }).click();
  await page.getByRole('status').filter({ hasText: '30000 created, 0 updated, 0 with errors.' }).waitFor({ timeout: 120_000 });
  const importMs = Date.now() - t0;
  await browser.close();
  console.log(JSON.stringify({
    firstLoadBytes, parts,
    ttiColdMs: { median: Math.round(median(cold)), all: cold.map(Math.round) },
    ttiWarmMs: { median: Math.round(median(warm)), all: warm.map(Math.round) },
    import30kMs: importMs,
  }, null, 1));
} finally {
  await server.stop();
}
