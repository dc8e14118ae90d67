//! Decoders users write in JavaScript, run in QuickJS (rquickjs): what ThingsBoard and
//! JetLinks users already write converters in, at ~1 µs a call (docs/benchmarks.md,
//! "Decoder engines").
//!
//! A script defines `decode(frame, session)`: `frame` is a `Uint8Array` of one whole frame,
//! `session.identity` the identity the connection logged in with (or `null`). It returns
//! `null` (nothing to store, nothing to answer) or an object with any of
//!
//! - `identity`: the device, as a string (an address, a serial number);
//! - `login`: `true` when the frame is the device's login (listeners with `require_login`
//!   bind a connection only on such a frame);
//! - `telemetry`: ThingsBoard's telemetry shapes (`{"key": value}`, `{"ts", "values"}`, or an
//!   array of these); without `ts`, the frame's arrival time;
//! - `attributes`: client attributes, a flat object;
//! - `replies`: frames (`Uint8Array`s or arrays of bytes) sent back once the rest is durable.
//!
//! `crc16modbus(bytes, from?, to?)` is there for building replies.
//!
//! Sandbox: the scripts get the language and nothing else — no file, network, process or
//! module access (QuickJS without its libc bindings). Each thread has its own runtime per
//! script, with a memory limit; every call has a time limit (of the thread's CPU time),
//! past which the interpreter raises an exception the script cannot catch. An exception or a bad return value rejects
//! that frame with the reason, and the connection goes on.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gridlinks_framing::crc16_modbus;
use gridlinks_thingsboard::payload::{check_key, PayloadLimits};
use gridlinks_types::{Ts, TsRecord, Value as GlValue};
use rquickjs::prelude::Opt;
use rquickjs::{CatchResultExt, Context, Ctx, Function, Object, Runtime, Type, TypedArray, Value};

use crate::{DecodeError, Downlink, Session, Uplink};

/// Bounds on every script call.
#[derive(Clone, Copy, Debug)]
pub struct ScriptLimits {
    /// Longest a call may run.
    pub timeout: Duration,
    /// Most memory one runtime (one per thread and script) may hold.
    pub memory_bytes: usize,
    /// Bounds on the telemetry and attributes a call returns.
    pub payload: PayloadLimits,
}

/// Most reply bytes one frame may produce.
const MAX_REPLY_BYTES: usize = 64 * 1024;

/// A script that could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("decoder script {name}: {reason}")]
pub struct ScriptError {
    name: String,
    reason: String,
}

/// A loaded decoder script; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct Script {
    inner: Arc<Inner>,
}

struct Inner {
    /// Tells this script's runtimes apart in each thread's table.
    id: u64,
    name: String,
    source: String,
    limits: ScriptLimits,
}

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Script").field("name", &self.inner.name).finish_non_exhaustive()
    }
}

/// Defines the call GridLinks makes: the user's `decode` with its session, the result
/// checked to be an object (read field by field in Rust, not through JSON: stringifying
/// the result was 12% of the server's CPU time at full load).
const PRELUDE: &str = r#"
function __gridlinks_decode(frame, identity) {
  const out = decode(frame, { identity: identity });
  if (out === undefined || out === null) return null;
  if (typeof out !== "object" || Array.isArray(out)) {
    throw new TypeError("decode must return an object or null, not " + (Array.isArray(out) ? "an array" : typeof out));
  }
  return out;
}
function __gridlinks_encode(message, identity) {
  if (typeof encode !== "function") return undefined;
  const out = encode(JSON.parse(message), { identity: identity });
  if (out === undefined || out === null) return [];
  if (out instanceof Uint8Array || (Array.isArray(out) && (out.length === 0 || typeof out[0] === "number"))) {
    return [out];
  }
  return out;
}
"#;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's runtime for each script (QuickJS runtimes are single-threaded).
    static ENGINES: RefCell<HashMap<u64, Engine>> = RefCell::new(HashMap::new());
}

