// MQTT.js 5 (the JavaScript MQTT client, as used by browser dashboards and Node services)
// against a real gridlinks: over WebSocket (ws://HOST:PORT/mqtt, subprotocol mqtt) and TCP,
// MQTT 3.1.1 and 5. Pub/sub at every QoS, retained messages, MQTT 5 properties, application
// credentials and their ACL, and a last will.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import mqtt from 'mqtt';
import { startGridlinks, login } from './gridlinks.mjs';

let server;
before(async () => { server = await startGridlinks({ GRIDLINKS_MQTT_ALLOW_ANONYMOUS: 'true' }); });
after(async () => { await server.stop(); });

const url = (transport) => (transport === 'ws' ? `ws://127.0.0.1:${server.wsPort}/mqtt` : `mqtt://127.0.0.1:${server.mqttPort}`);
const connect = (transport, opts) => mqtt.connectAsync(url(transport), { reconnectPeriod: 0, connectTimeout: 10_000, ...opts });

/** Resolves with the next `n` messages of `client` as {topic, payload, packet}. */
function collect(client, n, ms = 60_000) { // a hang guard: resolves as soon as all are in
  return new Promise((resolve, reject) => {
    const got = [];
    const timer = setTimeout(() => { client.off('message', on); reject(new Error(`${got.length} of ${n} messages within ${ms} ms`)); }, ms);
    function on(topic, payload, packet) {
      got.push({ topic, payload: payload.toString(), packet });
      if (got.length === n) { clearTimeout(timer); client.off('message', on); resolve(got); }
    }
    client.on('message', on);
  });
}

for (const transport of ['ws', 'tcp']) {
  for (const protocolVersion of [4, 5]) {
    test(`${transport} MQTT ${protocolVersion === 5 ? '5' : '3.1.1'}: wildcards and QoS 0/1/2 both ways, retained`, async () => {
      const tag = `${transport}${protocolVersion}`;
      const sub = await connect(transport, { protocolVersion, clientId: `sub-${tag}` });
      const pub = await connect(transport, { protocolVersion, clientId: `pub-${tag}` });
      const granted = await sub.subscribeAsync(`js/${tag}/+/t`, { qos: 2 });
      assert.equal(granted[0].qos, 2);
      const arriving = collect(sub, 3);
      for (const qos of [0, 1, 2]) await pub.publishAsync(`js/${tag}/q${qos}/t`, `m${qos}`, { qos });
      const got = (await arriving).sort((a, b) => a.payload.localeCompare(b.payload));
      assert.deepEqual(got.map((m) => [m.topic, m.payload, m.packet.qos]),
        [0, 1, 2].map((q) => [`js/${tag}/q${q}/t`, `m${q}`, q]));

      await pub.publishAsync(`js/${tag}/kept`, 'last', { qos: 1, retain: true });
      const late = await connect(transport, { protocolVersion, clientId: `late-${tag}` });
      const retained = collect(late, 1);
      await late.subscribeAsync(`js/${tag}/kept`, { qos: 1 });
      const [r] = await retained;
      assert.deepEqual([r.payload, r.packet.retain, r.packet.qos], ['last', true, 1]);
      await pub.publishAsync(`js/${tag}/kept`, '', { qos: 1, retain: true }); // clears it
      await Promise.all([sub, pub, late].map((c) => c.endAsync()));
    });
  }
}

test('ws MQTT 5: properties pass through, subscription identifiers, a 60 KB binary payload', async () => {
  const sub = await connect('ws', { protocolVersion: 5, clientId: 'props-sub' });
  const pub = await connect('ws', { protocolVersion: 5, clientId: 'props-pub' });
  await sub.subscribeAsync('props/#', { qos: 1, properties: { subscriptionIdentifier: 42 } });
  const arriving = collect(sub, 2);
  const properties = { contentType: 'application/json', userProperties: { site: 'north' }, correlationData: Buffer.from([1, 2]), payloadFormatIndicator: true };
  await pub.publishAsync('props/a', '{"t":21.5}', { qos: 1, properties });
  const big = Buffer.alloc(60_000, 7); // under mqtt.max_packet_size (64 KiB)
  await pub.publishAsync('props/big', big, { qos: 1 });
  const [a, b] = await arriving;
  assert.equal(a.packet.properties.contentType, 'application/json');
  assert.deepEqual({ ...a.packet.properties.userProperties }, { site: 'north' });
  assert.deepEqual([...a.packet.properties.correlationData], [1, 2]);
  assert.equal(a.packet.properties.payloadFormatIndicator, true);
  assert.deepEqual(a.packet.properties.subscriptionIdentifier, 42);
  assert.equal(b.packet.payload.length, 60_000);
  assert.ok(Buffer.compare(b.packet.payload, big) === 0);
  await Promise.all([sub, pub].map((c) => c.endAsync()));
});

test('ws: an application logs in with its credential and stays within its ACL', async () => {
  const jwt = await login(server.base);
  const created = await fetch(`${server.base}/api/mqtt/clients`, {
    method: 'POST', headers: { 'content-type': 'application/json', 'x-authorization': `Bearer ${jwt}` },
    body: JSON.stringify({ username: 'dash', password: 's3cret', publish: ['apps/dash/#'], subscribe: ['apps/#'] }),
  });
  assert.equal(created.status, 200);
  await assert.rejects(connect('ws', { protocolVersion: 5, clientId: 'dash-bad', username: 'dash', password: 'wrong' }),
    (e) => e.code === 0x86, 'a wrong password gets CONNACK 0x86');
  const app = await connect('ws', { protocolVersion: 5, clientId: 'dash-1', username: 'dash', password: 's3cret' });
  assert.equal((await app.subscribeAsync('apps/#', { qos: 1 }))[0].qos, 1);
  await assert.rejects(app.subscribeAsync('secret/#', { qos: 1 }), (e) => e.packet?.granted?.[0] === 0x87, 'SUBACK 0x87 outside the ACL');
  const arriving = collect(app, 1);
  await app.publishAsync('apps/dash/state', 'up', { qos: 1 });
  assert.equal((await arriving)[0].payload, 'up');
  await assert.rejects(app.publishAsync('secret/x', 'no', { qos: 1 }), (e) => e.code === 0x87, 'PUBACK 0x87 outside the ACL');
  await app.endAsync();
});

test('ws: the will of a connection that vanishes is published', async () => {
  const watcher = await connect('ws', { protocolVersion: 5, clientId: 'will-watch' });
  await watcher.subscribeAsync('wills/#', { qos: 1 });
  const doomed = await connect('ws', { protocolVersion: 5, clientId: 'doomed', will: { topic: 'wills/doomed', payload: Buffer.from('gone'), qos: 1, retain: false } });
  const arriving = collect(watcher, 1);
  doomed.stream.destroy(); // no DISCONNECT: the socket just closes
  const [w] = await arriving;
  assert.deepEqual([w.topic, w.payload], ['wills/doomed', 'gone']);
  doomed.end(true);
  await watcher.endAsync();
});
