// Starts and stops a real gridlinks for the JavaScript tests (MQTT.js in Node and in a
// real headless Chromium). GRIDLINKS_BIN selects the binary (default: target/debug/gridlinks
// of this repository).
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, openSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { createServer as createHttpServer } from 'node:http';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import assert from 'node:assert/strict';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
export const BIN = process.env.GRIDLINKS_BIN ?? join(here, '..', '..', 'target', 'debug', 'gridlinks');
export const ADMIN_PASSWORD = 'js-test-password';

/** Ports in that range Chromium refuses to load a page from (ERR_UNSAFE_PORT). */
const CHROMIUM_RESTRICTED = new Set([10080]);

/**
 * A free loopback port below Linux's ephemeral range (client sockets cannot take it) that
 * a browser may open.
 */
export async function freePort() {
  for (;;) {
    const port = 10000 + Math.floor(Math.random() * 22000);
    if (CHROMIUM_RESTRICTED.has(port)) continue;
    const free = await new Promise((resolve) => {
      const s = createServer();
      s.once('error', () => resolve(false));
      s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
    });
    if (free) return port;
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Runs gridlinks on free loopback ports in a fresh data directory with `env` added; resolves
 * to { base, mqttPort, wsPort, stop() }. stop() sends SIGTERM and rejects unless it exits 0.
 */
export async function startGridlinks(env = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'gridlinks-js-'));
  const logPath = join(dir, 'server.log');
  for (let attempt = 0; attempt < 5; attempt++) {
    const [http, mqtt, ws] = [await freePort(), await freePort(), await freePort()];
    const log = openSync(logPath, 'w');
    const child = spawn(BIN, ['serve', '--data-dir', join(dir, 'data'),
      '--http-bind', `127.0.0.1:${http}`, '--mqtt-bind', `127.0.0.1:${mqtt}`, '--mqtt-ws-bind', `127.0.0.1:${ws}`, '--coap-bind', ''], {
      env: { ...process.env, GRIDLINKS_ADMIN_PASSWORD: ADMIN_PASSWORD, GRIDLINKS_LOG: 'warn', ...env },
      stdio: ['ignore', log, log],
    });
    let exited = null;
    child.on('exit', (code) => { exited = code ?? -1; });
    const base = `http://127.0.0.1:${http}`;
    const deadline = Date.now() + 60_000;
    while (exited === null && Date.now() < deadline) {
      try {
        if ((await fetch(`${base}/healthz`)).status === 200) {
          return {
            base, mqttPort: mqtt, wsPort: ws,
            stop: () => new Promise((resolve, reject) => {
              const done = (code) => {
                rmSync(dir, { recursive: true, force: true });
                code === 0 ? resolve() : reject(new Error(`gridlinks exited with ${code} after SIGTERM`));
              };
              if (exited !== null) return done(exited);
              child.once('exit', (code) => done(code));
              child.kill('SIGTERM');
            }),
          };
        }
      } catch { /* not listening yet */ }
      await sleep(100);
    }
    const text = readFileSync(logPath, 'utf8');
    if (exited === null) {
      child.kill('SIGKILL');
      throw new Error(`gridlinks not healthy within 60 s:\n${text}`);
    }
    if (!text.includes('Address already in use')) throw new Error(`gridlinks exited with ${exited}:\n${text}`);
    // A port was taken meanwhile: try other ports.
  }
  throw new Error(`gridlinks did not start in 5 attempts:\n${readFileSync(logPath, 'utf8')}`);
}

/**
 * Logs in as admin; the JWT. Password checks run at idle CPU priority: on a busy machine
 * one may be refused as busy (503, Retry-After), which says to retry; it is, for 60 s.
 */
export async function login(base) {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const r = await fetch(`${base}/api/auth/login`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ username: 'admin', password: ADMIN_PASSWORD }),
    });
    if (r.status === 503 && Date.now() < deadline) { await sleep(500); continue; }
    if (r.status !== 200) throw new Error(`login: ${r.status}`);
    return (await r.json()).token;
  }
}

/**
 * A REST call as `jwt`; throws unless the answer is 200. Its JSON, its text when it is not
 * JSON, or null when empty.
 */
export async function rest(base, jwt, method, path, body) {
  const r = await fetch(`${base}${path}`, {
    method, headers: { 'content-type': 'application/json', 'x-authorization': `Bearer ${jwt}` },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  if (r.status !== 200) throw new Error(`${method} ${path}: ${r.status} ${text}`);
  if (!text) return null;
  try { return JSON.parse(text); } catch { return text; }
}

/** Debian's Chromium (CHROMIUM_BIN overrides), headless, with what this closed network needs. */
export const CHROMIUM = process.env.CHROMIUM_BIN ?? '/usr/bin/chromium';

/** Launches CHROMIUM through playwright-core's `chromium`. */
export function launchChromium(chromium) {
  return chromium.launch({
    executablePath: CHROMIUM,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
}

/**
 * A page with MQTT.js's browser bundle, served on a free loopback port (another origin than
 * the broker's), as a dashboard would load it: { port, close }.
 */
export async function serveMqttPage() {
  const bundle = readFileSync(createRequire(import.meta.url).resolve('mqtt/dist/mqtt.min'));
  const port = await freePort();
  const web = createHttpServer((req, res) => {
    if (req.url === '/mqtt.min.js') {
      res.writeHead(200, { 'content-type': 'text/javascript' }).end(bundle);
    } else {
      res.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><title>dash</title><script src="/mqtt.min.js"></script>');
    }
  });
  await new Promise((r) => web.listen(port, '127.0.0.1', r));
  return { port, close: () => web.close() };
}

const AXE = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

/** axe-core on the page as it is: no serious or critical violations. (Evaluated through the
 * DevTools protocol: the console's Content-Security-Policy refuses injected script tags.) */
export async function accessible(page, what) {
  await page.evaluate(AXE);
  const result = await page.evaluate(() => globalThis.axe.run(document, { resultTypes: ['violations'] }));
  const bad = result.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
  assert.deepEqual(bad.map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`), [], `${what}: accessibility`);
}
