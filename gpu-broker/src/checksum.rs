//! Fast non-cryptographic checksum for weight regions (detects corruption, not attacks).

const K: u64 = 0x9E37_79B9_7F4A_7C15;
const LANES: usize = 8;

/// Checksum of `data`: eight independent multiply-rotate lanes over 64-bit words, then a mix.
pub fn checksum(data: &[u8]) -> u64 {
    let mut lanes = [0u64; LANES];
    for (i, l) in lanes.iter_mut().enumerate() {
        *l = K.wrapping_mul(i as u64 + 1);
    }
    let chunks = data.chunks_exact(8 * LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (i, l) in lanes.iter_mut().enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(&c[i * 8..i * 8 + 8]);
            *l = (*l ^ u64::from_le_bytes(w)).wrapping_mul(K).rotate_left(29);
        }
    }
    let mut h = data.len() as u64;
    for (i, &b) in rest.iter().enumerate() {
        h = (h ^ (u64::from(b) << ((i % 8) * 8))).wrapping_mul(K);
    }
    for l in lanes {
        h = (h ^ l).wrapping_mul(K).rotate_left(31);
    }
    h ^ (h >> 29)
}

#[cfg(test)]
mod tests {
    use super::checksum;

    #[test]
    fn detects_a_single_bit_flip() {
        let mut v = vec![7u8; 4099];
        let a = checksum(&v);
        v[2048] ^= 1;
        assert_ne!(a, checksum(&v));
        v[2048] ^= 1;
        v[4098] ^= 0x80;
        assert_ne!(a, checksum(&v));
        assert_ne!(checksum(&[]), checksum(&[0]));
    }
}
