//! The framing engine (`gridlinks-framing`): arbitrary bytes, cut into reads where the
//! input says, through each kind of framing. Never panics; every skip drops bytes (no
//! endless loop); a frame is never longer than the framing allows; waiting for the rest of
//! a frame never holds more than one frame.
#![no_main]

use std::sync::Arc;

use bytes::BytesMut;
use gridlinks_framing::{Checksum, ChecksumAlgorithm, Endian, Framer, FramingSpec, Next};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let spec = Arc::new(match selector % 4 {
        0 => FramingSpec::lamp(),
        1 => FramingSpec::Fixed { length: 1 + usize::from(selector >> 2) },
        2 => FramingSpec::Delimiter { delimiter: vec![0x0d, 0x0a], max_frame: 64 },
        _ => FramingSpec::LengthField {
            start: if selector & 4 != 0 { vec![0xaa, 0x55] } else { vec![] },
            length_offset: usize::from(selector >> 4),
            length_size: [1, 2, 4][usize::from(selector >> 3) % 3],
            endian: if selector & 8 != 0 { Endian::Big } else { Endian::Little },
            length_adjustment: i64::from(selector as i8),
            end: if selector & 2 != 0 { vec![0x16] } else { vec![] },
            max_frame: 512,
            checksum: (selector & 1 != 0).then_some(Checksum {
                algorithm: ChecksumAlgorithm::Sum8,
                from: 0,
                at_end: 1 + usize::from(selector & 2 != 0),
                endian: Endian::Little,
            }),
        },
    });
    if spec.validate().is_err() {
        return;
    }
    let mut framer = Framer::new(spec.clone());
    let mut buf = BytesMut::new();
    // Reads of 1..=32 bytes, sized by the bytes themselves.
    let mut at = 0;
    while at < rest.len() {
        let end = (at + 1 + usize::from(rest[at] % 32)).min(rest.len());
        buf.extend_from_slice(&rest[at..end]);
        at = end;
        loop {
            match framer.next(&mut buf) {
                Next::Frame(f) => assert!(f.len() <= spec.max_frame()),
                Next::Skipped(n, _) => assert!(n > 0),
                Next::Lost(_) => return,
                Next::NeedMore => {
                    assert!(buf.len() < spec.max_frame());
                    break;
                }
            }
        }
    }
});
