//! Philox-4x32-10 counter-based generator and the exact recipe that turns
//! `(seed, offset)` into words, uniforms and unbiased integers.
//!
//! Nothing here keeps per-request state between calls: every draw is a pure
//! function of `(seed, offset, word index)`, so the CPU sampler and a GPU
//! kernel that follows the recipe produce the same numbers.
//!
//! # The recipe (mirror it bit for bit)
//! * key = `[seed as u32, (seed >> 32) as u32]`.
//! * counter of block `b` (b = 0, 1, 2, ...) =
//!   `[offset as u32, (offset >> 32) as u32, b as u32, (b >> 32) as u32]`.
//! * each block gives four words `out[0..4]`; words are consumed in the order
//!   `block 0 out[0], out[1], out[2], out[3], block 1 out[0], ...`.
//! * a 64-bit draw is two consecutive words `a, b`: `(a << 32) | b`.
//! * uniform `f64` in `[0, 1)`: `(u64_draw >> 11) as f64 * 2^-53`.
//! * uniform `f32` in `[0, 1)`: `(word >> 8) as f32 * 2^-24`.
//! * integer below `n` ([`PhiloxStream::below`]): `n == 1` gives 0 and
//!   consumes nothing; otherwise `bits = 64 - leading_zeros(n - 1)` and each
//!   attempt takes one 64-bit draw `x`, uses its top `bits` bits
//!   (`x >> (64 - bits)`), and is accepted when below `n` (rejection, so
//!   there is no modulo bias; each attempt succeeds with probability > 1/2).
//! * offsets: `offset = position * 3 + k` (wrapping), `k` from [`DrawKind`].

/// First Philox multiplier (Random123 `PHILOX_M4x32_0`).
pub const PHILOX_M0: u32 = 0xD251_1F53;
/// Second Philox multiplier (Random123 `PHILOX_M4x32_1`).
pub const PHILOX_M1: u32 = 0xCD9E_8D57;
/// First Weyl key increment (golden ratio, Random123 `PHILOX_W32_0`).
pub const PHILOX_W0: u32 = 0x9E37_79B9;
/// Second Weyl key increment (sqrt(3) - 1, Random123 `PHILOX_W32_1`).
pub const PHILOX_W1: u32 = 0xBB67_AE85;
/// Number of rounds of the generator used everywhere in this crate.
pub const PHILOX_ROUNDS: u32 = 10;
/// Offsets per position: one each for [`DrawKind::Sample`],
/// [`DrawKind::Resample`] and [`DrawKind::Coin`].
pub const DRAWS_PER_POSITION: u64 = 3;

/// Philox-4x32 with `rounds` rounds: a bijection of the 128-bit counter keyed
/// by a 64-bit key. `rounds = 10` is the standard Philox-4x32-10.
pub fn philox4x32(rounds: u32, ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = ctr;
    let mut k = key;
    for round in 0..rounds {
        if round > 0 {
            // The key is bumped between rounds, not before the first one.
            k[0] = k[0].wrapping_add(PHILOX_W0);
            k[1] = k[1].wrapping_add(PHILOX_W1);
        }
        let p0 = u64::from(PHILOX_M0) * u64::from(c[0]);
        let p1 = u64::from(PHILOX_M1) * u64::from(c[2]);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// Philox-4x32-10 (the generator cuRAND and PyTorch use).
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    philox4x32(PHILOX_ROUNDS, ctr, key)
}

/// Which of the three random streams of a position a draw belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DrawKind {
    /// k = 0: an ordinary sample (also the bonus token after a fully accepted draft).
    Sample = 0,
    /// k = 1: the resample after a rejected draft token.
    Resample = 1,
    /// k = 2: the accept-or-reject coin of a draft token.
    Coin = 2,
}

/// `position * 3 + k` (wrapping on overflow, which needs positions above 2^62).
pub fn draw_offset(position: u64, kind: DrawKind) -> u64 {
    position
        .wrapping_mul(DRAWS_PER_POSITION)
        .wrapping_add(kind as u64)
}

/// The key Philox uses for `seed`.
pub fn seed_key(seed: u64) -> [u32; 2] {
    [seed as u32, (seed >> 32) as u32]
}

