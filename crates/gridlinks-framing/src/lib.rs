//! Sans-IO framing for devices' own binary TCP protocols: where one frame ends and the next
//! begins in a byte stream — fixed length, delimiter, or a length field between optional
//! start and end markers — with resynchronisation past garbage and absurd lengths, and the
//! checksums such protocols use ([`crc16_modbus`]). Configured without code
//! ([`FramingSpec`], serde); no I/O: the caller appends what it reads to a `BytesMut` and
//! takes frames out with a connection's [`Framer`].

mod crc;
mod hex;

pub use crc::{crc16_modbus, sum8};

use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// Byte order of a length field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endian {
    /// Least significant byte first.
    #[default]
    Little,
    /// Most significant byte first (network order).
    Big,
}

/// How frames are delimited, as configured (`kind = "fixed" | "delimiter" | "length_field"`,
/// markers and delimiters as hex strings, e.g. `start = "68"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum FramingSpec {
    /// Every frame is `length` bytes.
    Fixed {
        /// Bytes per frame (at least 1).
        length: usize,
    },
    /// Frames end with `delimiter` (not part of the frame handed out); empty frames between
    /// two delimiters are skipped.
    Delimiter {
        /// The bytes that end a frame (at least one).
        #[serde(with = "hex")]
        delimiter: Vec<u8>,
        /// Longest frame, delimiter included; a longer run without one is discarded.
        max_frame: usize,
    },
    /// A length field at a fixed offset gives the frame's size.
    LengthField {
        /// Bytes every frame starts with; with them, garbage and bad frames are skipped
        /// up to the next start. Without them a bad length closes the connection.
        #[serde(default, with = "hex")]
        start: Vec<u8>,
        /// Offset of the length field from the frame's first byte.
        length_offset: usize,
        /// Size of the length field: 1, 2 or 4 bytes.
        length_size: u8,
        /// Byte order of the length field.
        #[serde(default)]
        endian: Endian,
        /// Frame size = length field + this (what the field does not count: headers,
        /// checksum, end marker; negative when it counts bytes that are not there).
        #[serde(default)]
        length_adjustment: i64,
        /// Bytes every frame ends with.
        #[serde(default, with = "hex")]
        end: Vec<u8>,
        /// Largest frame accepted; a length beyond it is a bad frame.
        max_frame: usize,
        /// A checksum every frame carries; a frame whose checksum does not match is skipped
        /// whole, its length being known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checksum: Option<Checksum>,
    },
    /// Cut by the protocol's script (its `frame(buffer)` function, in
    /// `gridlinks-protocols`), for what the kinds above cannot describe. A [`Framer`] cannot
    /// run it: it reports the stream lost.
    Script {
        /// Largest frame accepted; a buffer this long without a frame is dropped.
        max_frame: usize,
    },
}

/// Where a frame's checksum sits and what it covers: the checksum starts `at_end` bytes
/// before the frame's end and covers the bytes from offset `from` up to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checksum {
    /// How it is computed.
    pub algorithm: ChecksumAlgorithm,
    /// Offset of the first byte it covers.
    pub from: usize,
    /// How many bytes before the frame's end the checksum starts (end marker included).
    pub at_end: usize,
    /// Byte order of a checksum wider than a byte.
    #[serde(default)]
    pub endian: Endian,
}

/// Checksums device protocols use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChecksumAlgorithm {
    /// CRC-16/MODBUS, 2 bytes.
    Crc16Modbus,
    /// The sum of the bytes modulo 256, 1 byte (DL/T 645 and its relatives).
    Sum8,
}

impl ChecksumAlgorithm {
    fn size(self) -> usize {
        match self {
            ChecksumAlgorithm::Crc16Modbus => 2,
            ChecksumAlgorithm::Sum8 => 1,
        }
    }
}

