//! Decoders users write in JavaScript, run in QuickJS (rquickjs): what ThingsBoard and
//! JetLinks users already write converters in, at ~1 µs a call (docs/benchmarks.md,
//! "Decoder engines").
//!
//! A script defines `decode(frame, session)`: `frame` is a `Uint8Array` of one whole frame,
//! `session.identity` the identity the connection logged in with (or `null`). It returns
//! `null` (nothing to store, nothing to answer) or an object with any of
//!
//! - `identity`: the device, as a string (an address, a serial number);
//! - `telemetry`: ThingsBoard's telemetry shapes (`{"key": value}`, `{"ts", "values"}`, or an
//!   array of these); without `ts`, the frame's arrival time;
//! - `attributes`: client attributes, a flat object;
//! - `replies`: frames (`Uint8Array`s or arrays of bytes) sent back once the rest is durable.
//!
//! `crc16modbus(bytes, from?, to?)` is there for building replies.
//!
//! Sandbox: the scripts get the language and nothing else — no file, network, process or
//! module access (QuickJS without its libc bindings). Each thread has its own runtime per
//! script, with a memory limit; every call has a time limit, past which the interpreter
//! raises an exception the script cannot catch. An exception or a bad return value rejects
//! that frame with the reason, and the connection goes on.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gridlinks_framing::crc16_modbus;
use gridlinks_thingsboard::payload::{parse_attributes, parse_telemetry, PayloadLimits};
use rquickjs::prelude::Opt;
use rquickjs::{CatchResultExt, Context, Ctx, Function, Runtime, TypedArray, Value};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::{DecodeError, Session, Uplink};

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

/// Defines the call GridLinks makes: the user's `decode`, its replies made plain arrays,
/// the whole result as JSON.
const PRELUDE: &str = r#"
function __gridlinks_decode(frame, identity) {
  const out = decode(frame, { identity: identity });
  if (out === undefined || out === null) return null;
  if (typeof out !== "object") throw new TypeError("decode must return an object or null, not " + typeof out);
  if (out.replies) out.replies = Array.from(out.replies, function (r) { return Array.from(r); });
  return JSON.stringify(out);
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
    deadline: Rc<Cell<Option<Instant>>>,
}

impl Engine {
    fn new(inner: &Inner) -> Result<Self, String> {
        let runtime = Runtime::new().map_err(|e| e.to_string())?;
        runtime.set_memory_limit(inner.limits.memory_bytes);
        runtime.set_max_stack_size(256 * 1024);
        let deadline: Rc<Cell<Option<Instant>>> = Rc::default();
        let watched = deadline.clone();
        runtime.set_interrupt_handler(Some(Box::new(move || watched.get().is_some_and(|d| Instant::now() >= d))));
        let context = Context::full(&runtime).map_err(|e| e.to_string())?;
        let engine = Engine { runtime, context, deadline };
        engine.deadline.set(Some(Instant::now() + inner.limits.timeout));
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

/// `crc16modbus(bytes, from?, to?)`: CRC-16/MODBUS of `bytes[from..to]`.
fn crc16<'js>(bytes: Value<'js>, from: Opt<usize>, to: Opt<usize>) -> rquickjs::Result<u32> {
    let data: Vec<u8> = match TypedArray::<u8>::from_value(bytes.clone()) {
        Ok(t) => t.as_bytes().map(<[u8]>::to_vec).unwrap_or_default(),
        Err(_) => rquickjs::FromJs::from_js(&bytes.ctx().clone(), bytes)?,
    };
    let to = to.0.unwrap_or(data.len()).min(data.len());
    let from = from.0.unwrap_or(0).min(to);
    Ok(u32::from(crc16_modbus(&data[from..to])))
}

/// What a call returns, as JSON.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Out<'a> {
    identity: Option<String>,
    #[serde(borrow)]
    telemetry: Option<&'a RawValue>,
    #[serde(borrow)]
    attributes: Option<&'a RawValue>,
    replies: Option<Vec<Vec<u8>>>,
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
        let json = ENGINES.with(|engines| {
            let mut engines = engines.borrow_mut();
            let engine = match engines.entry(self.inner.id) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(Engine::new(&self.inner).map_err(DecodeError::Script)?)
                }
            };
            self.call(engine, frame, session.identity)
        })?;
        let Some(json) = json else { return Ok(Uplink::default()) };
        let out: Out<'_> = serde_json::from_str(&json)
            .map_err(|e| DecodeError::Script(format!("decode returned something that is not an uplink: {e}")))?;
        // A script's values come typed: "1.00" stays a string.
        let lim = PayloadLimits { cast_strings: false, ..self.inner.limits.payload };
        fn present(raw: Option<&RawValue>) -> Option<&RawValue> {
            raw.filter(|r| !matches!(r.get(), "{}" | "[]" | "null"))
        }
        let telemetry = match present(out.telemetry) {
            Some(raw) => parse_telemetry(raw.get().as_bytes(), session.now, lim)
                .map_err(|e| DecodeError::Script(format!("telemetry: {e}")))?,
            None => Vec::new(),
        };
        let attributes = match present(out.attributes) {
            Some(raw) => parse_attributes(raw.get().as_bytes(), lim, false)
                .map_err(|e| DecodeError::Script(format!("attributes: {e}")))?,
            None => Vec::new(),
        };
        let replies = out.replies.unwrap_or_default();
        if replies.iter().map(Vec::len).sum::<usize>() > MAX_REPLY_BYTES {
            return Err(DecodeError::Script(format!("replies exceed {MAX_REPLY_BYTES} bytes")));
        }
        Ok(Uplink { identity: out.identity, telemetry, attributes, replies })
    }

    fn call(&self, engine: &Engine, frame: &[u8], identity: Option<&str>) -> Result<Option<String>, DecodeError> {
        let limits = self.inner.limits;
        engine.deadline.set(Some(Instant::now() + limits.timeout));
        let result = engine.context.with(|ctx: Ctx<'_>| -> Result<Option<String>, String> {
            let f: Function = ctx.globals().get("__gridlinks_decode").map_err(|e| e.to_string())?;
            let arr = TypedArray::<u8>::new_copy(ctx.clone(), frame).map_err(|e| e.to_string())?;
            f.call::<_, Option<String>>((arr, identity)).catch(&ctx).map_err(|e| e.to_string())
        });
        let timed_out = engine.deadline.get().is_some_and(|d| Instant::now() >= d);
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
    }
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
                values: vec![("known".into(), Value::Str("dev-1".into())), ("t".into(), Value::Long(21))]
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
        let nan = run("function decode(b) { return { telemetry: { x: null } }; }", &[1]);
        assert!(matches!(nan, Err(DecodeError::Script(_))));
    }

    #[test]
    fn a_runaway_script_is_stopped_and_the_next_call_works() {
        let s = Script::load(
            "loop",
            "function decode(b) { if (b[0] === 1) { for (;;) {} } return { telemetry: { ok: 1 } }; }",
            limits(),
        )
        .unwrap();
        let started = Instant::now();
        assert_eq!(s.decode(&[1], NOW), Err(DecodeError::Timeout(50)));
        assert!(started.elapsed() < Duration::from_secs(2));
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
    fn runs_on_other_threads() {
        let s = Script::load("t", "function decode(b) { return { telemetry: { x: b[0] } }; }", limits()).unwrap();
        let s2 = s.clone();
        let up = std::thread::spawn(move || s2.decode(&[9], NOW)).join().unwrap().unwrap();
        assert_eq!(up.telemetry[0].values[0].1, Value::Long(9));
    }
}
