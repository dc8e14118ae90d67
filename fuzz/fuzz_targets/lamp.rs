//! The lamp controller decoder (`gridlinks-protocols`), natively and as the shipped script:
//! arbitrary bytes as one frame, and through the lamp framing in reads the input cuts.
//! Never panics; a decoded frame names a valid 12-digit identity; every reply is one whole
//! lamp frame (the framing takes it back unchanged); the script agrees with the native
//! decoder on every frame the native one accepts.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::BytesMut;
use gridlinks_framing::{Framer, FramingSpec, Next};
use gridlinks_protocols::{comparable, Decoder, Script, ScriptLimits, Session};
use gridlinks_thingsboard::payload::PayloadLimits;
use gridlinks_types::Ts;
use libfuzzer_sys::fuzz_target;

fn script() -> &'static Decoder {
    static SCRIPT: OnceLock<Decoder> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let limits = ScriptLimits {
            timeout: Duration::from_secs(1),
            memory_bytes: 16 << 20,
            payload: PayloadLimits { max_key_len: 255, max_values: 1000, cast_strings: false },
        };
        let source = include_str!("../../protocols/lamp.js");
        Decoder::Script(Script::load("lamp.js", source, limits).expect("the shipped script loads"))
    })
}

const NOW: Session<'static> = Session { identity: None, now: Ts(1_700_000_000_000) };

fn check(frame: &[u8]) {
    let Ok(native) = Decoder::Lamp.decode(frame, NOW) else { return };
    let id = native.identity.as_deref().expect("every lamp frame names its device");
    assert!(id.len() == 12 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    for reply in &native.replies {
        let mut framer = Framer::new(Arc::new(FramingSpec::lamp()));
        let mut buf = BytesMut::from(&reply[..]);
        assert_eq!(framer.next(&mut buf), Next::Frame(bytes::Bytes::from(reply.clone())));
        assert!(buf.is_empty());
    }
    // Framed frames only: the script reads the length from the frame's own header.
    if frame.len() >= 7 && usize::from(u16::from_le_bytes([frame[1], frame[2]])) + 7 == frame.len() {
        let scripted = script().decode(frame, NOW).expect("the script accepts what the native decoder does");
        assert_eq!(comparable(scripted), comparable(native));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut framer = Framer::new(Arc::new(FramingSpec::lamp()));
    let mut buf = BytesMut::new();
    let mut at = 0;
    while at < data.len() {
        let end = (at + 1 + usize::from(data[at] % 64)).min(data.len());
        buf.extend_from_slice(&data[at..end]);
        at = end;
        loop {
            match framer.next(&mut buf) {
                Next::Frame(f) => check(&f),
                Next::Skipped(..) => {}
                Next::NeedMore | Next::Lost(_) => break,
            }
        }
    }
});
