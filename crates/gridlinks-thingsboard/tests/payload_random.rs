//! Property-style robustness of the payload decoders over random and mutated input (the
//! in-tree cousin of `fuzz/fuzz_targets/tb_payload.rs`, run with every `cargo test`):
//! decoding never panics, and whatever is accepted respects the limits.

use gridlinks_thingsboard::attributes::AttributeRequest;
use gridlinks_thingsboard::payload::{
    parse_attributes, parse_gateway_attributes, parse_gateway_device, parse_gateway_telemetry, parse_telemetry,
    PayloadLimits,
};
use gridlinks_types::Ts;

const LIM: PayloadLimits = PayloadLimits { max_key_len: 32, max_values: 64, cast_strings: true };

/// Seeded, so a failure reproduces.
struct XorShift(u64);

impl XorShift {
    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Runs every decoder on `data`; checks the limits on what they accept. Returns how many
/// decoders accepted it.
fn check(data: &[u8]) -> usize {
    let mut accepted = 0;
    if let Ok(records) = parse_telemetry(data, Ts(0), LIM) {
        let n: usize = records.iter().map(|r| r.values.len()).sum();
        assert!(n <= LIM.max_values, "{n} values from {data:?}");
        assert!(records.iter().all(|r| !r.values.is_empty()), "a record without values from {data:?}");
        assert!(records
            .iter()
            .flat_map(|r| &r.values)
            .all(|(k, _)| !k.trim().is_empty() && k.len() <= LIM.max_key_len));
        accepted += 1;
    }
    if let Ok(values) = parse_attributes(data, LIM, true) {
        assert!(!values.is_empty() && values.len() <= LIM.max_values);
        accepted += 1;
    }
    accepted += usize::from(parse_attributes(data, LIM, false).is_ok());
    if let Ok(devices) = parse_gateway_telemetry(data, Ts(0), LIM) {
        let n: usize = devices.iter().flat_map(|(_, r)| r).map(|r| r.values.len()).sum();
        assert!(n <= LIM.max_values);
        accepted += 1;
    }
    if let Ok(devices) = parse_gateway_attributes(data, LIM) {
        assert!(devices.iter().map(|(_, v)| v.len()).sum::<usize>() <= LIM.max_values);
        accepted += 1;
    }
    if let Ok((name, _)) = parse_gateway_device(data) {
        assert!(!name.trim().is_empty() && name.len() <= 255);
        accepted += 1;
    }
    accepted += usize::from(AttributeRequest::parse_json(data).is_ok());
    accepted
}

/// Valid payloads of every form, the seeds the mutations start from.
const SEEDS: &[&str] = &[
    r#"{"temperature":21.5,"on":true,"n":7,"s":"42","j":{"a":[1,{"b":null}]}}"#,
    r#"[{"ts":1700000000000,"values":{"a":1,"b":"x"}},{"c":-3.5e2}]"#,
    r#"{"ts":"5","values":{"big":123456789012345678901234567890}}"#,
    r#"{"Device A":[{"ts":1,"values":{"t":1}}],"Device B":{"h":2}}"#,
    r#"{"Device A":{"fw":"1.0","ok":false}}"#,
    r#"{"device":"Device A","type":"thermostat"}"#,
    r#"{"clientKeys":"a, b","sharedKeys":"c"}"#,
    r#"{"s":"a \" \\ \u00e9 \ud83d\ude00"}"#,
];

/// Bytes JSON is made of, so that mutations stay near the grammar.
const ALPHABET: &[u8] = b"{}[]\":,.-+eE0123456789 \\ntrufalsxyz\x00\xff\xc3";

#[test]
fn random_bytes_never_panic() {
    let mut rng = XorShift(0x7B_9A71_0AD5_0001);
    for _ in 0..20_000 {
        let len = rng.below(48);
        let data: Vec<u8> = (0..len)
            .map(|_| if rng.below(4) == 0 { rng.next_u64() as u8 } else { ALPHABET[rng.below(ALPHABET.len())] })
            .collect();
        check(&data);
    }
}

#[test]
fn mutated_valid_payloads_never_panic() {
    let mut rng = XorShift(0x7B_9A71_0AD5_0002);
    let mut accepted = 0;
    for seed in SEEDS {
        assert!(check(seed.as_bytes()) > 0, "seed not accepted: {seed}");
    }
    for _ in 0..30_000 {
        let mut data = SEEDS[rng.below(SEEDS.len())].as_bytes().to_vec();
        for _ in 0..=rng.below(3) {
            let at = rng.below(data.len() + 1);
            match rng.below(4) {
                0 if at < data.len() => data[at] = ALPHABET[rng.below(ALPHABET.len())],
                1 if at < data.len() => {
                    data.remove(at);
                }
                2 => data.insert(at, ALPHABET[rng.below(ALPHABET.len())]),
                _ => data.truncate(at),
            }
        }
        accepted += check(&data);
    }
    // The mutations must leave some inputs valid, or the test exercises only the errors.
    assert!(accepted > 1_000, "only {accepted} mutated payloads were accepted");
}

#[test]
fn limits_hold_at_the_edge() {
    let many = |n: usize| format!("{{{}}}", (0..n).map(|i| format!("\"k{i}\":1")).collect::<Vec<_>>().join(","));
    assert_eq!(parse_telemetry(many(LIM.max_values).as_bytes(), Ts(0), LIM).map(|r| r[0].values.len()), Ok(64));
    assert!(parse_telemetry(many(LIM.max_values + 1).as_bytes(), Ts(0), LIM).is_err());
    let key = |n: usize| format!("{{\"{}\":1}}", "k".repeat(n));
    assert!(parse_attributes(key(LIM.max_key_len).as_bytes(), LIM, true).is_ok());
    assert!(parse_attributes(key(LIM.max_key_len + 1).as_bytes(), LIM, true).is_err());
}
