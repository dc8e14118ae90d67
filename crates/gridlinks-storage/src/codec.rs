//! On-disk encodings: storage keys (big-endian, so a range scan is a time range) and
//! the compact binary value rows. Every row value starts with [`ROW_FORMAT`] so the
//! format can evolve.

use gridlinks_types::{DeviceId, ProtocolIdentity, Ts, Value};

use crate::StoreError;

/// Version byte that starts every encoded row value.
pub const ROW_FORMAT: u8 = 1;

const TAG_BOOL: u8 = 0;
const TAG_LONG: u8 = 1;
const TAG_DOUBLE: u8 = 2;
const TAG_STR: u8 = 3;
const TAG_JSON: u8 = 4;

/// Interned id of a telemetry key name (see `keydict`).
pub type KeyId = u32;

/// Maps a signed timestamp to bytes that sort in time order.
pub fn ts_bytes(ts: Ts) -> [u8; 8] {
    ((ts.0 as u64) ^ (1 << 63)).to_be_bytes()
}

fn ts_from_bytes(b: [u8; 8]) -> Ts {
    Ts((u64::from_be_bytes(b) ^ (1 << 63)) as i64)
}

/// Key of a time-series row: device ‖ ts.
pub fn ts_key(device: DeviceId, ts: Ts) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..16].copy_from_slice(device.as_bytes());
    k[16..].copy_from_slice(&ts_bytes(ts));
    k
}

/// Splits a time-series row key back into its timestamp.
pub fn ts_of_key(key: &[u8]) -> Result<Ts, StoreError> {
    let b: [u8; 8] =
        key.get(16..24).and_then(|s| s.try_into().ok()).ok_or(StoreError::Corrupt("time-series key length"))?;
    Ok(ts_from_bytes(b))
}

/// `identities` key: protocol ‖ 0 ‖ identity (neither contains a 0 byte).
pub fn identity_key(identity: &ProtocolIdentity) -> Vec<u8> {
    let mut k = Vec::with_capacity(identity.protocol.len() + 1 + identity.id.len());
    k.extend_from_slice(identity.protocol.as_bytes());
    k.push(0);
    k.extend_from_slice(identity.id.as_bytes());
    k
}

/// Key of an attribute row: device ‖ scope tag ‖ key name.
pub fn attr_key(device: DeviceId, scope_tag: u8, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(17 + key.len());
    k.extend_from_slice(device.as_bytes());
    k.push(scope_tag);
    k.extend_from_slice(key.as_bytes());
    k
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A cursor over an encoded row.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Starts reading a row, checking its format byte.
    pub fn new(buf: &'a [u8]) -> Result<Self, StoreError> {
        match buf.split_first() {
            Some((&ROW_FORMAT, rest)) => Ok(Self { buf: rest }),
            _ => Err(StoreError::Corrupt("row format byte")),
        }
    }

    /// True when the whole row has been read.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.buf.len() < n {
            return Err(StoreError::Corrupt("row truncated"));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }

    /// Reads an unsigned varint.
    pub fn varint(&mut self) -> Result<u64, StoreError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(StoreError::Corrupt("varint too long"))
    }

    fn eight(&mut self) -> Result<[u8; 8], StoreError> {
        self.take(8)?.try_into().map_err(|_| StoreError::Corrupt("row truncated"))
    }

    /// Reads a byte.
    pub fn byte(&mut self) -> Result<u8, StoreError> {
        self.u8()
    }

    /// Reads `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        self.take(n)
    }

    /// Reads a length-prefixed UTF-8 string.
    pub fn text(&mut self) -> Result<&'a str, StoreError> {
        let len = usize::try_from(self.varint()?).map_err(|_| StoreError::Corrupt("string length"))?;
        std::str::from_utf8(self.take(len)?).map_err(|_| StoreError::Corrupt("string utf-8"))
    }

    /// Reads a timestamp.
    pub fn ts(&mut self) -> Result<Ts, StoreError> {
        Ok(Ts(i64::from_be_bytes(self.eight()?)))
    }

    /// Reads a key id.
    pub fn key_id(&mut self) -> Result<KeyId, StoreError> {
        KeyId::try_from(self.varint()?).map_err(|_| StoreError::Corrupt("key id"))
    }

    /// Reads a typed value.
    pub fn value(&mut self) -> Result<Value, StoreError> {
        Ok(match self.u8()? {
            TAG_BOOL => Value::Bool(self.u8()? != 0),
            TAG_LONG => Value::Long(i64::from_be_bytes(self.eight()?)),
            TAG_DOUBLE => Value::Double(f64::from_be_bytes(self.eight()?)),
            tag @ (TAG_STR | TAG_JSON) => {
                let len = usize::try_from(self.varint()?).map_err(|_| StoreError::Corrupt("string length"))?;
                let s =
                    std::str::from_utf8(self.take(len)?).map_err(|_| StoreError::Corrupt("string utf-8"))?.to_owned();
                if tag == TAG_STR {
                    Value::Str(s)
                } else {
                    Value::Json(s)
                }
            }
            _ => return Err(StoreError::Corrupt("value tag")),
        })
    }
}

/// Builds an encoded row.
pub struct Writer {
    buf: Vec<u8>,
}

impl Default for Writer {
    fn default() -> Self {
        Self::new()
    }
}

