//! Checksums device protocols put in their frames.

/// CRC-16/MODBUS (poly 0x8005 reflected, init 0xFFFF, no final XOR) of `data`, a table
/// lookup per byte.
pub fn crc16_modbus(data: &[u8]) -> u16 {
    data.iter().fold(0xFFFF, |crc, &b| (crc >> 8) ^ CRC16_MODBUS[usize::from((crc as u8) ^ b)])
}

/// The sum of `data`'s bytes modulo 256.
pub fn sum8(data: &[u8]) -> u8 {
    data.iter().fold(0u8, |s, &b| s.wrapping_add(b))
}

/// CRC-16/MODBUS of every byte value, computed bit by bit at compile time.
const CRC16_MODBUS: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u16;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xA001 } else { crc >> 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_value_of_the_catalogue() {
        // The CRC catalogue's check: CRC-16/MODBUS of "123456789" is 0x4B37.
        assert_eq!(crc16_modbus(b"123456789"), 0x4B37);
        assert_eq!(crc16_modbus(b""), 0xFFFF);
        assert_eq!(sum8(&[0xff, 0x02]), 0x01);
    }
}
