// The single-lamp controller, as a GridLinks decoder script: the same reading of the frames
// as the native decoder (crates/gridlinks-protocols/src/lamp.rs; field table in
// docs/protocols.md). Use it with
//
//   [[tcp.listeners]]
//   bind = "0.0.0.0:1887"
//   protocol = "lamp"
//   script = "protocols/lamp.js"
//
// Framing (length, markers, CRC) is checked before decode() sees a frame.

const LOGIN = 0x00, REPORT = 0x01, HEARTBEAT = 0x02, DIM = 0x10, REPLY = 0x80;

function hex(b, from, to) {
  let s = "";
  for (let i = from; i < to; i++) s += (b[i] < 16 ? "0" : "") + b[i].toString(16);
  return s;
}

// major.minor from two BCD bytes: 07 50 -> "7.50".
function version(major, minor) {
  return major.toString(16) + "." + (minor < 16 ? "0" : "") + minor.toString(16);
}

// 68 LL LL 68 | payload | CRC (LE, over bytes 1..) | 16
function frame(payload) {
  const f = new Uint8Array(payload.length + 7);
  f[0] = 0x68; f[1] = payload.length & 0xff; f[2] = payload.length >> 8; f[3] = 0x68;
  f.set(payload, 4);
  const crc = crc16modbus(f, 1, 4 + payload.length);
  f[4 + payload.length] = crc & 0xff;
  f[5 + payload.length] = crc >> 8;
  f[6 + payload.length] = 0x16;
  return f;
}

function decode(f, session) {
  const p = f.subarray(4, f.length - 3);
  if (p.length < 11) throw new Error("frame too short: " + f.length + " bytes");
  const dv = new DataView(p.buffer, p.byteOffset, p.byteLength);
  const control = p[0];
  const seq = dv.getUint32(7, true);
  const out = { identity: hex(p, 1, 7) };
  if (control === (DIM | REPLY)) {
    // The answer to a dimming command: the RPC's id as sequence number, a result byte.
    if (p.length < 12) throw new Error("command reply too short: " + f.length + " bytes");
    out.rpcResponse = { id: seq, body: p[11] === 0 ? { result: "ok" } : { result: "error", code: p[11] } };
    return out;
  }
  if (control === LOGIN) {
    if (p.length < 19) throw new Error("login too short: " + f.length + " bytes");
    out.login = true;
    let model = "";
    for (let i = 19; i < p.length && p[i] !== 0; i++) {
      model += (p[i] >= 0x20 && p[i] < 0x7f) ? String.fromCharCode(p[i]) : "?";
    }
    out.attributes = {
      model: model,
      hardwareVersion: version(p[11], p[12]),
      firmwareVersion: version(p[13], p[14]),
      protocolVersion: version(p[15], p[16]),
      bootVersion: version(p[17], p[18]),
    };
  } else if (control === REPORT) {
    if (p.length < 51) throw new Error("property report too short: " + f.length + " bytes");
    const power = dv.getFloat32(30, true);
    const t = {
      seq: seq,
      status: p[20],
      voltage: dv.getUint32(21, true) / 100,
      energy: dv.getUint32(26, true),
    };
    if (isFinite(power)) t.power = Math.round(power * 1000) / 1000;
    t.dim = p[34];
    t.temperature = dv.getInt8(47);
    out.telemetry = t;
  } else if (control !== HEARTBEAT) {
    throw new Error("unsupported frame type 0x" + control.toString(16));
  }
  const reply = new Uint8Array(12);
  reply[0] = control | REPLY;
  reply.set(p.subarray(1, 11), 1); // address and sequence number, echoed
  reply[11] = 0x00;                // accepted
  out.replies = [frame(reply)];
  return out;
}

// Server to controller: RPC setDim {"dim": 0..100} (or the bare number) becomes a dimming
// command numbered with the RPC's id; the controller answers 90 (see decode above).
function encode(message, session) {
  if (message.type !== "rpc") return null; // shared attributes: no frame in this protocol
  if (message.method !== "setDim") throw new Error("RPC method " + JSON.stringify(message.method) + " (the lamp knows setDim)");
  const p = message.params;
  const dim = (p !== null && typeof p === "object") ? p.dim : p;
  if (!Number.isInteger(dim) || dim < 0 || dim > 100) throw new Error("setDim needs {\"dim\": 0..100}");
  if (!session.identity) throw new Error("a command before login");
  const c = new Uint8Array(12);
  c[0] = DIM;
  for (let i = 0; i < 6; i++) c[1 + i] = parseInt(session.identity.substr(2 * i, 2), 16);
  new DataView(c.buffer).setUint32(7, message.id, true);
  c[11] = dim;
  return frame(c);
}
