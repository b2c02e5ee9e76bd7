//! The memory-read floor: a plain parallel streaming read, the bandwidth baseline that
//! memory-bound kernels (GEMV, decode) are compared with.

use rayon::prelude::*;
use std::time::Instant;

/// The wrapping sum of every 32-bit word of `words`, read in parallel pieces of `piece` words
/// with 16 independent accumulators (so the read, not the adds, is the bound).
pub fn stream_read(words: &[u32], piece: usize) -> u32 {
    words
        .par_chunks(piece.max(1))
        .map(|c| {
            let mut acc = [0u32; 16];
            for ch in c.chunks_exact(16) {
                for l in 0..16 {
                    acc[l] = acc[l].wrapping_add(ch[l]);
                }
            }
            let tail = c.chunks_exact(16).remainder();
            tail.iter()
                .chain(acc.iter())
                .fold(0u32, |a, &b| a.wrapping_add(b))
        })
        .reduce(|| 0, u32::wrapping_add)
}

/// GB/s of [`stream_read`] over a fresh buffer of `bytes` (best of three, pieces sized for
/// four per worker thread).
pub fn read_bandwidth_gb_s(bytes: usize) -> f64 {
    let words: Vec<u32> = (0..(bytes / 4).max(16) as u32).collect();
    let piece = words
        .len()
        .div_ceil(rayon::current_num_threads().max(1) * 4);
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        std::hint::black_box(stream_read(std::hint::black_box(&words), piece));
        best = best.min(t.elapsed().as_secs_f64());
    }
    (words.len() * 4) as f64 / best.max(1e-12) / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sum_covers_every_word_whatever_the_pieces() {
        let words: Vec<u32> = (0..1_003).map(|i| i * 7 + 1).collect();
        let want = words.iter().fold(0u32, |a, &b| a.wrapping_add(b));
        for piece in [1, 5, 16, 17, 1_000, 4_096] {
            assert_eq!(stream_read(&words, piece), want, "piece {piece}");
        }
        assert!(read_bandwidth_gb_s(1 << 16) > 0.0);
    }
}
