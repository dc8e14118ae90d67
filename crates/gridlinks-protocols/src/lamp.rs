//! The single-lamp controller (street-light node) protocol, natively.
//!
//! A frame is `68 LL LL 68 | payload (LL bytes) | CS CS | 16`: the length little-endian, the
//! CRC-16/MODBUS little-endian over every byte from offset 1 up to it (framing:
//! [`gridlinks_framing::FramingSpec::lamp`], which checks length, markers and CRC). The
//! payload, as GridLinks reads it (docs/protocols.md has the table):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | control code: `00` login, `01` property report, `02` heartbeat; a reply sets bit 7 |
//! | 1 | 6 | address: the device's identity, 12 hex digits in wire order |
//! | 7 | 4 | frame sequence number, u32 LE |
//!
//! Login (`00`, 35 bytes in the sample): 8 BCD version bytes at 11 (hardware, firmware,
//! protocol, boot loader: major, minor each), then the model, ASCII up to a NUL.
//!
//! Property report (`01`, 51 bytes): device clock (7 BCD bytes, `20 01 01 10 03 11 27` =
//! 2001-01-10 03:11:27 in the sample: unset, so GridLinks stamps reports with server time) at
//! 11; lamp channel at 19; status bits at 20; voltage u32 LE in 0.01 V at 21; energy u32 LE
//! in Wh at 26; active power f32 LE in W at 30; dimming level in % at 34; temperature in °C
//! (i8) at 47; bytes 18, 25, 35–46 and 48–50 are reserved (zero in the sample).
//!
//! Every frame is answered once what it carried is durable: the reply has the request's
//! control code with bit 7 set, the same address and sequence number, and a result byte
//! (`00` = accepted): `80` answers a login, `81` a report, `82` a heartbeat.

use gridlinks_framing::crc16_modbus;
use gridlinks_types::{TsRecord, Value};

use crate::{DecodeError, Downlink, Session, Uplink};

/// Control code of a login.
pub const LOGIN: u8 = 0x00;
/// Control code of a property report.
pub const REPORT: u8 = 0x01;
/// Control code of a heartbeat.
pub const HEARTBEAT: u8 = 0x02;
/// Control code of a dimming command (server to controller); the controller answers `90`.
pub const DIM: u8 = 0x10;
/// Bit 7 marks a reply.
pub const REPLY: u8 = 0x80;

const LOGIN_LEN: usize = 19;
const REPORT_LEN: usize = 51;
const HEARTBEAT_LEN: usize = 11;

/// A property report's readings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Report {
    /// Status bits.
    pub status: u8,
    /// Voltage in 0.01 V.
    pub voltage_cv: u32,
    /// Energy in Wh.
    pub energy_wh: u32,
    /// Active power in W.
    pub power_w: f32,
    /// Dimming level, %.
    pub dim: u8,
    /// Temperature, °C.
    pub temperature: i8,
}

/// Wraps `payload` into a frame: markers, length and CRC.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let len = u16::try_from(payload.len()).unwrap_or(u16::MAX);
    let mut f = Vec::with_capacity(payload.len() + 7);
    f.push(0x68);
    f.extend_from_slice(&len.to_le_bytes());
    f.push(0x68);
    f.extend_from_slice(&payload[..usize::from(len)]);
    let crc = crc16_modbus(&f[1..]);
    f.extend_from_slice(&crc.to_le_bytes());
    f.push(0x16);
    f
}

/// The identity of the device with `address`: its 6 bytes as 12 lowercase hex digits.
pub fn identity(address: &[u8; 6]) -> String {
    address.iter().map(|b| format!("{b:02x}")).collect()
}

