//! The Kafka record codecs (what a storage writer reads back from the device-data topic,
//! and what every node reads from the broker topic): any bytes decode to an error or to a
//! record, never a panic, and a record that decodes encodes back to one that decodes to
//! the same thing.
#![no_main]

use gridlinks_kafka::bus::BrokerRecord;
use gridlinks_kafka::record::{decode, encode};
use gridlinks_storage::WriteOp;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = BrokerRecord::decode(data) {
        assert_eq!(BrokerRecord::decode(&r.encode()).expect("an encoded broker record decodes"), r);
    }
    let Ok(op) = decode(data) else { return };
    let again = encode(&op).expect("a decoded record is device data");
    let back = decode(&again).expect("an encoded record decodes");
    match (&op, &back) {
        (WriteOp::Telemetry { device: a, records: x }, WriteOp::Telemetry { device: b, records: y }) => {
            assert_eq!((a, format!("{x:?}")), (b, format!("{y:?}")));
        }
        (
            WriteOp::Attributes { device: a, scope: s, values: x },
            WriteOp::Attributes { device: b, scope: t, values: y },
        ) => assert_eq!((a, s, format!("{x:?}")), (b, t, format!("{y:?}"))),
        (
            WriteOp::DeleteAttributes { device: a, scope: s, keys: x },
            WriteOp::DeleteAttributes { device: b, scope: t, keys: y },
        ) => assert_eq!((a, s, x), (b, t, y)),
        _ => panic!("decoded {op:?}, then {back:?}"),
    }
});
