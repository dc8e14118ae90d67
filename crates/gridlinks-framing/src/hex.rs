//! Byte strings in the configuration as hex (`"68"`, `"0d 0a"`).

use serde::{Deserialize, Deserializer, Serializer};

/// Hex digits (spaces allowed between bytes) to bytes.
pub fn decode(s: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !digits.len().is_multiple_of(2) {
        return Err(format!("hex string '{s}' has an odd number of digits"));
    }
    digits
        .chunks(2)
        .map(|pair| {
            let digit = |b: u8| (b as char).to_digit(16);
            match (digit(pair[0]), digit(pair[1])) {
                (Some(hi), Some(lo)) => Ok((hi * 16 + lo) as u8),
                _ => Err(format!("'{s}' is not a hex string")),
            }
        })
        .collect()
}

pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    decode(&String::deserialize(d)?).map_err(serde::de::Error::custom)
}