/// The counter of block `block` of the stream at `offset`.
pub fn stream_counter(offset: u64, block: u64) -> [u32; 4] {
    [
        offset as u32,
        (offset >> 32) as u32,
        block as u32,
        (block >> 32) as u32,
    ]
}

/// The words of one `(seed, offset)` stream, in the documented order.
#[derive(Clone, Debug)]
pub struct PhiloxStream {
    key: [u32; 2],
    offset: u64,
    block: u64,
    buf: [u32; 4],
    used: usize,
}

impl PhiloxStream {
    /// The stream for `rng(seed, offset)`, positioned at its first word.
    pub fn new(seed: u64, offset: u64) -> Self {
        Self {
            key: seed_key(seed),
            offset,
            block: 0,
            buf: [0; 4],
            used: 4,
        }
    }

    /// The stream of `kind` at `position` for `seed`.
    pub fn for_draw(seed: u64, position: u64, kind: DrawKind) -> Self {
        Self::new(seed, draw_offset(position, kind))
    }

    /// Next 32-bit word.
    pub fn next_u32(&mut self) -> u32 {
        if self.used == 4 {
            self.buf = philox4x32_10(stream_counter(self.offset, self.block), self.key);
            self.block = self.block.wrapping_add(1);
            self.used = 0;
        }
        let w = self.buf[self.used];
        self.used += 1;
        w
    }

    /// Next 64-bit draw: two words, the first one high.
    pub fn next_u64(&mut self) -> u64 {
        let hi = u64::from(self.next_u32());
        let lo = u64::from(self.next_u32());
        (hi << 32) | lo
    }

    /// Uniform `f64` in `[0, 1)` with 53 random bits.
    pub fn uniform_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform `f32` in `[0, 1)` with 24 random bits.
    pub fn uniform_f32(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Uniform integer in `[0, n)` by rejection on the top bits (no modulo
    /// bias). `n == 0` is treated as 1 and returns 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n <= 1 {
            return 0;
        }
        let bits = 64 - (n - 1).leading_zeros();
        loop {
            let x = self.next_u64() >> (64 - bits);
            if x < n {
                return x;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Random123 kat_vectors, philox4x32 10: counter (4 words), key (2 words) -> output.
    #[test]
    fn known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn stream_follows_counter_layout() {
        let seed = 0x0123_4567_89ab_cdef;
        let mut s = PhiloxStream::new(seed, 7);
        let b0 = philox4x32_10([7, 0, 0, 0], [0x89ab_cdef, 0x0123_4567]);
        let b1 = philox4x32_10([7, 0, 1, 0], [0x89ab_cdef, 0x0123_4567]);
        let words: Vec<u32> = (0..8).map(|_| s.next_u32()).collect();
        assert_eq!(&words[..4], &b0);
        assert_eq!(&words[4..], &b1);
        let mut s = PhiloxStream::new(seed, 7);
        assert_eq!(s.next_u64(), (u64::from(b0[0]) << 32) | u64::from(b0[1]));
        let mut s = PhiloxStream::new(seed, 7);
        assert_eq!(s.uniform_f32(), (b0[0] >> 8) as f32 / 16_777_216.0);
    }

    #[test]
    fn offsets_are_distinct_per_kind() {
        assert_eq!(draw_offset(5, DrawKind::Sample), 15);
        assert_eq!(draw_offset(5, DrawKind::Resample), 16);
        assert_eq!(draw_offset(5, DrawKind::Coin), 17);
    }

    #[test]
    fn below_is_in_range_and_covers_small_ranges() {
        let mut seen = [0u32; 5];
        for off in 0..2000 {
            let v = PhiloxStream::new(3, off).below(5);
            seen[v as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 300), "{seen:?}");
        assert_eq!(PhiloxStream::new(3, 0).below(1), 0);
        let big = (1u64 << 63) + 12345;
        for off in 0..100 {
            assert!(PhiloxStream::new(9, off).below(big) < big);
        }
    }

    #[test]
    fn uniforms_are_in_unit_interval() {
        for off in 0..1000 {
            let mut s = PhiloxStream::new(11, off);
            let a = s.uniform_f64();
            let b = s.uniform_f32();
            assert!((0.0..1.0).contains(&a));
            assert!((0.0..1.0).contains(&b));
        }
    }
}