impl Checksum {
    /// Whether `frame` carries the right checksum.
    pub fn matches(&self, frame: &[u8]) -> bool {
        let size = self.algorithm.size();
        let Some(at) = frame.len().checked_sub(self.at_end) else { return false };
        if at < self.from || at + size > frame.len() {
            return false;
        }
        let covered = &frame[self.from..at];
        let carried = uint(&frame[at..at + size], self.endian);
        let computed = match self.algorithm {
            ChecksumAlgorithm::Crc16Modbus => u64::from(crc16_modbus(covered)),
            ChecksumAlgorithm::Sum8 => u64::from(sum8(covered)),
        };
        carried == computed
    }
}

/// What [`Framer::next`] found at the front of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// A whole frame, taken out of the buffer.
    Frame(Bytes),
    /// Not enough bytes yet for a frame: read more.
    NeedMore,
    /// Bytes that are not a frame were dropped from the buffer (count them, say so once);
    /// call again, the stream goes on.
    Skipped(usize, FrameError),
    /// The stream cannot be followed any more (no start marker to find the next frame
    /// by): close the connection.
    Lost(FrameError),
}

/// Why bytes were not a frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Bytes before the next start marker.
    #[error("{0} bytes before the next frame start")]
    Garbage(usize),
    /// A length field gave a size the frame cannot have.
    #[error("frame length {0} is outside {1}..={2}")]
    BadLength(i64, usize, usize),
    /// The bytes where the end marker belongs are something else.
    #[error("frame does not end with its end marker")]
    BadEnd,
    /// The checksum a frame carries is not the one its bytes give.
    #[error("frame checksum does not match")]
    BadChecksum,
    /// No delimiter within `max_frame` bytes.
    #[error("no delimiter within {0} bytes")]
    TooLong(usize),
    /// The configuration cannot frame anything.
    #[error("invalid framing: {0}")]
    Invalid(&'static str),
}

impl FramingSpec {
    /// The single-lamp controller's frames (`68 LL LL 68 … CS CS 16`, length little-endian,
    /// frame = 4 + length + 3 bytes, CRC-16/MODBUS little-endian over bytes 1.. up to it).
    pub fn lamp() -> Self {
        FramingSpec::LengthField {
            start: vec![0x68],
            length_offset: 1,
            length_size: 2,
            endian: Endian::Little,
            length_adjustment: 7,
            end: vec![0x16],
            max_frame: 4096,
            checksum: Some(Checksum {
                algorithm: ChecksumAlgorithm::Crc16Modbus,
                from: 1,
                at_end: 3,
                endian: Endian::Little,
            }),
        }
    }

