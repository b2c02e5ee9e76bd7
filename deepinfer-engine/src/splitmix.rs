//! SplitMix64 (Steele, Lea, Flood 2014): the tiny seedable generator behind the random
//! checkpoints (`model::random`), which only need weights that are reproducible from a seed,
//! not statistical quality.

/// A SplitMix64 stream.
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform in `[-1, 1)` (24 bits).
    pub(crate) fn sym(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}
