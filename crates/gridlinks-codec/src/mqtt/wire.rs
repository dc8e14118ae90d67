//! Wire primitives: a bounds-checked reader over one packet body, a byte sink that
//! either counts or writes, variable byte integers, UTF-8 strings and binary data.

use bytes::{Buf, Bytes, BytesMut};

use super::error::{DecodeError, EncodeError};

/// Largest remaining length (and Variable Byte Integer) MQTT can express.
pub const MAX_REMAINING_LENGTH: usize = 268_435_455;

/// Largest string or binary field (u16 length prefix).
const MAX_FIELD_LEN: usize = u16::MAX as usize;

/// Result of parsing a Variable Byte Integer from the front of a slice.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Varint {
    /// The slice ends before the last byte of the integer.
    Incomplete,
    /// Four bytes all had the continuation bit set.
    TooLong,
    /// The value, how many bytes encoded it, and whether the encoding was minimal.
    Value { value: u32, len: usize, minimal: bool },
}

/// Parses a Variable Byte Integer (at most 4 bytes) from the front of `bytes`.
pub(crate) fn parse_varint(bytes: &[u8]) -> Varint {
    let mut value: u32 = 0;
    for (i, &byte) in bytes.iter().take(4).enumerate() {
        value |= u32::from(byte & 0x7F) << (7 * i);
        if byte & 0x80 == 0 {
            // A multi-byte encoding whose last byte is zero could have been shorter.
            let minimal = i == 0 || byte != 0;
            return Varint::Value { value, len: i + 1, minimal };
        }
    }
    if bytes.len() >= 4 {
        Varint::TooLong
    } else {
        Varint::Incomplete
    }
}

/// Number of bytes the Variable Byte Integer encoding of `value` takes.
pub(crate) fn varint_len(value: usize) -> usize {
    match value {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// Validates an MQTT UTF-8 Encoded String: well-formed UTF-8 without U+0000.
pub(crate) fn mqtt_str(bytes: &[u8]) -> Result<&str, DecodeError> {
    let s = std::str::from_utf8(bytes).map_err(|_| DecodeError::Malformed("invalid UTF-8 string"))?;
    if s.contains('\0') {
        return Err(DecodeError::Malformed("U+0000 in string"));
    }
    Ok(s)
}

/// A cursor over one packet body (or one property block). Every read checks the
/// remaining length first, so truncated input is `Malformed`, never a panic.
pub(crate) struct Reader {
    /// Unread bytes; slices taken from it share the original allocation.
    buf: Bytes,
    /// Reject non-minimal Variable Byte Integers (an MQTT 5 rule).
    strict_varint: bool,
}

impl Reader {
    pub(crate) fn new(buf: Bytes, strict_varint: bool) -> Self {
        Self { buf, strict_varint }
    }

    pub(crate) fn set_strict_varint(&mut self, strict: bool) {
        self.strict_varint = strict;
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn need(&self, n: usize) -> Result<(), DecodeError> {
        if self.buf.len() < n {
            Err(DecodeError::Malformed("packet shorter than its fields"))
        } else {
            Ok(())
        }
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        self.need(1)?;
        Ok(self.buf.get_u8())
    }

    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        self.need(2)?;
        Ok(self.buf.get_u16())
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        self.need(4)?;
        Ok(self.buf.get_u32())
    }

    pub(crate) fn varint(&mut self) -> Result<u32, DecodeError> {
        match parse_varint(&self.buf) {
            Varint::Incomplete => Err(DecodeError::Malformed("truncated variable byte integer")),
            Varint::TooLong => Err(DecodeError::Malformed("variable byte integer longer than 4 bytes")),
            Varint::Value { minimal: false, .. } if self.strict_varint => {
                Err(DecodeError::Malformed("variable byte integer not minimally encoded"))
            }
            Varint::Value { value, len, .. } => {
                self.buf.advance(len);
                Ok(value)
            }
        }
    }

    /// The next `n` bytes, zero-copy.
    pub(crate) fn take(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        self.need(n)?;
        Ok(self.buf.split_to(n))
    }

    /// Binary Data: u16 length then bytes, zero-copy.
    pub(crate) fn binary(&mut self) -> Result<Bytes, DecodeError> {
        let len = usize::from(self.u16()?);
        self.take(len)
    }

    /// UTF-8 Encoded String: u16 length then validated UTF-8.
    pub(crate) fn string(&mut self) -> Result<String, DecodeError> {
        let bytes = self.binary()?;
        mqtt_str(&bytes).map(str::to_owned)
    }

    /// A sub-reader over the next `n` bytes (a property block).
    pub(crate) fn sub(&mut self, n: usize) -> Result<Reader, DecodeError> {
        let buf = self.take(n)?;
        Ok(Reader::new(buf, self.strict_varint))
    }

    /// Everything left, zero-copy (the PUBLISH payload).
    pub(crate) fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.buf)
    }

    /// Fails if bytes are left over after the last field.
    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Malformed("unexpected bytes after the last field"))
        }
    }
}

