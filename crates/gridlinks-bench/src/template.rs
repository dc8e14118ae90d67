//! Payload templates (`--payload-template`): text with placeholders filled per message.
//!
//! | placeholder | becomes |
//! |---|---|
//! | `{ts}` | the message's timestamp, ms since the epoch, unique per device |
//! | `{seq}` | the message's sequence number within its device (0, 1, ...) |
//! | `{rand:MIN:MAX}` | a random integer in `MIN..=MAX` |
//! | `{randf:MIN:MAX}` | a random number in `[MIN, MAX)` with two decimals |
//! | `{str:N}` | N random letters and digits |
//!
//! Any other `{` is literal, so JSON reads naturally:
//! `{"ts":{ts},"values":{"temp":{randf:20:30},"id":"{str:8}","seq":{seq}}}`.
//! Random values come from a generator seeded by (seq, ts): reproducible per message,
//! no shared state between connections.

use std::fmt::Write as _;

use bytes::BytesMut;

/// Longest `{str:N}` accepted.
const MAX_STR: usize = 1 << 20;

/// One piece of a template.
#[derive(Debug, Clone, PartialEq)]
enum Part {
    Literal(String),
    Ts,
    Seq,
    Rand(i64, i64),
    RandF(f64, f64),
    Str(usize),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    parts: Vec<Part>,
}

impl Template {
    /// Parses `text`; an unknown or malformed `{name:...}` placeholder is an error.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            literal.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            match after.find('}').and_then(|close| placeholder(&after[..close]).map(|p| p.map(|p| (p, close)))) {
                Some(Ok((part, close))) => {
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(part);
                    rest = &after[close + 1..];
                }
                Some(Err(e)) => return Err(e),
                None => {
                    literal.push('{');
                    rest = after;
                }
            }
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(Template { parts })
    }

    /// True when the template carries both `{ts}` and `{seq}` (needed by the loss check).
    pub fn has_ts_and_seq(&self) -> bool {
        self.parts.contains(&Part::Ts) && self.parts.contains(&Part::Seq)
    }

    /// Appends message `seq` stamped `ts` to `buf`.
    pub fn render(&self, buf: &mut BytesMut, seq: u64, ts: u64) {
        let mut rng = Rng::new(seq ^ ts.rotate_left(32));
        for part in &self.parts {
            let _ = match part {
                Part::Literal(s) => {
                    buf.extend_from_slice(s.as_bytes());
                    Ok(())
                }
                Part::Ts => write!(buf, "{ts}"),
                Part::Seq => write!(buf, "{seq}"),
                Part::Rand(lo, hi) => {
                    let span = hi.abs_diff(*lo).saturating_add(1);
                    let offset = if span == 0 { rng.next() } else { rng.next() % span };
                    write!(buf, "{}", lo.wrapping_add_unsigned(offset))
                }
                Part::RandF(lo, hi) => write!(buf, "{:.2}", lo + (hi - lo) * rng.unit()),
                Part::Str(n) => {
                    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
                    for _ in 0..*n {
                        let i = (rng.next() % ALPHABET.len() as u64) as usize;
                        buf.extend_from_slice(&ALPHABET[i..=i]);
                    }
                    Ok(())
                }
            };
        }
    }
}

/// The part for a placeholder body (between the braces): `None` when it is not a
/// placeholder (the brace is literal), `Some(Err)` when it is a malformed one.
fn placeholder(body: &str) -> Option<Result<Part, String>> {
    let mut fields = body.split(':');
    let name = fields.next()?;
    let args: Vec<&str> = fields.collect();
    let bad = |why: &str| Some(Err(format!("payload template: {{{body}}}: {why}")));
    match (name, args.as_slice()) {
        ("ts", []) => Some(Ok(Part::Ts)),
        ("seq", []) => Some(Ok(Part::Seq)),
        ("rand", [lo, hi]) => match (lo.parse::<i64>(), hi.parse::<i64>()) {
            (Ok(lo), Ok(hi)) if lo <= hi => Some(Ok(Part::Rand(lo, hi))),
            _ => bad("needs integers MIN <= MAX"),
        },
        ("randf", [lo, hi]) => match (lo.parse::<f64>(), hi.parse::<f64>()) {
            (Ok(lo), Ok(hi)) if lo <= hi && lo.is_finite() && hi.is_finite() => Some(Ok(Part::RandF(lo, hi))),
            _ => bad("needs numbers MIN <= MAX"),
        },
        ("str", [n]) => match n.parse::<usize>() {
            Ok(n) if n <= MAX_STR => Some(Ok(Part::Str(n))),
            _ => bad("needs a length up to 1048576"),
        },
        ("ts" | "seq" | "rand" | "randf" | "str", _) => bad("wrong number of arguments"),
        _ => None,
    }
}

/// splitmix64: a small, fast, well-mixed generator (also `crash-loop`'s kill delays).
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator whose sequence depends only on `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(t: &str, seq: u64, ts: u64) -> String {
        let mut buf = BytesMut::new();
        Template::parse(t).unwrap().render(&mut buf, seq, ts);
        String::from_utf8(buf.to_vec()).unwrap()
    }

    #[test]
    fn placeholders_fill_and_json_braces_stay() {
        let t = r#"{"ts":{ts},"values":{"t":{randf:20:30},"n":{rand:-5:5},"id":"{str:8}","seq":{seq}}}"#;
        let text = render(t, 42, 1_700_000_000_000);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["ts"], 1_700_000_000_000u64);
        assert_eq!(v["values"]["seq"], 42);
        let temp = v["values"]["t"].as_f64().unwrap();
        assert!((20.0..30.0).contains(&temp), "{temp}");
        let n = v["values"]["n"].as_i64().unwrap();
        assert!((-5..=5).contains(&n), "{n}");
        let id = v["values"]["id"].as_str().unwrap();
        assert_eq!(id.len(), 8);
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric()));
        assert!(Template::parse(t).unwrap().has_ts_and_seq());
        // Reproducible per message, different between messages.
        assert_eq!(text, render(t, 42, 1_700_000_000_000));
        assert_ne!(text, render(t, 43, 1_700_000_000_001));
    }

    #[test]
    fn random_integers_cover_their_range() {
        let mut seen = [false; 3];
        for seq in 0..100 {
            let n: usize = render("{rand:0:2}", seq, 7).parse().unwrap();
            seen[n] = true;
        }
        assert_eq!(seen, [true; 3]);
        assert_eq!(render("{rand:5:5}", 1, 1), "5");
    }

    #[test]
    fn malformed_placeholders_are_errors_and_unknown_ones_literal() {
        assert!(Template::parse("{rand:9:1}").is_err());
        assert!(Template::parse("{rand:x:1}").is_err());
        assert!(Template::parse("{str:}").is_err());
        assert!(Template::parse("{ts:1}").is_err());
        assert_eq!(render("{temp} {", 0, 0), "{temp} {");
        assert!(!Template::parse("{ts}").unwrap().has_ts_and_seq());
    }
}
