//! Property-style robustness over random and mutated input (the in-crate cousin of
//! `fuzz/fuzz_targets/mqtt_decode.rs`): decoding never panics, and every packet that
//! decodes re-encodes to bytes that decode to the same packet.

use bytes::BytesMut;

use super::*;

const VERSIONS: [ProtocolVersion; 3] = [ProtocolVersion::V3_1, ProtocolVersion::V3_1_1, ProtocolVersion::V5];

/// Decodes packets from `input` until it needs more bytes or fails; checks the
/// re-encoding property for each. Returns how many packets decoded.
fn decode_all(input: &[u8], version: ProtocolVersion) -> usize {
    let mut buf = BytesMut::from(input);
    let mut count = 0;
    // Every packet consumes at least 2 bytes, so this terminates.
    while let Ok(Some(packet)) = decode(&mut buf, version, MAX) {
        count += 1;
        let mut out = BytesMut::new();
        encode(&packet, version, &mut out).unwrap_or_else(|e| panic!("decoded {packet:?} but cannot re-encode: {e}"));
        let again = decode(&mut out, version, MAX)
            .unwrap_or_else(|e| panic!("re-encoded {packet:?} does not decode: {e}"))
            .expect("complete");
        assert_eq!(again, packet);
        assert!(out.is_empty());
    }
    count
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = XorShift::new(0x5EED_1234_ABCD_0001);
    let mut decoded = 0;
    for _ in 0..50_000 {
        let len = rng.below(64);
        let mut input: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
        // Make a plausible fixed header half of the time so bodies get exercised.
        if len >= 2 && rng.below(2) == 0 {
            input[1] = (len - 2).min(127) as u8;
        }
        for version in VERSIONS {
            decoded += decode_all(&input, version);
        }
    }
    assert!(decoded > 0, "random input never decoded: the test exercises nothing");
}

#[test]
fn mutated_valid_packets_never_panic() {
    let mut rng = XorShift::new(0xC0DE_C0DE_0000_0042);
    let corpus: Vec<(ProtocolVersion, Vec<u8>)> = v3_samples()
        .iter()
        .map(|p| (ProtocolVersion::V3_1_1, encode_to_vec(p, ProtocolVersion::V3_1_1)))
        .chain(v5_samples().iter().map(|p| (ProtocolVersion::V5, encode_to_vec(p, ProtocolVersion::V5))))
        .collect();
    let mut decoded = 0;
    for _ in 0..40_000 {
        let (version, base) = &corpus[rng.below(corpus.len())];
        let mut input = base.clone();
        for _ in 0..=rng.below(3) {
            match rng.below(4) {
                0 => {
                    let i = rng.below(input.len());
                    input[i] ^= 1 << rng.below(8);
                }
                1 => {
                    let i = rng.below(input.len());
                    input[i] = rng.byte();
                }
                2 => {
                    let i = rng.below(input.len() + 1);
                    input.insert(i, rng.byte());
                }
                _ => {
                    if input.len() > 1 {
                        input.remove(rng.below(input.len()));
                    }
                }
            }
        }
        decoded += decode_all(&input, *version);
        // The same bytes read under the other version layout.
        let other = if version.is_v5() { ProtocolVersion::V3_1_1 } else { ProtocolVersion::V5 };
        decode_all(&input, other);
    }
    assert!(decoded > 1_000, "only {decoded} mutants decoded");
}

#[test]
fn tiny_limits_never_panic() {
    let mut rng = XorShift::new(7);
    for p in v5_samples() {
        let bytes = encode_to_vec(&p, ProtocolVersion::V5);
        for max in [0, 1, 2, 5, rng.below(bytes.len() + 1)] {
            let mut buf = BytesMut::from(&bytes[..]);
            match decode(&mut buf, ProtocolVersion::V5, max) {
                Err(DecodeError::PacketTooLarge { size, .. }) => assert_eq!(size, bytes.len()),
                Ok(Some(_)) => assert!(max >= bytes.len()),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}