/// Where encoders write: a `BytesMut`, or a [`Counter`] that only measures, so a
/// packet is sized in one pass and written in a second without a scratch buffer.
pub(crate) trait Sink {
    fn write_slice(&mut self, bytes: &[u8]);

    fn write_u8(&mut self, value: u8) {
        self.write_slice(&[value]);
    }

    fn write_u16(&mut self, value: u16) {
        self.write_slice(&value.to_be_bytes());
    }

    fn write_u32(&mut self, value: u32) {
        self.write_slice(&value.to_be_bytes());
    }

    /// Variable Byte Integer, minimally encoded.
    fn write_varint(&mut self, value: usize) -> Result<(), EncodeError> {
        if value > MAX_REMAINING_LENGTH {
            return Err(EncodeError::PayloadTooLarge);
        }
        let mut rest = value;
        loop {
            // Masked to 7 bits, so the cast cannot truncate.
            let mut byte = (rest & 0x7F) as u8;
            rest >>= 7;
            if rest > 0 {
                byte |= 0x80;
            }
            self.write_u8(byte);
            if rest == 0 {
                return Ok(());
            }
        }
    }

    /// Binary Data: u16 length then bytes.
    fn write_binary(&mut self, bytes: &[u8]) -> Result<(), EncodeError> {
        let len = u16::try_from(bytes.len()).map_err(|_| EncodeError::BinaryTooLong)?;
        self.write_u16(len);
        self.write_slice(bytes);
        Ok(())
    }

    /// UTF-8 Encoded String: u16 length then bytes; refuses U+0000.
    fn write_string(&mut self, s: &str) -> Result<(), EncodeError> {
        if s.len() > MAX_FIELD_LEN {
            return Err(EncodeError::StringTooLong);
        }
        if s.contains('\0') {
            return Err(EncodeError::InvalidPacket("U+0000 in string"));
        }
        self.write_binary(s.as_bytes()).map_err(|_| EncodeError::StringTooLong)
    }
}

impl Sink for BytesMut {
    fn write_slice(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// A sink that only counts bytes.
#[derive(Default)]
pub(crate) struct Counter(pub(crate) usize);

impl Sink for Counter {
    fn write_slice(&mut self, bytes: &[u8]) {
        self.0 = self.0.saturating_add(bytes.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_boundaries() {
        for value in [0usize, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, MAX_REMAINING_LENGTH] {
            let mut out = BytesMut::new();
            out.write_varint(value).expect("in range");
            assert_eq!(out.len(), varint_len(value));
            assert_eq!(parse_varint(&out), Varint::Value { value: value as u32, len: out.len(), minimal: true });
        }
        let mut out = BytesMut::new();
        assert_eq!(out.write_varint(MAX_REMAINING_LENGTH + 1), Err(EncodeError::PayloadTooLarge));
    }

    #[test]
    fn varint_edge_cases() {
        assert_eq!(parse_varint(&[]), Varint::Incomplete);
        assert_eq!(parse_varint(&[0x80, 0x80, 0x80]), Varint::Incomplete);
        assert_eq!(parse_varint(&[0x80, 0x80, 0x80, 0x80]), Varint::TooLong);
        assert_eq!(parse_varint(&[0x80, 0x00]), Varint::Value { value: 0, len: 2, minimal: false });
    }
}
