//! Dequantization of ggml tensor types to f32: F32, F16, Q4_0, Q4_1, Q8_0.

/// ggml type ids.
pub mod ty {
    /// f32.
    pub const F32: u32 = 0;
    /// f16.
    pub const F16: u32 = 1;
    /// 4-bit, scale.
    pub const Q4_0: u32 = 2;
    /// 4-bit, scale and min.
    pub const Q4_1: u32 = 3;
    /// 8-bit, scale.
    pub const Q8_0: u32 = 8;
}

const QK: usize = 32;

/// Bytes taken by `n` elements of type `t`; `None` for unsupported types or partial blocks.
pub fn byte_size(t: u32, n: usize) -> Option<usize> {
    let blocks = || n.is_multiple_of(QK).then_some(n / QK);
    match t {
        ty::F32 => Some(n * 4),
        ty::F16 => Some(n * 2),
        ty::Q4_0 => blocks().map(|b| b * 18),
        ty::Q4_1 => blocks().map(|b| b * 20),
        ty::Q8_0 => blocks().map(|b| b * 34),
        _ => None,
    }
}

/// IEEE half to single precision.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalise.
            let mut e = 127 - 15 + 1;
            let mut m = m;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x3ff) << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

fn half(b: &[u8]) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

/// Dequantizes `src` (type `t`) into `dst`; `dst.len()` is the element count. Returns false for an
/// unsupported type or a size mismatch.
pub fn dequantize(t: u32, src: &[u8], dst: &mut [f32]) -> bool {
    if byte_size(t, dst.len()) != Some(src.len()) {
        return false;
    }
    match t {
        ty::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        ty::F16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = half(s);
            }
        }
        ty::Q4_0 => {
            for (d, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(18)) {
                let s = half(&b[0..2]);
                for j in 0..16 {
                    d[j] = (f32::from(b[2 + j] & 0xf) - 8.0) * s;
                    d[j + 16] = (f32::from(b[2 + j] >> 4) - 8.0) * s;
                }
            }
        }
        ty::Q4_1 => {
            for (d, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(20)) {
                let s = half(&b[0..2]);
                let m = half(&b[2..4]);
                for j in 0..16 {
                    d[j] = f32::from(b[4 + j] & 0xf) * s + m;
                    d[j + 16] = f32::from(b[4 + j] >> 4) * s + m;
                }
            }
        }
        ty::Q8_0 => {
            for (d, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(34)) {
                let s = half(&b[0..2]);
                for j in 0..32 {
                    d[j] = f32::from(b[2 + j] as i8) * s;
                }
            }
        }
        _ => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
    }

    #[test]
    fn q4_1_block() {
        let mut b = vec![0u8; 20];
        b[0..2].copy_from_slice(&0x3c00u16.to_le_bytes()); // d = 1
        b[2..4].copy_from_slice(&0xc000u16.to_le_bytes()); // m = -2
        b[4] = 0x53; // element 0 = 3, element 16 = 5
        let mut out = vec![0f32; 32];
        assert!(dequantize(ty::Q4_1, &b, &mut out));
        assert_eq!(out[0], 1.0);
        assert_eq!(out[16], 3.0);
        assert_eq!(out[1], -2.0);
    }

    #[test]
    fn q8_0_block() {
        let mut b = vec![0u8; 34];
        b[0..2].copy_from_slice(&0x3800u16.to_le_bytes()); // 0.5
        b[2] = (-4i8) as u8;
        b[33] = 6;
        let mut out = vec![0f32; 32];
        assert!(dequantize(ty::Q8_0, &b, &mut out));
        assert_eq!(out[0], -2.0);
        assert_eq!(out[31], 3.0);
    }
}