/// The address an identity names (12 hex digits), for building frames.
pub fn address(identity: &str) -> Option<[u8; 6]> {
    if identity.len() != 12 {
        return None;
    }
    let mut a = [0u8; 6];
    for (i, byte) in a.iter_mut().enumerate() {
        *byte = u8::from_str_radix(identity.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(a)
}

/// The reply to a frame with `control`, from `address`, numbered `seq`: accepted.
pub fn reply(control: u8, address: &[u8; 6], seq: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(12);
    p.push(control | REPLY);
    p.extend_from_slice(address);
    p.extend_from_slice(&seq.to_le_bytes());
    p.push(0x00);
    frame(&p)
}

/// A login frame as a controller sends it (the sample's versions and model).
pub fn login_frame(address: &[u8; 6], seq: u32) -> Vec<u8> {
    let mut p = vec![LOGIN];
    p.extend_from_slice(address);
    p.extend_from_slice(&seq.to_le_bytes());
    p.extend_from_slice(&[0x07, 0x50, 0x01, 0x00, 0x02, 0x08, 0x02, 0x03]);
    p.extend_from_slice(b"LOC7900-C1EL610\0");
    frame(&p)
}

/// A property report frame as a controller sends it.
pub fn report_frame(address: &[u8; 6], seq: u32, r: &Report) -> Vec<u8> {
    let mut p = [0u8; REPORT_LEN];
    p[0] = REPORT;
    p[1..7].copy_from_slice(address);
    p[7..11].copy_from_slice(&seq.to_le_bytes());
    p[11..18].copy_from_slice(&[0x20, 0x01, 0x01, 0x10, 0x03, 0x11, 0x27]);
    p[19] = 1;
    p[20] = r.status;
    p[21..25].copy_from_slice(&r.voltage_cv.to_le_bytes());
    p[26..30].copy_from_slice(&r.energy_wh.to_le_bytes());
    p[30..34].copy_from_slice(&r.power_w.to_le_bytes());
    p[34] = r.dim;
    p[47] = r.temperature.to_le_bytes()[0];
    frame(&p)
}

/// A frame's payload: between the header (`68 LL LL 68`) and the CRC and end marker.
fn payload(frame: &[u8]) -> Result<&[u8], DecodeError> {
    if frame.len() < 7 + 11 {
        return Err(DecodeError::Short { what: "frame", need: 7 + 11, got: frame.len() });
    }
    Ok(&frame[4..frame.len() - 3])
}

fn need(p: &[u8], what: &'static str, n: usize) -> Result<(), DecodeError> {
    if p.len() < n {
        return Err(DecodeError::Short { what, need: n + 7, got: p.len() + 7 });
    }
    Ok(())
}

fn u32_at(p: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]])
}

/// `major.minor` from two BCD bytes (`07 50` → `7.50`).
fn version(major: u8, minor: u8) -> String {
    format!("{:x}.{:02x}", major, minor)
}

/// The nearest integer, halves upwards: JavaScript's `Math.round`, so that the shipped
/// script and this decoder agree to the bit.
fn round_half_up(x: f64) -> f64 {
    if x - x.floor() == 0.5 {
        x.ceil()
    } else {
        x.round()
    }
}