/// One runtime and context with the script loaded.
struct Engine {
    runtime: Runtime,
    context: Context,
    /// When the running call must stop; read by the interrupt handler.
    /// On this thread's CPU-time clock ([`cpu_now`]).
    deadline: Rc<Cell<Option<Duration>>>,
}

impl Engine {
    fn new(inner: &Inner) -> Result<Self, String> {
        let runtime = Runtime::new().map_err(|e| e.to_string())?;
        runtime.set_memory_limit(inner.limits.memory_bytes);
        runtime.set_max_stack_size(256 * 1024);
        let deadline: Rc<Cell<Option<Duration>>> = Rc::default();
        let watched = deadline.clone();
        runtime.set_interrupt_handler(Some(Box::new(move || watched.get().is_some_and(|d| cpu_now() >= d))));
        let context = Context::full(&runtime).map_err(|e| e.to_string())?;
        let engine = Engine { runtime, context, deadline };
        engine.deadline.set(Some(cpu_now() + inner.limits.timeout));
        let loaded = engine.context.with(|ctx| -> Result<(), String> {
            let crc = Function::new(ctx.clone(), crc16).map_err(|e| e.to_string())?;
            ctx.globals().set("crc16modbus", crc).map_err(|e| e.to_string())?;
            ctx.eval::<(), _>(inner.source.as_str()).catch(&ctx).map_err(|e| e.to_string())?;
            ctx.eval::<(), _>(PRELUDE).catch(&ctx).map_err(|e| e.to_string())?;
            let decode: Value = ctx.globals().get("decode").map_err(|e| e.to_string())?;
            if !decode.is_function() {
                return Err("defines no function decode(frame, session)".into());
            }
            Ok(())
        });
        engine.deadline.set(None);
        loaded.map(|()| engine)
    }
}

/// The CPU time this thread has used. A call's time limit is CPU time, not wall time: a
/// script thread the scheduler holds back on a busy machine does not time out an honest
/// frame (the connection would be closed for it), and a runaway script is stopped once it
/// has burnt its limit, however long that takes on the clock.
fn cpu_now() -> Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given; CLOCK_THREAD_CPUTIME_ID is
    // always available on Linux.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0;
    if !ok {
        return Duration::ZERO;
    }
    Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0))
}

/// `crc16modbus(bytes, from?, to?)`: CRC-16/MODBUS of `bytes[from..to]`.
fn crc16<'js>(data: Value<'js>, from: Opt<usize>, to: Opt<usize>) -> rquickjs::Result<u32> {
    let data = bytes(data).map_err(|e| rquickjs::Error::new_from_js_message("value", "bytes", e))?;
    let to = to.0.unwrap_or(data.len()).min(data.len());
    let from = from.0.unwrap_or(0).min(to);
    Ok(u32::from(crc16_modbus(&data[from..to])))
}

