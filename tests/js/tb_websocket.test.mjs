// ThingsBoard's WebSocket API driven from Node's `ws` package with the messages of
// ThingsBoard's own documentation (the WebSocket API reference and its "Live Telemetry via
// WebSocket" recipe), against a real gridlinks: TIMESERIES on /api/ws and on the older
// /api/ws/plugins/telemetry, and ENTITY_DATA over every device with a latestCmd.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { startGridlinks, login, rest } from './gridlinks.mjs';

let server;
let jwt;
before(async () => { server = await startGridlinks(); jwt = await login(server.base); });
after(async () => { await server.stop(); });

async function device(name, token) {
  return (await rest(server.base, jwt, 'POST', `/api/device?accessToken=${token}`, { name, type: 'thermostat' })).id.id;
}

const post = (token, values) => fetch(`${server.base}/api/v1/${token}/telemetry`, {
  method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(values),
}).then((r) => assert.equal(r.status, 200));

/** A session whose messages arrive, parsed, through next(). */
async function session(path) {
  const ws = new WebSocket(`${server.base.replace('http', 'ws')}${path}`);
  const queue = [];
  const waiting = [];
  ws.on('message', (data) => {
    const msg = JSON.parse(data.toString());
    const w = waiting.shift();
    if (w) w(msg); else queue.push(msg);
  });
  await new Promise((resolve, reject) => { ws.once('open', resolve); ws.once('error', reject); });
  return {
    send: (msg) => ws.send(JSON.stringify(msg)),
    next: () => (queue.length ? Promise.resolve(queue.shift()) : new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error('no message within 60 s')), 60_000); // a hang guard
      waiting.push((m) => { clearTimeout(t); resolve(m); });
    })),
    close: () => ws.close(),
  };
}

test('TIMESERIES on /api/ws: authCmd and cmds in one message, current values then each change', async () => {
  const id = await device('ws-node-1', 'WSNODE1');
  await post('WSNODE1', { ts: 1000, values: { temperature: 25.1, mode: 'CW' } });
  const s = await session('/api/ws');
  s.send({ authCmd: { cmdId: 0, token: jwt }, cmds: [{ entityType: 'DEVICE', entityId: id, cmdId: 10, type: 'TIMESERIES' }] });
  assert.deepEqual(await s.next(), {
    subscriptionId: 10, errorCode: 0, errorMsg: null,
    data: { mode: [[1000, 'CW']], temperature: [[1000, '25.1']] },
    latestValues: { mode: 1000, temperature: 1000 },
  });
  await post('WSNODE1', { ts: 2000, values: { temperature: 26 } });
  const u = await s.next();
  assert.deepEqual([u.subscriptionId, u.data], [10, { temperature: [[2000, '26']] }]);
  s.close();
});

test('the older /api/ws/plugins/telemetry?token= with tsSubCmds', async () => {
  const id = await device('ws-node-2', 'WSNODE2');
  await post('WSNODE2', { ts: 1000, values: { temperature: 20 } });
  const s = await session(`/api/ws/plugins/telemetry?token=${jwt}`);
  s.send({ tsSubCmds: [{ entityType: 'DEVICE', entityId: id, scope: 'LATEST_TELEMETRY', cmdId: 10 }], historyCmds: [], attrSubCmds: [] });
  assert.deepEqual((await s.next()).data, { temperature: [[1000, '20']] });
  s.close();
});

test('ENTITY_DATA over every device with latestCmd, as the Live Telemetry recipe sends it', async () => {
  const id = await device('ws-node-3', 'WSNODE3');
  const s = await session('/api/ws');
  s.send({ authCmd: { cmdId: 0, token: jwt } });
  s.send({ cmds: [{
    cmdId: 1, type: 'ENTITY_DATA',
    query: {
      entityFilter: { type: 'entityType', entityType: 'DEVICE' },
      pageLink: { pageSize: 100, page: 0, sortOrder: { key: { type: 'ENTITY_FIELD', key: 'createdTime' }, direction: 'DESC' } },
      entityFields: [{ type: 'ENTITY_FIELD', key: 'name' }, { type: 'ENTITY_FIELD', key: 'type' }],
      latestValues: [{ type: 'TIME_SERIES', key: 'temperature' }, { type: 'TIME_SERIES', key: 'humidity' }],
    },
    latestCmd: { keys: [{ type: 'TIME_SERIES', key: 'temperature' }, { type: 'TIME_SERIES', key: 'humidity' }] },
  }] });
  const page = await s.next();
  assert.equal(page.cmdUpdateType, 'ENTITY_DATA');
  assert.equal(page.errorCode, 0);
  // Newest first: the device just made.
  assert.equal(page.data.data[0].entityId.id, id);
  assert.equal(page.data.data[0].latest.ENTITY_FIELD.name.value, 'ws-node-3');
  assert.equal(page.data.totalElements, 3);
  await post('WSNODE3', { ts: 5000, values: { temperature: 21.5, humidity: 40 } });
  const u = await s.next();
  assert.deepEqual(u.update, [{
    entityId: { entityType: 'DEVICE', id },
    latest: { TIME_SERIES: { temperature: { ts: 5000, value: '21.5' }, humidity: { ts: 5000, value: '40' } } },
    timeseries: {},
  }]);
  s.close();
});
