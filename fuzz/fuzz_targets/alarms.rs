//! Alarm rules and what surrounds them, from untrusted input: a device profile's
//! `profileData.alarms` (what a tenant administrator saves) compiled and evaluated on
//! arbitrary data, an alarm query (`ALARM_DATA`, `ALARM_COUNT`, `/api/alarmsQuery/*`), and
//! an SMTP server's replies. Never a panic; a compiled rule evaluates on any snapshot; a
//! reply parsed takes no more bytes than it was given.
#![no_main]

use std::collections::HashMap;

use gridlinks_platform::alarms::rules::{AlarmState, DataKey, ProfileAlarms};
use gridlinks_platform::notify::smtp;
use gridlinks_thingsboard::ws;
use gridlinks_types::Value;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else { return };
    match which % 3 {
        0 => {
            let Ok(j) = serde_json::from_slice::<serde_json::Value>(rest) else { return };
            let Ok(p) = ProfileAlarms::compile(j.get("alarms").or(Some(&j))) else { return };
            for a in &p.alarms {
                let mut snapshot: HashMap<DataKey, Value> = HashMap::new();
                for (i, k) in a.keys.iter().enumerate() {
                    let v = match i % 4 {
                        0 => Value::Long(i as i64 * 7 - 20),
                        1 => Value::Double(f64::from(i as u32) / 3.0),
                        2 => Value::Bool(i % 8 == 2),
                        _ => Value::Str(format!("v{i}")),
                    };
                    snapshot.insert(k.clone(), v);
                }
                let mut state = AlarmState::default();
                for (n, ts) in [i64::MIN + 1, 0, 1_000, 1_796_025_600_000, i64::MAX].into_iter().enumerate() {
                    let _ = a.eval(&mut state, &snapshot, ts, n == 3, n % 2 == 0);
                    let _ = a.waits(&state);
                }
            }
        }
        1 => {
            let text = String::from_utf8_lossy(rest);
            for count in [false, true] {
                if let Ok(j) = serde_json::from_str::<serde_json::Value>(&text) {
                    if let Ok(q) = ws::parse_alarm_query(j, count) {
                        assert!((1..=ws::MAX_PAGE).contains(&q.page_size));
                        let _ = q.window(0);
                        let _ = q.window(i64::MAX / 4);
                    }
                }
            }
        }
        _ => {
            let mut at = 0;
            while let Ok(Some((reply, used))) = smtp::parse_reply(&rest[at..]) {
                assert!(used > 0 && at + used <= rest.len() && !reply.lines.is_empty());
                at += used;
            }
        }
    }
});