impl Script {
    /// Loads `source` (named `name` in errors): it must run and define `decode`.
    pub fn load(name: &str, source: &str, limits: ScriptLimits) -> Result<Self, ScriptError> {
        let inner = Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            name: name.to_owned(),
            source: source.to_owned(),
            limits,
        };
        let engine = Engine::new(&inner).map_err(|reason| ScriptError { name: name.to_owned(), reason })?;
        ENGINES.with(|e| e.borrow_mut().insert(inner.id, engine));
        Ok(Script { inner: Arc::new(inner) })
    }

    /// Runs the script's `decode` on `frame`.
    pub fn decode(&self, frame: &[u8], session: Session<'_>) -> Result<Uplink, DecodeError> {
        // A script's values come typed: "1.00" stays a string.
        let lim = PayloadLimits { cast_strings: false, ..self.inner.limits.payload };
        self.run(|ctx| {
            let f: Function = ctx.globals().get("__gridlinks_decode").map_err(|e| e.to_string())?;
            let arr = TypedArray::<u8>::new_copy(ctx.clone(), frame).map_err(|e| e.to_string())?;
            let out: Value = f.call((arr, session.identity)).catch(ctx).map_err(|e| e.to_string())?;
            uplink(ctx, out, session.now, lim)
        })
    }

    /// The frames `encode(message, session)` gives for `down`: `message` is
    /// `{type: "rpc", id, method, params}` or `{type: "attributes", shared: {…}}`; it returns
    /// a frame, an array of frames, or `null` (nothing to send).
    pub fn encode(&self, down: &Downlink, session: Session<'_>) -> Result<Vec<Vec<u8>>, DecodeError> {
        let message = match down {
            Downlink::Rpc { id, method, params } => {
                serde_json::json!({"type": "rpc", "id": id, "method": method, "params": params})
            }
            Downlink::Attributes(shared) => serde_json::json!({"type": "attributes", "shared": shared}),
        }
        .to_string();
        let frames = self.run(|ctx| {
            let f: Function = ctx.globals().get("__gridlinks_encode").map_err(|e| e.to_string())?;
            let out: Value = f.call((message, session.identity)).catch(ctx).map_err(|e| e.to_string())?;
            if out.is_undefined() {
                return Ok(None);
            }
            replies(out).map(Some)
        })?;
        frames.ok_or_else(|| DecodeError::NoEncoding("server messages: the script defines no encode()".into()))
    }

    /// Whether the script defines a function `name` (e.g. the `frame` hook).
    pub fn defines(&self, name: &str) -> bool {
        self.run(|ctx| Ok(ctx.globals().get::<_, Value>(name).is_ok_and(|v| v.is_function()))).unwrap_or(false)
    }

    /// Where the next frame of `buf` ends, by the script's `frame(buffer)`: a positive `n`
    /// is a frame of the first `n` bytes, 0 asks for more bytes, a negative `n` drops the
    /// first `-n` bytes as not a frame.
    pub fn frame(&self, buf: &[u8]) -> Result<Cut, DecodeError> {
        let n = self.run(|ctx| {
            let f: Function = ctx.globals().get("frame").map_err(|e| e.to_string())?;
            let arr = TypedArray::<u8>::new_copy(ctx.clone(), buf).map_err(|e| e.to_string())?;
            let n: Value = f.call((arr,)).catch(ctx).map_err(|e| e.to_string())?;
            n.as_number()
                .filter(|n| n.fract() == 0.0 && n.abs() <= buf.len() as f64)
                .ok_or_else(|| format!("frame() must return an integer within ±{} (the buffer), not {n:?}", buf.len()))
        })?;
        Ok(match n {
            0.0 => Cut::NeedMore,
            n if n > 0.0 => Cut::Frame(n as usize),
            n => Cut::Skip((-n) as usize),
        })
    }

    /// Runs `f` in this thread's runtime of the script, within its time limit.
    fn run<T>(&self, f: impl FnOnce(&Ctx<'_>) -> Result<T, String>) -> Result<T, DecodeError> {
        ENGINES.with(|engines| {
            let mut engines = engines.borrow_mut();
            let engine = match engines.entry(self.inner.id) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(Engine::new(&self.inner).map_err(DecodeError::Script)?)
                }
            };
            let limits = self.inner.limits;
            engine.deadline.set(Some(cpu_now() + limits.timeout));
            let result = engine.context.with(|ctx| f(&ctx));
            let timed_out = engine.deadline.get().is_some_and(|d| cpu_now() >= d);
            engine.deadline.set(None);
            result.map_err(|reason| {
                // Whatever the failed call left behind goes now, not when the next one needs room.
                engine.runtime.run_gc();
                if timed_out {
                    DecodeError::Timeout(limits.timeout.as_millis() as u64)
                } else {
                    DecodeError::Script(reason)
                }
            })
        })
    }
}

/// What a script's `frame(buffer)` found at the front of the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// The first `n` bytes are a frame.
    Frame(usize),
    /// No whole frame yet.
    NeedMore,
    /// The first `n` bytes are not a frame: drop them.
    Skip(usize),
}

