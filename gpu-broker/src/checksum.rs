//! Fast non-cryptographic checksum for weight regions (detects corruption, not attacks).

const K: u64 = 0x9E37_79B9_7F4A_7C15;
const LANES: usize = 8;

/// Streaming form of [`checksum`]: feed chunks whose lengths are multiples of 64 bytes, except
/// the last one.
#[derive(Debug, Clone)]
pub struct Hasher {
    lanes: [u64; LANES],
    len: u64,
    tail: Vec<u8>,
}

impl Default for Hasher {
    fn default() -> Self {
        let mut lanes = [0u64; LANES];
        for (i, l) in lanes.iter_mut().enumerate() {
            *l = K.wrapping_mul(i as u64 + 1);
        }
        Self {
            lanes,
            len: 0,
            tail: Vec::new(),
        }
    }
}

impl Hasher {
    /// Feeds a chunk. A chunk that is not a multiple of 64 bytes must be the last one.
    pub fn update(&mut self, data: &[u8]) {
        debug_assert!(self.tail.is_empty(), "only the last chunk may be partial");
        self.len += data.len() as u64;
        let chunks = data.chunks_exact(8 * LANES);
        self.tail.extend_from_slice(chunks.remainder());
        for c in chunks {
            for (i, l) in self.lanes.iter_mut().enumerate() {
                let mut w = [0u8; 8];
                w.copy_from_slice(&c[i * 8..i * 8 + 8]);
                *l = (*l ^ u64::from_le_bytes(w)).wrapping_mul(K).rotate_left(29);
            }
        }
    }

    /// The checksum.
    pub fn finish(&self) -> u64 {
        let mut h = self.len;
        for (i, &b) in self.tail.iter().enumerate() {
            h = (h ^ (u64::from(b) << ((i % 8) * 8))).wrapping_mul(K);
        }
        for l in self.lanes {
            h = (h ^ l).wrapping_mul(K).rotate_left(31);
        }
        h ^ (h >> 29)
    }
}

/// Checksum of `data`: eight independent multiply-rotate lanes over 64-bit words, then a mix.
pub fn checksum(data: &[u8]) -> u64 {
    let mut h = Hasher::default();
    h.update(data);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::{Hasher, checksum};

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
        let mut h = Hasher::default();
        h.update(&v[..4096]);
        h.update(&v[4096..]);
        assert_eq!(h.finish(), checksum(&v));
    }
}
