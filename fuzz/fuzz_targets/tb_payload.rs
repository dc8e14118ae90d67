//! ThingsBoard JSON payload decoders (telemetry, attributes, gateway forms and requests):
//! never panic, and whatever they accept respects the limits.
#![no_main]

use gridlinks_thingsboard::gateway::{self, MAX_REQUEST_KEYS};
use gridlinks_thingsboard::payload::{
    parse_attributes, parse_gateway_attributes, parse_gateway_device, parse_gateway_telemetry, parse_telemetry,
    PayloadLimits,
};
use gridlinks_types::Ts;
use libfuzzer_sys::fuzz_target;

const LIM: PayloadLimits = PayloadLimits { max_key_len: 32, max_values: 64, cast_strings: true };

fuzz_target!(|data: &[u8]| {
    if let Ok(records) = parse_telemetry(data, Ts(0), LIM) {
        let n: usize = records.iter().map(|r| r.values.len()).sum();
        assert!(n <= LIM.max_values && records.iter().all(|r| !r.values.is_empty()));
        assert!(records.iter().flat_map(|r| &r.values).all(|(k, _)| !k.is_empty() && k.len() <= LIM.max_key_len));
    }
    if let Ok(values) = parse_attributes(data, LIM, true) {
        assert!(!values.is_empty() && values.len() <= LIM.max_values);
    }
    let _ = parse_attributes(data, LIM, false);
    if let Ok(devices) = parse_gateway_telemetry(data, Ts(0), LIM) {
        assert!(
            devices.iter().map(|(_, r)| r.iter().map(|r| r.values.len()).sum::<usize>()).sum::<usize>()
                <= LIM.max_values
        );
    }
    let _ = parse_gateway_attributes(data, LIM);
    let _ = parse_gateway_device(data);
    if let Ok(req) = gateway::parse_attribute_request(data) {
        assert!(req.keys.len() <= MAX_REQUEST_KEYS && !req.device.is_empty());
        let _ = gateway::attribute_response(&req, Vec::new());
    }
    if let Ok(reply) = gateway::parse_rpc_reply(data) {
        assert!(serde_json::from_str::<serde_json::Value>(&reply.data).is_ok());
        let _ = gateway::rpc_request(&reply.device, reply.id, data);
    }
    if let Ok(claims) = gateway::parse_claims(data) {
        assert!(!claims.is_empty());
    }
});
