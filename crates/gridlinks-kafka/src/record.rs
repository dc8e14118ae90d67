//! The Kafka record of one ingest item (sans-IO): a versioned binary encoding of a
//! telemetry or attributes write or an attributes delete, keyed by device so Kafka keeps one device's records in
//! order on one partition.
//!
//! ```text
//! value := FORMAT(1) kind(1) device(16) body
//! telemetry body  := n_records { ts(8, big-endian) n_values { key value } }
//! attributes body := scope(1) n_values { key value }
//! delete attributes body := scope(1) n_keys { key }
//! key := varint length, UTF-8; value := the storage row codec's tagged value
//! ```

use gridlinks_storage::codec::{Reader, Writer};
use gridlinks_storage::{StoreError, WriteOp};
use gridlinks_types::{AttributeScope, DeviceId, TsRecord, Value};

const KIND_TELEMETRY: u8 = 1;
const KIND_ATTRIBUTES: u8 = 2;
const KIND_DELETE_ATTRIBUTES: u8 = 3;

/// The record's key: the device id, so its records share a partition.
pub fn key(device: DeviceId) -> [u8; 16] {
    *device.as_bytes()
}

/// The device a data op is about, or `None` for ops that are not device data (they do not
/// go through Kafka).
pub fn device_of(op: &WriteOp) -> Option<DeviceId> {
    match op {
        WriteOp::Telemetry { device, .. }
        | WriteOp::Attributes { device, .. }
        | WriteOp::DeleteAttributes { device, .. } => Some(*device),
        _ => None,
    }
}

/// Encodes a telemetry, attributes or attributes-delete op; `None` for any other op.
pub fn encode(op: &WriteOp) -> Option<Vec<u8>> {
    let mut w = Writer::new();
    match op {
        WriteOp::Telemetry { device, records } => {
            w.bytes(&[KIND_TELEMETRY]).bytes(device.as_bytes()).varint(records.len() as u64);
            for r in records.iter() {
                w.ts(r.ts).varint(r.values.len() as u64);
                pairs(&mut w, &r.values);
            }
        }
        WriteOp::Attributes { device, scope, values } => {
            w.bytes(&[KIND_ATTRIBUTES]).bytes(device.as_bytes()).bytes(&[scope.tag()]).varint(values.len() as u64);
            pairs(&mut w, values);
        }
        WriteOp::DeleteAttributes { device, scope, keys } => {
            w.bytes(&[KIND_DELETE_ATTRIBUTES]).bytes(device.as_bytes()).bytes(&[scope.tag()]).varint(keys.len() as u64);
            for k in keys {
                w.text(k);
            }
        }
        _ => return None,
    }
    Some(w.finish())
}

fn pairs(w: &mut Writer, values: &[(String, Value)]) {
    for (k, v) in values {
        w.text(k).value(v);
    }
}

/// Decodes a record back into its op.
pub fn decode(buf: &[u8]) -> Result<WriteOp, StoreError> {
    let mut r = Reader::new(buf)?;
    let kind = r.byte()?;
    let device = DeviceId::from_bytes(r.bytes(16)?.try_into().map_err(|_| StoreError::Corrupt("device id"))?);
    let op = match kind {
        KIND_TELEMETRY => {
            let n = count(&mut r, 9)?;
            let mut records = Vec::with_capacity(n);
            for _ in 0..n {
                let ts = r.ts()?;
                let values = read_pairs(&mut r)?;
                records.push(TsRecord { ts, values });
            }
            WriteOp::Telemetry { device, records: records.into() }
        }
        KIND_ATTRIBUTES => WriteOp::Attributes { device, scope: scope(&mut r)?, values: read_pairs(&mut r)? },
        KIND_DELETE_ATTRIBUTES => {
            let scope = scope(&mut r)?;
            // A key is at least its 1-byte length.
            let n = count(&mut r, 1)?;
            let mut keys = Vec::with_capacity(n);
            for _ in 0..n {
                keys.push(r.text()?.to_owned());
            }
            WriteOp::DeleteAttributes { device, scope, keys }
        }
        _ => return Err(StoreError::Corrupt("record kind")),
    };
    if !r.is_empty() {
        return Err(StoreError::Corrupt("trailing bytes"));
    }
    Ok(op)
}

fn scope(r: &mut Reader<'_>) -> Result<AttributeScope, StoreError> {
    AttributeScope::from_tag(r.byte()?).ok_or(StoreError::Corrupt("attribute scope"))
}

/// A count of items each at least `min` bytes long, bounded by what is left of the record
/// (a corrupt count cannot make us allocate more than the record could hold).
fn count(r: &mut Reader<'_>, min: usize) -> Result<usize, StoreError> {
    let n = usize::try_from(r.varint()?).map_err(|_| StoreError::Corrupt("count"))?;
    if n > r.remaining() / min {
        return Err(StoreError::Corrupt("count larger than the record"));
    }
    Ok(n)
}

fn read_pairs(r: &mut Reader<'_>) -> Result<Vec<(String, Value)>, StoreError> {
    // A pair is at least a 1-byte key length and a 2-byte value.
    let n = count(r, 3)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let k = r.text()?.to_owned();
        out.push((k, r.value()?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlinks_types::Ts;

    fn device() -> DeviceId {
        DeviceId(uuid::Uuid::from_u128(0x1234_5678_9abc_def0_1122_3344_5566_7788))
    }

    #[test]
    fn telemetry_attributes_and_deletes_round_trip() {
        let ops = [
            WriteOp::Telemetry {
                device: device(),
                records: vec![
                    TsRecord {
                        ts: Ts(1_700_000_000_000),
                        values: vec![
                            ("t".into(), Value::Double(21.5)),
                            ("on".into(), Value::Bool(true)),
                            ("n".into(), Value::Long(-3)),
                        ],
                    },
                    TsRecord {
                        ts: Ts(1),
                        values: vec![("s".into(), Value::Str("é".into())), ("j".into(), Value::Json("{}".into()))],
                    },
                ]
                .into(),
            },
            WriteOp::Attributes {
                device: device(),
                scope: AttributeScope::Shared,
                values: vec![("target".into(), Value::Long(23))],
            },
            WriteOp::DeleteAttributes {
                device: device(),
                scope: AttributeScope::Server,
                keys: vec!["inactivityTimeout".into(), "é".into()],
            },
        ];
        for op in ops {
            let bytes = encode(&op).unwrap();
            assert_eq!(format!("{:?}", decode(&bytes).unwrap()), format!("{op:?}"));
            // Every truncation is an error, never a panic or a different op.
            for cut in 0..bytes.len() {
                assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
    }

    #[test]
    fn other_ops_are_not_records_and_garbage_is_refused() {
        assert!(encode(&WriteOp::DeleteDevice(device())).is_none());
        let mut huge = encode(&WriteOp::Telemetry { device: device(), records: Vec::new().into() }).unwrap();
        huge.pop();
        huge.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(matches!(decode(&huge), Err(StoreError::Corrupt("count larger than the record"))));
        assert!(decode(&[]).is_err());
        assert!(decode(&[0xee; 40]).is_err());
    }
}