/// Reads what `decode` returned: `null`, or an object of identity, telemetry, attributes
/// and replies, with ThingsBoard's telemetry shapes and bounds.
fn uplink<'js>(ctx: &Ctx<'js>, out: Value<'js>, now: Ts, lim: PayloadLimits) -> Result<Uplink, String> {
    let Some(obj) = out.into_object() else { return Ok(Uplink::default()) };
    let mut up = Uplink::default();
    let mut count = 0;
    for key in obj.keys::<String>() {
        let key = key.map_err(|e| e.to_string())?;
        let v: Value = obj.get(key.as_str()).map_err(|e| e.to_string())?;
        if v.type_of().is_void() {
            continue;
        }
        match key.as_str() {
            "identity" => up.identity = Some(string(&v).ok_or("identity must be a string")?),
            "login" => up.login = v.as_bool().ok_or("login must be true or false")?,
            "telemetry" => up.telemetry = telemetry(ctx, v, now, lim, &mut count)?,
            "attributes" => {
                let o = object(v).ok_or("attributes must be an object")?;
                up.attributes = values(ctx, &o, lim, &mut count, false).map_err(|e| format!("attributes: {e}"))?;
            }
            "replies" => up.replies = replies(v)?,
            "rpcResponse" => up.rpc_responses = rpc_responses(ctx, v)?,
            other => {
                return Err(format!(
                    "decode returned an unknown field {other:?} (expected identity, login, telemetry, attributes, replies, rpcResponse)"
                ))
            }
        }
    }
    Ok(up)
}

/// `rpcResponse`: `{id, body}` or an array of them; `body` is sent back as JSON.
fn rpc_responses<'js>(ctx: &Ctx<'js>, v: Value<'js>) -> Result<Vec<(u32, String)>, String> {
    one_or_many(v)?
        .into_iter()
        .map(|item| {
            let o = object(item).ok_or("rpcResponse must be {id, body}")?;
            let id: Value = o.get("id").map_err(|e| e.to_string())?;
            let id = id
                .as_number()
                .filter(|n| n.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(n))
                .ok_or("rpcResponse.id must be the request's id")?;
            let body: Value = o.get("body").map_err(|e| e.to_string())?;
            let text = ctx.json_stringify(body).map_err(|e| e.to_string())?;
            Ok((id as u32, text.and_then(|t| t.to_string().ok()).unwrap_or_else(|| "{}".into())))
        })
        .collect()
}

/// `v` as an object that is not an array.
fn object<'js>(v: Value<'js>) -> Option<Object<'js>> {
    if v.is_array() {
        None
    } else {
        v.into_object()
    }
}

/// An array's items, or the value itself.
fn one_or_many<'js>(v: Value<'js>) -> Result<Vec<Value<'js>>, String> {
    match v.as_array() {
        Some(a) => a.iter::<Value>().collect::<rquickjs::Result<_>>().map_err(|e| e.to_string()),
        None => Ok(vec![v]),
    }
}

fn string(v: &Value<'_>) -> Option<String> {
    v.as_string().and_then(|s| s.to_string().ok())
}

/// Telemetry: a record, or an array of records; empty records are left out.
fn telemetry<'js>(
    ctx: &Ctx<'js>,
    v: Value<'js>,
    now: Ts,
    lim: PayloadLimits,
    count: &mut usize,
) -> Result<Vec<TsRecord>, String> {
    let items = one_or_many(v)?;
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let rec = record(ctx, item, now, lim, count).map_err(|e| format!("telemetry: {e}"))?;
        if !rec.values.is_empty() {
            out.push(rec);
        }
    }
    Ok(out)
}

/// One record: `{"ts", "values"}`, or values stamped `now`.
fn record<'js>(
    ctx: &Ctx<'js>,
    v: Value<'js>,
    now: Ts,
    lim: PayloadLimits,
    count: &mut usize,
) -> Result<TsRecord, String> {
    let o = object(v).ok_or("a record must be an object")?;
    let has = |k: &str| o.contains_key(k).unwrap_or(false);
    if has("ts") && has("values") {
        if o.keys::<String>().count() != 2 {
            return Err("a record with \"ts\" and \"values\" has no other fields".into());
        }
        let ts: Value = o.get("ts").map_err(|e| e.to_string())?;
        let ts = ts
            .as_number()
            .filter(|t| t.fract() == 0.0 && t.abs() < 9.0e15)
            .ok_or("\"ts\" must be an integer number of milliseconds")?;
        let values_obj = object(o.get("values").map_err(|e| e.to_string())?).ok_or("\"values\" must be an object")?;
        return Ok(TsRecord { ts: Ts(ts as i64), values: values(ctx, &values_obj, lim, count, true)? });
    }
    Ok(TsRecord { ts: now, values: values(ctx, &o, lim, count, true)? })
}