    /// Checks what serde cannot: sizes and markers that can frame something.
    pub fn validate(&self) -> Result<(), FrameError> {
        match self {
            FramingSpec::Fixed { length: 0 } => Err(FrameError::Invalid("length must be at least 1")),
            FramingSpec::Fixed { .. } => Ok(()),
            FramingSpec::Script { max_frame: 0 } => Err(FrameError::Invalid("max_frame must be at least 1")),
            FramingSpec::Script { .. } => Ok(()),
            FramingSpec::Delimiter { delimiter, max_frame } => {
                if delimiter.is_empty() {
                    Err(FrameError::Invalid("delimiter must have at least one byte"))
                } else if *max_frame <= delimiter.len() {
                    Err(FrameError::Invalid("max_frame must be longer than the delimiter"))
                } else {
                    Ok(())
                }
            }
            FramingSpec::LengthField { length_offset, length_size, end, max_frame, checksum, .. } => {
                if !matches!(length_size, 1 | 2 | 4) {
                    Err(FrameError::Invalid("length_size must be 1, 2 or 4"))
                } else if checksum.as_ref().is_some_and(|c| c.at_end < c.algorithm.size() + end.len()) {
                    Err(FrameError::Invalid("checksum.at_end must leave room for the checksum and the end marker"))
                } else if *max_frame < length_offset.saturating_add(usize::from(*length_size)).saturating_add(end.len())
                {
                    Err(FrameError::Invalid("max_frame is smaller than the header and end marker"))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// The longest frame this framing hands out (delimiter included); while it waits for
    /// the rest of a frame a connection holds less than this, plus what one read adds.
    pub fn max_frame(&self) -> usize {
        match self {
            FramingSpec::Fixed { length } => *length,
            FramingSpec::Delimiter { max_frame, .. }
            | FramingSpec::LengthField { max_frame, .. }
            | FramingSpec::Script { max_frame } => *max_frame,
        }
    }
}

/// One connection's framing: the shared spec and where the stream stands.
#[derive(Debug)]
pub struct Framer {
    spec: Arc<FramingSpec>,
    /// Inside a delimited frame that was too long: everything up to the next delimiter goes.
    discarding: bool,
}

impl Framer {
    /// A framer at the start of a stream.
    pub fn new(spec: Arc<FramingSpec>) -> Self {
        Framer { spec, discarding: false }
    }

    /// Takes the next frame, or says why it cannot, from the front of `buf`. Costs a scan for
    /// a marker or delimiter and one split; the bytes of a frame are not copied.
    pub fn next(&mut self, buf: &mut BytesMut) -> Next {
        match &*self.spec {
            FramingSpec::Fixed { length } => {
                if *length > 0 && buf.len() >= *length {
                    Next::Frame(buf.split_to(*length).freeze())
                } else {
                    Next::NeedMore
                }
            }
            FramingSpec::Delimiter { delimiter, max_frame } => {
                delimited(&mut self.discarding, buf, delimiter, *max_frame)
            }
            FramingSpec::Script { .. } => {
                Next::Lost(FrameError::Invalid("scripted framing runs in the protocol's script"))
            }
            FramingSpec::LengthField {
                start,
                length_offset,
                length_size,
                endian,
                length_adjustment,
                end,
                max_frame,
                checksum,
            } => {
                if !start.is_empty() {
                    match find(buf, start) {
                        Some(0) => {}
                        Some(at) => {
                            buf.advance(at);
                            return Next::Skipped(at, FrameError::Garbage(at));
                        }
                        None => {
                            // Keep what could be the beginning of a start marker.
                            let drop = (buf.len() + 1).saturating_sub(start.len());
                            if drop == 0 {
                                return Next::NeedMore;
                            }
                            buf.advance(drop);
                            return Next::Skipped(drop, FrameError::Garbage(drop));
                        }
                    }
                }
                let header = length_offset.saturating_add(usize::from(*length_size));
                if buf.len() < header {
                    return Next::NeedMore;
                }
                let field = uint(&buf[*length_offset..header], *endian);
                let total = i64::try_from(field).unwrap_or(i64::MAX).saturating_add(*length_adjustment);
                let min = header.max(start.len()).saturating_add(end.len());
                if total < min as i64 || total > *max_frame as i64 {
                    return bad(buf, start, FrameError::BadLength(total, min, *max_frame));
                }
                let total = total as usize;
                if buf.len() < total {
                    return Next::NeedMore;
                }
                if !buf[..total].ends_with(end) {
                    return bad(buf, start, FrameError::BadEnd);
                }
                if checksum.as_ref().is_some_and(|c| !c.matches(&buf[..total])) {
                    buf.advance(total);
                    return Next::Skipped(total, FrameError::BadChecksum);
                }
                Next::Frame(buf.split_to(total).freeze())
            }
        }
    }
}

/// The next delimited frame; `discarding`: inside a frame that was too long.
fn delimited(discarding: &mut bool, buf: &mut BytesMut, delimiter: &[u8], max_frame: usize) -> Next {
    loop {
        if *discarding {
            return match find(buf, delimiter) {
                Some(at) => {
                    *discarding = false;
                    buf.advance(at + delimiter.len());
                    Next::Skipped(at + delimiter.len(), FrameError::TooLong(max_frame))
                }
                None => match (buf.len() + 1).saturating_sub(delimiter.len()) {
                    0 => Next::NeedMore,
                    drop => {
                        buf.advance(drop);
                        Next::Skipped(drop, FrameError::TooLong(max_frame))
                    }
                },
            };
        }
        let window = buf.len().min(max_frame);
        match find(&buf[..window], delimiter) {
            Some(0) => buf.advance(delimiter.len()),
            Some(at) => {
                let frame = buf.split_to(at).freeze();
                buf.advance(delimiter.len());
                return Next::Frame(frame);
            }
            None if buf.len() >= max_frame => *discarding = true,
            None => return Next::NeedMore,
        }
    }
}

/// A bad frame: with a start marker, skip its first byte and look for the next start; without
/// one there is no telling where the next frame begins.
fn bad(buf: &mut BytesMut, start: &[u8], e: FrameError) -> Next {
    if start.is_empty() {
        return Next::Lost(e);
    }
    buf.advance(1);
    Next::Skipped(1, e)
}

/// First position of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    match needle {
        [] => Some(0),
        [b] => hay.iter().position(|x| x == b),
        _ => hay.windows(needle.len()).position(|w| w == needle),
    }
}

fn uint(bytes: &[u8], endian: Endian) -> u64 {
    let fold = |acc: u64, b: &u8| (acc << 8) | u64::from(*b);
    match endian {
        Endian::Big => bytes.iter().fold(0, fold),
        Endian::Little => bytes.iter().rev().fold(0, fold),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The issue's login frame (42 bytes) and property report (58 bytes).
    pub const LOGIN: &str = "68230068000000002000002226130007500100020802034C4F43373930302D4331454C36313000A35116";
    pub const REPORT: &str = "68330068010000001300000e0000002001011003112700010fce590000003b400000dd242a426400000000000000000000000014000000f01216";

    fn bytes(h: &str) -> Vec<u8> {
        hex::decode(h).unwrap()
    }

    fn frames(spec: &FramingSpec, input: &[u8]) -> (Vec<Vec<u8>>, Vec<FrameError>) {
        let mut framer = Framer::new(Arc::new(spec.clone()));
        let mut buf = BytesMut::from(input);
        let (mut out, mut errs) = (Vec::new(), Vec::new());
        loop {
            match framer.next(&mut buf) {
                Next::Frame(f) => out.push(f.to_vec()),
                Next::Skipped(_, e) => errs.push(e),
                Next::NeedMore => return (out, errs),
                Next::Lost(e) => {
                    errs.push(e);
                    return (out, errs);
                }
            }
        }
    }

    #[test]
    fn the_lamp_frames_and_their_crc() {
        let spec = FramingSpec::lamp();
        for (h, len) in [(LOGIN, 42), (REPORT, 58)] {
            let f = bytes(h);
            assert_eq!(frames(&spec, &f), (vec![f.clone()], vec![]));
            assert_eq!(f.len(), len);
            // CRC-16/MODBUS over bytes 1.. up to the CRC, little-endian before the 0x16.
            let crc = u16::from_le_bytes([f[len - 3], f[len - 2]]);
            assert_eq!(crc16_modbus(&f[1..len - 3]), crc);
        }
    }

    #[test]
    fn several_frames_in_one_read_garbage_between_and_a_half_frame_at_the_end() {
        let spec = FramingSpec::lamp();
        let (login, report) = (bytes(LOGIN), bytes(REPORT));
        let mut input = [b"\x00\x01junk".as_slice(), &login, b"\xff\xfe", &report, &login[..10]].concat();
        let (out, errs) = frames(&spec, &input);
        assert_eq!(out, vec![login.clone(), report.clone()]);
        assert_eq!(errs, vec![FrameError::Garbage(6), FrameError::Garbage(2)]);
        // The half frame stays until the rest comes.
        let mut framer = Framer::new(Arc::new(spec));
        let mut buf = BytesMut::from(&input[input.len() - 10..]);
        assert_eq!(framer.next(&mut buf), Next::NeedMore);
        buf.extend_from_slice(&login[10..]);
        assert_eq!(framer.next(&mut buf), Next::Frame(Bytes::from(login.clone())));
        input.clear();
    }

    #[test]
    fn an_absurd_length_or_a_wrong_end_is_skipped_and_the_stream_resyncs() {
        let spec = FramingSpec::lamp();
        let login = bytes(LOGIN);
        let absurd = [0x68, 0xff, 0xff, 0x68, 0, 0];
        let mut wrong_end = login.clone();
        *wrong_end.last_mut().unwrap() = 0x17;
        let (out, errs) = frames(&spec, &[absurd.as_slice(), &wrong_end, &login].concat());
        assert_eq!(out, vec![login]);
        assert_eq!(errs[0], FrameError::BadLength(0xffff + 7, 4, 4096));
        assert!(errs.contains(&FrameError::BadEnd), "{errs:?}");
    }

    #[test]
    fn without_a_start_marker_a_bad_length_loses_the_stream() {
        let spec = FramingSpec::LengthField {
            start: vec![],
            length_offset: 0,
            length_size: 4,
            endian: Endian::Big,
            length_adjustment: 4,
            end: vec![],
            max_frame: 1024,
            checksum: None,
        };
        let (out, errs) = frames(&spec, &[0, 0, 0, 2, b'h', b'i', 0x7f, 0xff, 0xff, 0xff]);
        assert_eq!(out, vec![vec![0, 0, 0, 2, b'h', b'i']]);
        assert_eq!(errs, vec![FrameError::BadLength(0x7fff_ffff + 4, 4, 1024)]);
    }

    #[test]
    fn a_bad_checksum_skips_the_whole_frame_and_the_next_one_comes_through() {
        let spec = FramingSpec::lamp();
        let (login, report) = (bytes(LOGIN), bytes(REPORT));
        let mut corrupt = report.clone();
        corrupt[30] ^= 0x01; // one bit of the power reading
        let (out, errs) = frames(&spec, &[corrupt.as_slice(), &login].concat());
        assert_eq!(out, vec![login]);
        assert_eq!(errs, vec![FrameError::BadChecksum]);
        // A sum-8 checksum (one byte before the end marker, over everything after the start).
        let sum = Checksum { algorithm: ChecksumAlgorithm::Sum8, from: 1, at_end: 2, endian: Endian::Little };
        let mut frame = vec![0x68, 5, 1, 2, 3, 0, 0x16];
        frame[5] = sum8(&frame[1..5]);
        assert!(sum.matches(&frame));
        frame[2] = 9;
        assert!(!sum.matches(&frame));
        assert!(!sum.matches(&[0x16]), "a frame too short for its checksum does not match");
    }

    #[test]
    fn fixed_and_delimited() {
        let fixed = FramingSpec::Fixed { length: 3 };
        assert_eq!(frames(&fixed, b"abcdefg"), (vec![b"abc".to_vec(), b"def".to_vec()], vec![]));
        let lines = FramingSpec::Delimiter { delimiter: b"\r\n".to_vec(), max_frame: 8 };
        let (out, errs) = frames(&lines, b"one\r\n\r\ntwo\r\nfar too long a line\r\nok\r\nhalf");
        // The over-long line goes whole, up to its delimiter; the stream goes on after it.
        assert_eq!(out, vec![b"one".to_vec(), b"two".to_vec(), b"ok".to_vec()]);
        assert_eq!(errs, vec![FrameError::TooLong(8)]);
    }

    #[test]
    fn configured_in_toml() {
        let spec: FramingSpec = toml::from_str(
            r#"
            kind = "length_field"
            start = "68"
            length_offset = 1
            length_size = 2
            endian = "little"
            length_adjustment = 7
            end = "16"
            max_frame = 4096
            checksum = { algorithm = "crc16_modbus", from = 1, at_end = 3, endian = "little" }
            "#,
        )
        .unwrap();
        assert_eq!(spec, FramingSpec::lamp());
        spec.validate().unwrap();
        let again: FramingSpec = toml::from_str(&toml::to_string(&spec).unwrap()).unwrap();
        assert_eq!(again, spec);
        let bad: Result<FramingSpec, _> = toml::from_str("kind = \"delimiter\"\ndelimiter = \"0g\"\nmax_frame = 9");
        assert!(bad.unwrap_err().to_string().contains("hex"));
        let zero: FramingSpec = toml::from_str("kind = \"fixed\"\nlength = 0").unwrap();
        assert_eq!(zero.validate(), Err(FrameError::Invalid("length must be at least 1")));
    }
}