impl Writer {
    /// Starts a row with the format byte.
    pub fn new() -> Self {
        Self { buf: vec![ROW_FORMAT] }
    }

    /// Appends a timestamp.
    pub fn ts(&mut self, ts: Ts) -> &mut Self {
        self.buf.extend_from_slice(&ts.0.to_be_bytes());
        self
    }

    /// Appends an unsigned varint.
    pub fn varint(&mut self, v: u64) -> &mut Self {
        put_varint(&mut self.buf, v);
        self
    }

    /// Appends raw bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }

    /// Appends a length-prefixed UTF-8 string.
    pub fn text(&mut self, s: &str) -> &mut Self {
        put_varint(&mut self.buf, s.len() as u64);
        self.buf.extend_from_slice(s.as_bytes());
        self
    }

    /// Appends a key id.
    pub fn key_id(&mut self, id: KeyId) -> &mut Self {
        put_varint(&mut self.buf, u64::from(id));
        self
    }

    /// Appends a typed value.
    pub fn value(&mut self, v: &Value) -> &mut Self {
        match v {
            Value::Bool(b) => {
                self.buf.push(TAG_BOOL);
                self.buf.push(u8::from(*b));
            }
            Value::Long(i) => {
                self.buf.push(TAG_LONG);
                self.buf.extend_from_slice(&i.to_be_bytes());
            }
            Value::Double(f) => {
                self.buf.push(TAG_DOUBLE);
                self.buf.extend_from_slice(&f.to_be_bytes());
            }
            Value::Str(s) | Value::Json(s) => {
                self.buf.push(if matches!(v, Value::Str(_)) { TAG_STR } else { TAG_JSON });
                put_varint(&mut self.buf, s.len() as u64);
                self.buf.extend_from_slice(s.as_bytes());
            }
        }
        self
    }

    /// The finished row.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// A time-series row: every value one device reported at one timestamp.
pub fn encode_ts_row(values: &[(KeyId, Value)]) -> Vec<u8> {
    let mut w = Writer::new();
    for (k, v) in values {
        w.key_id(*k).value(v);
    }
    w.finish()
}

/// Inverse of [`encode_ts_row`].
pub fn decode_ts_row(buf: &[u8]) -> Result<Vec<(KeyId, Value)>, StoreError> {
    let mut r = Reader::new(buf)?;
    let mut out = Vec::new();
    while !r.is_empty() {
        let k = r.key_id()?;
        out.push((k, r.value()?));
    }
    Ok(out)
}

/// The latest-values row of a device: (key, ts, value) for every key.
pub fn encode_latest_row(values: &[(KeyId, Ts, Value)]) -> Vec<u8> {
    let mut w = Writer::new();
    for (k, ts, v) in values {
        w.key_id(*k).ts(*ts).value(v);
    }
    w.finish()
}

/// Inverse of [`encode_latest_row`].
pub fn decode_latest_row(buf: &[u8]) -> Result<Vec<(KeyId, Ts, Value)>, StoreError> {
    let mut r = Reader::new(buf)?;
    let mut out = Vec::new();
    while !r.is_empty() {
        let k = r.key_id()?;
        let ts = r.ts()?;
        out.push((k, ts, r.value()?));
    }
    Ok(out)
}

/// An attribute row: last update time and value.
pub fn encode_attr(ts: Ts, v: &Value) -> Vec<u8> {
    let mut w = Writer::new();
    w.ts(ts).value(v);
    w.finish()
}

/// Inverse of [`encode_attr`].
pub fn decode_attr(buf: &[u8]) -> Result<(Ts, Value), StoreError> {
    let mut r = Reader::new(buf)?;
    let ts = r.ts()?;
    Ok((ts, r.value()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ts_keys_sort_in_time_order() {
        let d = DeviceId::new_random();
        let ks: Vec<_> = [-5i64, -1, 0, 1, 1_700_000_000_000].iter().map(|t| ts_key(d, Ts(*t))).collect();
        assert!(ks.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(ts_of_key(&ks[0]).ok(), Some(Ts(-5)));
    }

    #[test]
    fn rows_round_trip() {
        let row = vec![
            (0, Value::Bool(true)),
            (300, Value::Long(-7)),
            (70_000, Value::Double(2.5)),
            (1, Value::Str("héllo".into())),
            (2, Value::Json("[1,2]".into())),
        ];
        assert_eq!(decode_ts_row(&encode_ts_row(&row)).ok(), Some(row.clone()));
        let latest: Vec<_> = row.iter().map(|(k, v)| (*k, Ts(9), v.clone())).collect();
        assert_eq!(decode_latest_row(&encode_latest_row(&latest)).ok(), Some(latest));
        assert_eq!(decode_attr(&encode_attr(Ts(3), &Value::Long(1))).ok(), Some((Ts(3), Value::Long(1))));
    }

    #[test]
    fn corrupt_rows_are_errors_not_panics() {
        assert!(decode_ts_row(&[]).is_err());
        assert!(decode_ts_row(&[9]).is_err());
        assert!(decode_ts_row(&[ROW_FORMAT, 1, TAG_LONG, 0]).is_err());
        assert!(decode_ts_row(&[ROW_FORMAT, 1, 77]).is_err());
        assert!(decode_ts_row(&[ROW_FORMAT, 1, TAG_STR, 0xff, 0xff, 0xff, 0xff, 0x7f]).is_err());
    }
}