/// The key/value pairs of `o`, keys checked as in JSON payloads; `null` values are left
/// out when `skip_nulls`, refused otherwise.
fn values<'js>(
    ctx: &Ctx<'js>,
    o: &Object<'js>,
    lim: PayloadLimits,
    count: &mut usize,
    skip_nulls: bool,
) -> Result<Vec<(String, GlValue)>, String> {
    let mut out = Vec::new();
    for prop in o.props::<String, Value>() {
        let (k, v) = prop.map_err(|e| e.to_string())?;
        check_key(&k, lim, count).map_err(|e| e.to_string())?;
        match typed(ctx, v).map_err(|e| format!("{k:?}: {e}"))? {
            Some(v) => out.push((k, v)),
            None if skip_nulls => {}
            None => return Err(format!("value of {k:?} is null")),
        }
    }
    Ok(out)
}

/// A JavaScript value as ThingsBoard types its JSON: integral numbers are longs, other
/// finite numbers doubles, objects and arrays their JSON text; `None` for null.
fn typed<'js>(ctx: &Ctx<'js>, v: Value<'js>) -> Result<Option<GlValue>, String> {
    Ok(Some(match v.type_of() {
        Type::Null | Type::Undefined | Type::Uninitialized => return Ok(None),
        Type::Bool => GlValue::Bool(v.as_bool().unwrap_or_default()),
        Type::Int => GlValue::Long(i64::from(v.as_int().unwrap_or_default())),
        Type::Float => match v.as_float() {
            Some(f) if !f.is_finite() => return Err("number is not finite".into()),
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => GlValue::Long(f as i64),
            Some(f) => GlValue::Double(f),
            None => return Err("unreadable number".into()),
        },
        Type::String => GlValue::Str(string(&v).ok_or("unreadable string")?),
        Type::Array | Type::Object => {
            let text = ctx.json_stringify(v).map_err(|e| e.to_string())?;
            GlValue::Json(text.and_then(|t| t.to_string().ok()).unwrap_or_default())
        }
        other => return Err(format!("a {other:?} cannot be stored")),
    }))
}

