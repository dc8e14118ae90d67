//! Fuzzes the MQTT decoder: for each protocol version, decode packets in a loop
//! from the input; every decoded packet must re-encode, and the re-encoding must
//! decode to an equal packet. Any panic (in the codec or in these checks) is a bug.

#![no_main]

use bytes::BytesMut;
use gridlinks_codec::mqtt::{decode, encode, ProtocolVersion};
use libfuzzer_sys::fuzz_target;

/// Large enough that the limit only matters for absurd remaining lengths.
const MAX_PACKET_SIZE: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    for version in [ProtocolVersion::V3_1_1, ProtocolVersion::V5, ProtocolVersion::V3_1] {
        let mut buf = BytesMut::from(data);
        // Each decoded packet consumes at least two bytes, so the loop ends.
        while let Ok(Some(packet)) = decode(&mut buf, version, MAX_PACKET_SIZE) {
            let mut out = BytesMut::new();
            if let Err(e) = encode(&packet, version, &mut out) {
                panic!("decoded {packet:?} ({version:?}) but encoding failed: {e}");
            }
            match decode(&mut out, version, MAX_PACKET_SIZE) {
                Ok(Some(again)) => assert_eq!(again, packet, "{version:?} round trip"),
                other => panic!("re-encoded {packet:?} ({version:?}) decodes as {other:?}"),
            }
            assert!(out.is_empty(), "re-encoding left {} bytes", out.len());
        }
    }
});
