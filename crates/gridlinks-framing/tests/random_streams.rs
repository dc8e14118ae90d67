//! Frames come out the same however the stream is cut into reads, with garbage between
//! them; random bytes never panic and never make the buffer grow past a frame.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::sync::Arc;

use bytes::BytesMut;
use gridlinks_framing::{crc16_modbus, Checksum, ChecksumAlgorithm, Endian, Framer, FramingSpec, Next};

/// xorshift64*: reproducible without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A lamp frame with `payload`: `68 LL LL 68 payload CS CS 16`.
fn lamp_frame(payload: &[u8]) -> Vec<u8> {
    let len = u16::try_from(payload.len()).unwrap().to_le_bytes();
    let mut f = vec![0x68, len[0], len[1], 0x68];
    f.extend_from_slice(payload);
    let crc = crc16_modbus(&f[1..]).to_le_bytes();
    f.extend_from_slice(&[crc[0], crc[1], 0x16]);
    f
}

/// Feeds `input` in reads of random sizes; the frames that come out.
fn feed(spec: &Arc<FramingSpec>, input: &[u8], rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut framer = Framer::new(spec.clone());
    let (mut buf, mut out, mut at) = (BytesMut::new(), Vec::new(), 0);
    while at < input.len() {
        let n = 1 + rng.below(97);
        let end = (at + n).min(input.len());
        buf.extend_from_slice(&input[at..end]);
        at = end;
        loop {
            match framer.next(&mut buf) {
                Next::Frame(f) => out.push(f.to_vec()),
                Next::Skipped(n, _) => assert!(n > 0, "a skip that drops nothing would loop"),
                Next::NeedMore => break,
                Next::Lost(e) => panic!("lamp framing has a start marker, it cannot lose the stream: {e}"),
            }
        }
        assert!(buf.len() <= spec.max_frame() + 97, "buffer grew to {}", buf.len());
    }
    out
}

#[test]
fn lamp_frames_survive_any_cut_and_garbage_without_start_bytes() {
    let spec = Arc::new(FramingSpec::lamp());
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..200 {
        let mut input = Vec::new();
        let mut expected = Vec::new();
        for _ in 0..1 + rng.below(20) {
            // Garbage that holds no 0x68 cannot be taken for a frame start.
            for _ in 0..rng.below(5) {
                input.push([0x00, 0x16, 0xff, 0x42][rng.below(4)]);
            }
            let payload: Vec<u8> = (0..rng.below(60)).map(|_| rng.next() as u8).collect();
            let f = lamp_frame(&payload);
            input.extend_from_slice(&f);
            expected.push(f);
        }
        assert_eq!(feed(&spec, &input, &mut rng), expected);
    }
}

#[test]
fn random_bytes_never_panic_in_any_framing() {
    let specs = [
        FramingSpec::lamp(),
        FramingSpec::Fixed { length: 7 },
        FramingSpec::Delimiter { delimiter: vec![0x0d, 0x0a], max_frame: 64 },
        FramingSpec::LengthField {
            start: vec![],
            length_offset: 2,
            length_size: 4,
            endian: Endian::Big,
            length_adjustment: -3,
            end: vec![],
            max_frame: 300,
            checksum: Some(Checksum { algorithm: ChecksumAlgorithm::Sum8, from: 0, at_end: 1, endian: Endian::Big }),
        },
    ];
    let mut rng = Rng(7);
    for spec in specs {
        spec.validate().unwrap();
        let spec = Arc::new(spec);
        for _ in 0..300 {
            let input: Vec<u8> = (0..rng.below(2_000)).map(|_| rng.next() as u8).collect();
            let mut framer = Framer::new(spec.clone());
            let mut buf = BytesMut::from(&input[..]);
            loop {
                match framer.next(&mut buf) {
                    Next::Frame(f) => assert!(f.len() <= spec.max_frame()),
                    Next::Skipped(n, _) => assert!(n > 0),
                    // The connection closes: its buffer goes with it.
                    Next::Lost(_) => break,
                    Next::NeedMore => {
                        // Waiting for the rest of a frame never holds more than one.
                        assert!(buf.len() < spec.max_frame(), "{spec:?}: {} bytes held", buf.len());
                        break;
                    }
                }
            }
        }
    }
}