/// A `Uint8Array`, or an array of integers 0..255, as bytes (replies, `crc16modbus`).
fn bytes(v: Value<'_>) -> Result<Vec<u8>, &'static str> {
    if let Ok(t) = TypedArray::<u8>::from_value(v.clone()) {
        // SAFETY: the slice is copied at once; no JavaScript runs while it lives.
        return Ok(unsafe { t.as_bytes() }.map(<[u8]>::to_vec).unwrap_or_default());
    }
    let arr = v.into_array().ok_or("not a Uint8Array or an array of bytes")?;
    arr.iter::<Value>()
        .map(|b| {
            b.ok()
                .and_then(|b| b.as_number())
                .filter(|n| n.fract() == 0.0 && (0.0..=255.0).contains(n))
                .map(|n| n as u8)
                .ok_or("a byte is not an integer 0..255")
        })
        .collect()
}

/// Reply frames: an array of `Uint8Array`s or arrays of bytes, at most [`MAX_REPLY_BYTES`].
fn replies(v: Value<'_>) -> Result<Vec<Vec<u8>>, String> {
    let arr = v.into_array().ok_or("replies must be an array of frames")?;
    let mut out = Vec::with_capacity(arr.len());
    let mut total = 0;
    for item in arr.iter::<Value>() {
        let item = item.map_err(|e| e.to_string())?;
        let frame = bytes(item).map_err(|e| format!("a reply: {e}"))?;
        total += frame.len();
        if total > MAX_REPLY_BYTES {
            return Err(format!("replies exceed {MAX_REPLY_BYTES} bytes"));
        }
        out.push(frame);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use gridlinks_types::{Ts, TsRecord, Value};

    use super::*;

    fn limits() -> ScriptLimits {
        ScriptLimits {
            timeout: Duration::from_millis(50),
            memory_bytes: 8 << 20,
            payload: PayloadLimits { max_key_len: 255, max_values: 1000, cast_strings: false },
        }
    }

    const NOW: Session<'static> = Session { identity: Some("dev-1"), now: Ts(1_000) };

    fn run(src: &str, frame: &[u8]) -> Result<Uplink, DecodeError> {
        Script::load("test", src, limits()).unwrap().decode(frame, NOW)
    }

    #[test]
    fn returns_identity_telemetry_attributes_and_replies() {
        let src = r#"
            function decode(b, session) {
              return {
                identity: "m-" + b[0],
                telemetry: { t: b[1], known: session.identity },
                attributes: { fw: "v1.2" },
                replies: [new Uint8Array([0xaa, b[0]]), [1, 2, crc16modbus(b, 0, 2) & 0xff]],
              };
            }"#;
        let up = run(src, &[7, 21]).unwrap();
        assert_eq!(up.identity.as_deref(), Some("m-7"));
        assert_eq!(
            up.telemetry,
            vec![TsRecord {
                ts: Ts(1_000),
                values: vec![("t".into(), Value::Long(21)), ("known".into(), Value::Str("dev-1".into()))]
            }]
        );
        assert_eq!(up.attributes, vec![("fw".into(), Value::Str("v1.2".into()))]);
        let crc = (crc16_modbus(&[7, 21]) & 0xff) as u8;
        assert_eq!(up.replies, vec![vec![0xaa, 7], vec![1, 2, crc]]);
        assert_eq!(run("function decode(b) { return null; }", &[1]).unwrap(), Uplink::default());
    }

    #[test]
    fn errors_reject_the_frame_with_the_reason() {
        let thrown = run("function decode(b) { throw new Error('bad frame ' + b.length); }", &[1, 2]);
        assert!(matches!(&thrown, Err(DecodeError::Script(m)) if m.contains("bad frame 2")), "{thrown:?}");
        let typo = run("function decode(b) { return { telemtry: {} }; }", &[1]);
        assert!(matches!(&typo, Err(DecodeError::Script(m)) if m.contains("telemtry")), "{typo:?}");
        let number = run("function decode(b) { return 5; }", &[1]);
        assert!(matches!(&number, Err(DecodeError::Script(m)) if m.contains("number")), "{number:?}");
        let byte = run("function decode(b) { return { replies: [[300]] }; }", &[1]);
        assert!(matches!(byte, Err(DecodeError::Script(_))));
        let nan = run("function decode(b) { return { telemetry: { x: NaN } }; }", &[1]);
        assert!(matches!(&nan, Err(DecodeError::Script(m)) if m.contains("not finite")), "{nan:?}");
        let func = run("function decode(b) { return { telemetry: { f: function () {} } }; }", &[1]);
        assert!(matches!(&func, Err(DecodeError::Script(m)) if m.contains("cannot be stored")), "{func:?}");
        let long_key = run("function decode(b) { return { attributes: { ['k'.repeat(300)]: 1 } }; }", &[1]);
        assert!(matches!(&long_key, Err(DecodeError::Script(m)) if m.contains("longer than")), "{long_key:?}");
        // Nulls in telemetry are left out (as in JSON payloads); a frame of only nulls stores nothing.
        assert!(run("function decode(b) { return { telemetry: { x: null } }; }", &[1]).unwrap().telemetry.is_empty());
        let ts =
            run("function decode(b) { return { telemetry: [{ ts: 5, values: { a: 1.5, o: { n: [1] } } }] }; }", &[1]);
        assert_eq!(
            ts.unwrap().telemetry,
            vec![TsRecord {
                ts: Ts(5),
                values: vec![("a".into(), Value::Double(1.5)), ("o".into(), Value::Json("{\"n\":[1]}".into()))]
            }]
        );
    }

    #[test]
    fn a_runaway_script_is_stopped_and_the_next_call_works() {
        let s = Script::load(
            "loop",
            "function decode(b) { if (b[0] === 1) { for (;;) {} } return { telemetry: { ok: 1 } }; }",
            limits(),
        )
        .unwrap();
        // Stopped: an uninterrupted loop would hang the test.
        assert_eq!(s.decode(&[1], NOW), Err(DecodeError::Timeout(50)));
        assert_eq!(s.decode(&[0], NOW).unwrap().telemetry.len(), 1);
        // A `catch` cannot swallow the interrupt.
        let caught = Script::load(
            "catch",
            "function decode(b) { try { for (;;) {} } catch (e) { return { telemetry: { caught: 1 } }; } }",
            limits(),
        )
        .unwrap();
        assert_eq!(caught.decode(&[0], NOW), Err(DecodeError::Timeout(50)));
    }

    #[test]
    fn the_time_limit_stops_a_backtracking_regular_expression() {
        // `/^(a+)+$/` on 42 `a`s and a `b` backtracks 2^42 times: without the interrupt
        // reaching the regular-expression engine it runs for hours.
        let s = Script::load(
            "redos",
            r#"function decode(b) {
                 const text = String.fromCharCode.apply(null, b);
                 return { telemetry: { matched: /^(a+)+$/.test(text) ? 1 : 0 } };
               }"#,
            limits(),
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut frame = vec![b'a'; 42];
            frame.push(b'b');
            let _ = tx.send((s.decode(&frame, NOW), s.decode(b"aaaa", NOW)));
        });
        // A hang guard, not a speed check.
        let (slow, quick) = rx.recv_timeout(Duration::from_secs(120)).expect("the regular expression was not stopped");
        assert_eq!(slow, Err(DecodeError::Timeout(50)));
        assert_eq!(quick.unwrap().telemetry[0].values, vec![("matched".into(), Value::Long(1))]);
    }

    #[test]
    fn a_script_cannot_take_more_memory_than_its_limit() {
        let s = Script::load(
            "hog",
            "function decode(b) { const a = []; for (;;) { a.push(new Array(100000).fill(1)); } }",
            ScriptLimits { timeout: Duration::from_secs(10), ..limits() },
        )
        .unwrap();
        let e = s.decode(&[0], NOW);
        assert!(matches!(&e, Err(DecodeError::Script(m)) if m.contains("out of memory")), "{e:?}");
        // The runtime recovers.
        let ok = Script::load("ok", "function decode(b) { return { telemetry: { n: b.length } }; }", limits()).unwrap();
        assert_eq!(ok.decode(&[1, 2, 3], NOW).unwrap().telemetry[0].values[0].1, Value::Long(3));
    }

    #[test]
    fn no_file_network_or_module_access() {
        for probe in ["typeof require", "typeof std", "typeof os", "typeof fetch", "typeof XMLHttpRequest"] {
            let src = format!("function decode(b) {{ return {{ telemetry: {{ t: {probe} }} }}; }}");
            let up = run(&src, &[0]).unwrap();
            assert_eq!(up.telemetry[0].values[0].1, Value::Str("undefined".into()), "{probe}");
        }
        let import = run("function decode(b) { return import('os'); }", &[0]);
        assert!(import.is_err() || import.unwrap().telemetry.is_empty());
    }

    #[test]
    fn load_errors_are_clear() {
        let syntax = Script::load("broken.js", "function decode(b) {", limits()).unwrap_err().to_string();
        assert!(syntax.contains("broken.js") && syntax.contains("unexpected token"), "{syntax}");
        let missing = Script::load("none.js", "var x = 1;", limits()).unwrap_err().to_string();
        assert!(missing.contains("decode"), "{missing}");
        let looping = Script::load("top.js", "for (;;) {}", limits()).unwrap_err().to_string();
        assert!(looping.contains("interrupted"), "{looping}");
    }

    #[test]
    fn crc16modbus_takes_typed_and_plain_arrays_and_refuses_other_values() {
        let src = "function decode(b) { return { telemetry: { t: crc16modbus(b), a: crc16modbus([7, 21], 1) } }; }";
        let up = run(src, &[7, 21]).unwrap();
        let want = |d: &[u8]| Value::Long(i64::from(crc16_modbus(d)));
        assert_eq!(up.telemetry[0].values, vec![("t".into(), want(&[7, 21])), ("a".into(), want(&[21]))]);
        for bad in ["[300]", "'text'", "[1.5]"] {
            let src = format!("function decode(b) {{ return {{ telemetry: {{ t: crc16modbus({bad}) }} }}; }}");
            assert!(matches!(run(&src, &[0]), Err(DecodeError::Script(_))), "{bad}");
        }
    }

    #[test]
    fn a_framing_hook_cuts_frames() {
        // "LEN:payload" frames, garbage up to a digit dropped.
        let s = Script::load(
            "colon",
            r#"
            function frame(b) {
              if (b.length === 0) return 0;
              if (b[0] < 0x30 || b[0] > 0x39) return -1;
              const colon = b.indexOf(0x3a);
              if (colon < 0) return 0;
              const len = parseInt(String.fromCharCode.apply(null, b.subarray(0, colon)), 10);
              return b.length >= colon + 1 + len ? colon + 1 + len : 0;
            }
            function decode(b) { return null; }"#,
            limits(),
        )
        .unwrap();
        assert!(s.defines("frame") && s.defines("decode") && !s.defines("encode"));
        assert_eq!(s.frame(b"5:hello3:abc").unwrap(), Cut::Frame(7));
        assert_eq!(s.frame(b"5:hel").unwrap(), Cut::NeedMore);
        assert_eq!(s.frame(b"x5:hello").unwrap(), Cut::Skip(1));
        let bad = Script::load("bad", "function frame(b) { return 99; } function decode(b) { return null; }", limits());
        assert!(matches!(bad.unwrap().frame(b"abc"), Err(DecodeError::Script(m)) if m.contains("within")));
    }

    #[test]
    fn encode_turns_server_messages_into_frames_and_rpc_answers_come_back() {
        let s = Script::load(
            "enc",
            r#"
            function decode(b) { return { rpcResponse: { id: b[0], body: { done: b[1] === 0 } } }; }
            function encode(m, session) {
              if (m.type === "rpc") return new Uint8Array([0xc0, m.id, m.params.level]);
              if (m.type === "attributes") return [[0xa0, m.shared.mode.length], [0xa1]];
              return null;
            }"#,
            limits(),
        )
        .unwrap();
        let rpc = Downlink::Rpc { id: 7, method: "dim".into(), params: serde_json::json!({"level": 30}) };
        assert_eq!(s.encode(&rpc, NOW).unwrap(), vec![vec![0xc0, 7, 30]]);
        let attrs = Downlink::Attributes(serde_json::json!({"mode": "night"}));
        assert_eq!(s.encode(&attrs, NOW).unwrap(), vec![vec![0xa0, 5], vec![0xa1]]);
        assert_eq!(s.decode(&[7, 0], NOW).unwrap().rpc_responses, vec![(7, r#"{"done":true}"#.to_owned())]);
        let none = Script::load("none", "function decode(b) { return null; }", limits()).unwrap();
        assert!(matches!(none.encode(&rpc, NOW), Err(DecodeError::NoEncoding(_))));
    }

    #[test]
    fn runs_on_other_threads() {
        let s = Script::load("t", "function decode(b) { return { telemetry: { x: b[0] } }; }", limits()).unwrap();
        let s2 = s.clone();
        let up = std::thread::spawn(move || s2.decode(&[9], NOW)).join().unwrap().unwrap();
        assert_eq!(up.telemetry[0].values[0].1, Value::Long(9));
    }
}
