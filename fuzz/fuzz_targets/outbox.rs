//! The outbox entry codec (what data forwarding reads back from the data directory): any
//! bytes decode to an error or to an entry, never a panic, and an entry that decodes
//! encodes back to bytes that decode to the same entry.
#![no_main]

use gridlinks_storage::OutboxEvent;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok((at, event)) = OutboxEvent::decode(data) else { return };
    let again = event.encode(at);
    let (at2, back) = OutboxEvent::decode(&again).expect("an encoded entry decodes");
    // Debug text compares NaN values as equal, as the stored bits are.
    assert_eq!((at, format!("{event:?}")), (at2, format!("{back:?}")));
});
