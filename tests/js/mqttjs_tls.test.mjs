// MQTT.js over TLS: in Node over mqtts:// (trusting the test CA), and in a real headless
// Chromium over wss:// (the browser's own WebSocket; the page's context ignores the test
// CA it does not know, so what is tested is the TLS WebSocket transport). Certificates are
// made here by the openssl command line; GridLinks serves them on mqtt.tls_bind and
// mqtt.wss_bind.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync, existsSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import mqtt from 'mqtt';
import { chromium } from 'playwright-core';
import { startGridlinks, freePort, serveMqttPage, CHROMIUM, launchChromium } from './gridlinks.mjs';

let pki, server, web, browser, tlsPort, wssPort;

function openssl(...args) {
  execFileSync('openssl', args, { cwd: pki, stdio: 'ignore' });
}

before(async () => {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} missing: make test installs Debian's chromium (or set CHROMIUM_BIN)`);
  pki = mkdtempSync(join(tmpdir(), 'gridlinks-js-pki-'));
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  openssl('req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.pem', '-subj', '/CN=js test CA', '-days', '30');
  writeFileSync(join(pki, 'san.ext'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\n');
  openssl('req', '-new', ...ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=localhost');
  openssl('x509', '-req', '-in', 'server.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-days', '30',
    '-extfile', 'san.ext', '-out', 'server.pem');
  [tlsPort, wssPort] = [await freePort(), await freePort()];
  server = await startGridlinks({
    GRIDLINKS_MQTT_ALLOW_ANONYMOUS: 'true',
    GRIDLINKS_TLS_CERT_FILE: join(pki, 'server.pem'),
    GRIDLINKS_TLS_KEY_FILE: join(pki, 'server.key'),
    GRIDLINKS_MQTT_TLS_BIND: `127.0.0.1:${tlsPort}`,
    GRIDLINKS_MQTT_WSS_BIND: `127.0.0.1:${wssPort}`,
  });
  web = await serveMqttPage();
  browser = await launchChromium(chromium);
});
after(async () => {
  await browser?.close();
  web?.close();
  await server?.stop();
  if (pki) rmSync(pki, { recursive: true, force: true });
});

test('MQTT.js in Node over mqtts:// and in Chromium over wss:// exchange messages', async () => {
  // Node: verifies the server certificate against the test CA; a client that trusts
  // nothing else is refused at the handshake.
  await assert.rejects(mqtt.connectAsync(`mqtts://localhost:${tlsPort}`, { reconnectPeriod: 0, connectTimeout: 10_000 }));
  const node = await mqtt.connectAsync(`mqtts://localhost:${tlsPort}`, {
    protocolVersion: 5, clientId: 'node-tls', reconnectPeriod: 0, ca: readFileSync(join(pki, 'ca.pem')),
  });
  const echoes = [];
  node.on('message', (topic, payload) => echoes.push(payload.toString()));
  await node.subscribeAsync('secure/out', { qos: 1 });

  const context = await browser.newContext({ ignoreHTTPSErrors: true });
  const page = await context.newPage();
  await page.goto(`http://127.0.0.1:${web.port}/`);
  await page.evaluate((url) => new Promise((resolve, reject) => {
    // eslint-disable-next-line no-undef
    const c = mqtt.connect(url, { protocolVersion: 5, clientId: 'browser-wss', reconnectPeriod: 0 });
    window.client = c;
    c.on('error', (e) => reject(String(e)));
    c.on('message', (topic, payload, packet) => c.publish('secure/out', `echo:${payload}`, { qos: packet.qos }));
    c.on('connect', () => c.subscribe('secure/in', { qos: 1 }, (err) => (err ? reject(String(err)) : resolve())));
    setTimeout(() => reject('not subscribed within 60 s'), 60_000); // a hang guard
  }), `wss://127.0.0.1:${wssPort}/mqtt`);

  await node.publishAsync('secure/in', 'hello', { qos: 1 });
  const deadline = Date.now() + 60_000; // a hang guard: the wait ends when the echo is there
  while (echoes.length < 1 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  assert.deepEqual(echoes, ['echo:hello']);
  await context.close();
  await node.endAsync();
});
