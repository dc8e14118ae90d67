//! The client-certificate reader (`gridlinks_thingsboard::x509`), which reads certificates
//! TLS clients present before anything else about them is known: never panics; a
//! certificate it reads has a key inside the input and a fingerprint of 64 hex digits.
#![no_main]

use gridlinks_thingsboard::x509::{der_fingerprint, parse_der, public_key};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let info = parse_der(data);
    if let Ok((algorithm, key)) = public_key(data) {
        let inside = |part: &[u8]| data.as_ptr_range().contains(&part.as_ptr()) || part.is_empty();
        assert!(inside(algorithm) && inside(key));
    }
    if info.is_ok() {
        assert_eq!(der_fingerprint(data).len(), 64);
    }
});