/// Decodes a lamp controller frame.
pub fn decode(frame: &[u8], session: Session<'_>) -> Result<Uplink, DecodeError> {
    let p = payload(frame)?;
    let control = p[0];
    let mut addr = [0u8; 6];
    addr.copy_from_slice(&p[1..7]);
    let seq = u32_at(p, 7);
    let mut up = Uplink { identity: Some(identity(&addr)), ..Uplink::default() };
    match control {
        LOGIN => {
            need(p, "login", LOGIN_LEN)?;
            up.login = true;
            let model = &p[LOGIN_LEN..];
            let model = &model[..model.iter().position(|&b| b == 0).unwrap_or(model.len())];
            let model: String =
                model.iter().map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '?' }).collect();
            let v = &p[11..19];
            up.attributes = vec![
                ("model".into(), Value::Str(model)),
                ("hardwareVersion".into(), Value::Str(version(v[0], v[1]))),
                ("firmwareVersion".into(), Value::Str(version(v[2], v[3]))),
                ("protocolVersion".into(), Value::Str(version(v[4], v[5]))),
                ("bootVersion".into(), Value::Str(version(v[6], v[7]))),
            ];
        }
        REPORT => {
            need(p, "property report", REPORT_LEN)?;
            let mut values = vec![
                ("seq".into(), Value::Long(i64::from(seq))),
                ("status".into(), Value::Long(i64::from(p[20]))),
                ("voltage".into(), Value::Double(f64::from(u32_at(p, 21)) / 100.0)),
                ("energy".into(), Value::Long(i64::from(u32_at(p, 26)))),
            ];
            let power = f64::from(f32::from_le_bytes([p[30], p[31], p[32], p[33]]));
            if power.is_finite() {
                values.push(("power".into(), Value::Double(round_half_up(power * 1000.0) / 1000.0)));
            }
            values.push(("dim".into(), Value::Long(i64::from(p[34]))));
            values.push(("temperature".into(), Value::Long(i64::from(p[47] as i8))));
            up.telemetry = vec![TsRecord { ts: session.now, values }];
        }
        HEARTBEAT => need(p, "heartbeat", HEARTBEAT_LEN)?,
        // The answer to a dimming command: the RPC's id as sequence number, a result byte.
        c if c == DIM | REPLY => {
            need(p, "command reply", HEARTBEAT_LEN + 1)?;
            let answer = match p[11] {
                0 => r#"{"result":"ok"}"#.to_owned(),
                code => format!(r#"{{"result":"error","code":{code}}}"#),
            };
            up.rpc_responses.push((seq, answer));
            return Ok(up);
        }
        other => return Err(DecodeError::Unsupported(other)),
    }
    up.replies.push(reply(control, &addr, seq));
    Ok(up)
}

/// The dimming command to `address`: RPC `setDim` with `{"dim": 0..100}` (or the bare
/// number), numbered with the RPC's id. Shared attributes have no frame in this protocol.
pub fn encode(down: &Downlink, session: Session<'_>) -> Result<Vec<Vec<u8>>, DecodeError> {
    let Downlink::Rpc { id, method, params } = down else { return Ok(Vec::new()) };
    if method != "setDim" {
        return Err(DecodeError::NoEncoding(format!("RPC method {method:?} (the lamp knows setDim)")));
    }
    let dim = params
        .get("dim")
        .unwrap_or(params)
        .as_u64()
        .filter(|d| *d <= 100)
        .ok_or_else(|| DecodeError::NoEncoding(format!("setDim with {params}: needs {{\"dim\": 0..100}}")))?;
    let address =
        session.identity.and_then(address).ok_or_else(|| DecodeError::NoEncoding("a command before login".into()))?;
    Ok(vec![command(&address, *id, dim as u8)])
}

/// A dimming command frame: `10`, address, sequence number, level.
pub fn command(address: &[u8; 6], seq: u32, dim: u8) -> Vec<u8> {
    let mut p = Vec::with_capacity(12);
    p.push(DIM);
    p.extend_from_slice(address);
    p.extend_from_slice(&seq.to_le_bytes());
    p.push(dim);
    frame(&p)
}

#[cfg(test)]
mod tests {
    use gridlinks_types::Ts;

    use super::*;

    /// The issue's login frame (42 bytes) and property report (58 bytes).
    pub const LOGIN_HEX: &str = "68230068000000002000002226130007500100020802034C4F43373930302D4331454C36313000A35116";
    pub const REPORT_HEX: &str = "68330068010000001300000e0000002001011003112700010fce590000003b400000dd242a426400000000000000000000000014000000f01216";

