//! Checksums device protocols put in their frames.

/// CRC-16/MODBUS (poly 0x8005 reflected, init 0xFFFF, no final XOR) of `data`.
pub fn crc16_modbus(data: &[u8]) -> u16 {
    let mut crc: u16 = 0xFFFF;
    for &b in data {
        crc ^= u16::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xA001 } else { crc >> 1 };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_value_of_the_catalogue() {
        // The CRC catalogue's check: CRC-16/MODBUS of "123456789" is 0x4B37.
        assert_eq!(crc16_modbus(b"123456789"), 0x4B37);
        assert_eq!(crc16_modbus(b""), 0xFFFF);
    }
}
