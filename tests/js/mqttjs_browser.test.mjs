// MQTT.js in a real headless Chromium (Debian's chromium, driven by playwright-core) against
// a real gridlinks over MQTT/WebSocket: what a browser dashboard does. The page connects to
// ws://127.0.0.1:PORT/mqtt with the browser's own WebSocket, gets a retained message,
// echoes what a Node client publishes at QoS 0, 1 and 2, and its will is published when
// the tab closes without DISCONNECT.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import mqtt from 'mqtt';
import { chromium } from 'playwright-core';
import { startGridlinks, serveMqttPage, CHROMIUM, launchChromium } from './gridlinks.mjs';

let server, web, browser;
before(async () => {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} missing: make test installs Debian's chromium (or set CHROMIUM_BIN)`);
  server = await startGridlinks({ GRIDLINKS_MQTT_ALLOW_ANONYMOUS: 'true' });
  web = await serveMqttPage();
  browser = await launchChromium(chromium);
});
after(async () => {
  await browser?.close();
  web?.close();
  await server?.stop();
});

test('a browser dashboard subscribes, receives retained and live messages, publishes, and leaves a will', async () => {
  const node = await mqtt.connectAsync(`mqtt://127.0.0.1:${server.mqttPort}`, { protocolVersion: 5, clientId: 'node-side', reconnectPeriod: 0 });
  await node.publishAsync('dash/status', 'retained-before-the-page', { qos: 1, retain: true });
  const echoes = [];
  let wills = 0;
  node.on('message', (topic, payload) => (topic === 'dash/will' ? wills++ : echoes.push(payload.toString())));
  await node.subscribeAsync(['dash/out', 'dash/will'], { qos: 2 });

  const page = await browser.newPage();
  await page.goto(`http://127.0.0.1:${web.port}/`);
  const retained = await page.evaluate((url) => new Promise((resolve, reject) => {
    // eslint-disable-next-line no-undef
    const c = mqtt.connect(url, { protocolVersion: 5, clientId: 'browser-dash', reconnectPeriod: 0,
      will: { topic: 'dash/will', payload: 'tab closed', qos: 1, retain: false } });
    window.client = c;
    c.on('error', (e) => reject(String(e)));
    c.on('message', (topic, payload, packet) => {
      if (topic === 'dash/status') resolve({ payload: payload.toString(), retain: packet.retain });
      else c.publish('dash/out', `echo:${payload}:${packet.qos}`, { qos: packet.qos });
    });
    c.on('connect', () => c.subscribe(['dash/status', 'dash/in'], { qos: 2 }, (err) => err && reject(String(err))));
    setTimeout(() => reject('no retained message within 60 s'), 60_000); // a hang guard
  }), `ws://127.0.0.1:${server.wsPort}/mqtt`);
  assert.deepEqual(retained, { payload: 'retained-before-the-page', retain: true });

  for (const qos of [0, 1, 2]) await node.publishAsync('dash/in', `m${qos}`, { qos });
  // Waits end as soon as their condition holds; 60 s is a hang guard.
  const deadline = Date.now() + 60_000;
  while (echoes.length < 3 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  assert.deepEqual(echoes.sort(), ['echo:m0:0', 'echo:m1:1', 'echo:m2:2']);

  // The tab goes away without DISCONNECT: the broker publishes the will.
  await page.close();
  const willDeadline = Date.now() + 60_000;
  while (wills === 0 && Date.now() < willDeadline) await new Promise((r) => setTimeout(r, 20));
  assert.equal(wills, 1);
  await node.endAsync();
});