    fn unhex(h: &str) -> Vec<u8> {
        (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect()
    }

    const NOW: Session<'static> = Session { identity: None, now: Ts(1_700_000_000_000) };

    #[test]
    fn the_sample_login() {
        let f = unhex(LOGIN_HEX);
        let up = decode(&f, NOW).unwrap();
        assert_eq!(up.identity.as_deref(), Some("000000200000"));
        assert!(up.telemetry.is_empty());
        let s = |v: &str| Value::Str(v.into());
        assert_eq!(
            up.attributes,
            vec![
                ("model".into(), s("LOC7900-C1EL610")),
                ("hardwareVersion".into(), s("7.50")),
                ("firmwareVersion".into(), s("1.00")),
                ("protocolVersion".into(), s("2.08")),
                ("bootVersion".into(), s("2.03")),
            ]
        );
        // 68 0c00 68 | 80 | 000000200000 | 22261300 | 00 | CRC | 16
        let want = unhex("680c0068800000002000002226130000");
        let crc = crc16_modbus(&want[1..]).to_le_bytes();
        assert_eq!(up.replies, vec![[want.as_slice(), &crc, &[0x16]].concat()]);
        // The builder makes the sample byte for byte.
        assert_eq!(login_frame(&[0, 0, 0, 0x20, 0, 0], 0x0013_2622), f);
    }

    #[test]
    fn the_sample_report() {
        let f = unhex(REPORT_HEX);
        let up = decode(&f, NOW).unwrap();
        assert_eq!(up.identity.as_deref(), Some("000000130000"));
        assert!(up.attributes.is_empty());
        let values = vec![
            ("seq".into(), Value::Long(14)),
            ("status".into(), Value::Long(15)),
            ("voltage".into(), Value::Double(229.9)),
            ("energy".into(), Value::Long(16443)),
            ("power".into(), Value::Double(42.536)),
            ("dim".into(), Value::Long(100)),
            ("temperature".into(), Value::Long(20)),
        ];
        assert_eq!(up.telemetry, vec![TsRecord { ts: NOW.now, values }]);
        assert_eq!(up.replies, vec![reply(REPORT, &[0, 0, 0, 0x13, 0, 0], 14)]);
        assert_eq!(up.replies[0][4], 0x81);
        let r = Report { status: 15, voltage_cv: 22990, energy_wh: 16443, power_w: 42.536, dim: 100, temperature: 20 };
        assert_eq!(report_frame(&[0, 0, 0, 0x13, 0, 0], 14, &r), f);
    }

    #[test]
    fn short_and_unknown_frames_are_refused() {
        let login = unhex(LOGIN_HEX);
        // A report header with a login's length.
        let mut p = login[4..login.len() - 3].to_vec();
        p[0] = REPORT;
        assert!(matches!(decode(&frame(&p), NOW), Err(DecodeError::Short { what: "property report", .. })));
        p[0] = 0x33;
        assert_eq!(decode(&frame(&p), NOW), Err(DecodeError::Unsupported(0x33)));
        assert!(matches!(decode(&frame(&[1, 2, 3]), NOW), Err(DecodeError::Short { .. })));
        let hb = frame(&[HEARTBEAT, 0, 0, 0, 0, 0, 1, 9, 0, 0, 0]);
        let up = decode(&hb, NOW).unwrap();
        assert_eq!(up.replies, vec![reply(HEARTBEAT, &[0, 0, 0, 0, 0, 1], 9)]);
    }

    /// The shipped script reads every frame as the native decoder does, replies included.
    #[test]
    fn the_script_agrees_with_the_native_decoder() {
        use crate::script::{Script, ScriptLimits};
        let limits = ScriptLimits {
            timeout: std::time::Duration::from_millis(100),
            memory_bytes: 8 << 20,
            payload: gridlinks_thingsboard::payload::PayloadLimits {
                max_key_len: 255,
                max_values: 1000,
                cast_strings: false,
            },
        };
        let script = Script::load("lamp.js", include_str!("../../../protocols/lamp.js"), limits).unwrap();
        let r = Report { status: 3, voltage_cv: 23001, energy_wh: 7, power_w: f32::NAN, dim: 0, temperature: -12 };
        let mut frames = vec![
            unhex(LOGIN_HEX),
            unhex(REPORT_HEX),
            report_frame(&[1, 2, 3, 4, 5, 6], u32::MAX, &r),
            frame(&[HEARTBEAT, 0, 0, 0, 0, 0, 1, 9, 0, 0, 0]),
        ];
        let r2 = Report { power_w: -0.0625, voltage_cv: 22000, ..r };
        frames.push(report_frame(&[1, 2, 3, 4, 5, 6], 3, &r2));
        frames.push(frame(&[0x90, 1, 2, 3, 4, 5, 6, 9, 0, 0, 0, 0]));
        frames.push(frame(&[0x90, 1, 2, 3, 4, 5, 6, 9, 0, 0, 0, 4]));
        for f in frames {
            let native = decode(&f, NOW).unwrap();
            let scripted = script.decode(&f, NOW).unwrap();
            assert_eq!(crate::comparable(scripted), crate::comparable(native));
        }
        // Commands: the same frames, the same refusals.
        let session = Session { identity: Some("010203040506"), now: NOW.now };
        for params in [serde_json::json!({"dim": 40}), serde_json::json!(0), serde_json::json!({"dim": 101})] {
            let down = Downlink::Rpc { id: 77, method: "setDim".into(), params };
            match (encode(&down, session), script.encode(&down, session)) {
                (Ok(native), Ok(scripted)) => assert_eq!(scripted, native),
                (Err(_), Err(_)) => {}
                other => panic!("{other:?}"),
            }
        }
        let reboot = Downlink::Rpc { id: 1, method: "reboot".into(), params: serde_json::json!({}) };
        assert!(encode(&reboot, session).is_err() && script.encode(&reboot, session).is_err());
        let attrs = Downlink::Attributes(serde_json::json!({"a": 1}));
        assert_eq!(script.encode(&attrs, session).unwrap(), encode(&attrs, session).unwrap());
        let mut bad = unhex(REPORT_HEX);
        bad[4] = 0x33;
        let bad = frame(&bad[4..bad.len() - 3]);
        assert_eq!(decode(&bad, NOW), Err(DecodeError::Unsupported(0x33)));
        assert!(
            matches!(script.decode(&bad, NOW), Err(DecodeError::Script(m)) if m.contains("unsupported frame type 0x33"))
        );
    }

    #[test]
    fn dimming_commands_and_their_answers() {
        let session = Session { identity: Some("000000000007"), now: NOW.now };
        let addr = [0, 0, 0, 0, 0, 7];
        let rpc = |method: &str, params| Downlink::Rpc { id: 42, method: method.into(), params };
        let frames = encode(&rpc("setDim", serde_json::json!({"dim": 40})), session).unwrap();
        assert_eq!(frames, vec![frame(&[0x10, 0, 0, 0, 0, 0, 7, 42, 0, 0, 0, 40])]);
        assert_eq!(encode(&rpc("setDim", serde_json::json!(100)), session).unwrap(), vec![command(&addr, 42, 100)]);
        assert!(matches!(
            encode(&rpc("setDim", serde_json::json!({"dim": 101})), session),
            Err(DecodeError::NoEncoding(_))
        ));
        assert!(matches!(encode(&rpc("reboot", serde_json::json!({})), session), Err(DecodeError::NoEncoding(_))));
        assert!(encode(&Downlink::Attributes(serde_json::json!({"x": 1})), session).unwrap().is_empty());
        // The controller's answer completes the RPC and is not itself answered.
        let ok = decode(&frame(&[0x90, 0, 0, 0, 0, 0, 7, 42, 0, 0, 0, 0]), session).unwrap();
        assert_eq!(ok.rpc_responses, vec![(42, r#"{"result":"ok"}"#.to_owned())]);
        assert!(ok.replies.is_empty() && ok.telemetry.is_empty());
        let failed = decode(&frame(&[0x90, 0, 0, 0, 0, 0, 7, 43, 0, 0, 0, 3]), session).unwrap();
        assert_eq!(failed.rpc_responses, vec![(43, r#"{"result":"error","code":3}"#.to_owned())]);
    }

    #[test]
    fn identities_and_addresses() {
        let a = [0, 0, 0, 0, 0, 1];
        assert_eq!(identity(&a), "000000000001");
        assert_eq!(address("000000000001"), Some(a));
        assert_eq!(address("00000000000g"), None);
        assert_eq!(address("0001"), None);
    }
}
