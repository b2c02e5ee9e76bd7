//! What the engine's benches share.

/// `n` deterministic token ids in `100..90_100` from `seed` (xorshift64).
pub fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 90_000) as u32 + 100
        })
        .collect()
}
