//! Engram n-gram hashing (V4.1, architecture section 4.2): compressed token ids, per-layer
//! odd multipliers drawn exactly as `numpy.random.default_rng(10007 * layer).integers(0, B,
//! size=n, dtype=int64)` does (SeedSequence → PCG64 → Lemire bounded integers), a rolling
//! XOR hash, and bucket primes from one shared ascending sequence.

use crate::config::EngramConfig;

/// Engram hashing could not be set up.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EngramError {
    /// The token map is too short or maps outside the compressed vocabulary.
    #[error("engram token map: {0}")]
    TokenMap(String),
    /// `engram_num_embeddings` disagrees with the bucket primes.
    #[error(
        "engram_num_embeddings[{layer}] = {configured} but the bucket primes sum to {computed}"
    )]
    TableSize {
        /// Position in `engram_layer_ids`.
        layer: usize,
        /// Configured rows.
        configured: u64,
        /// Sum of the primes.
        computed: u64,
    },
}

// ---- numpy's SeedSequence and PCG64 ---------------------------------------------------------

const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;
const POOL: usize = 4;

fn hashmix(mut value: u32, hash_const: &mut u32) -> u32 {
    value ^= *hash_const;
    *hash_const = hash_const.wrapping_mul(MULT_A);
    value = value.wrapping_mul(*hash_const);
    value ^ (value >> XSHIFT)
}

fn mix(x: u32, y: u32) -> u32 {
    let r = MIX_MULT_L
        .wrapping_mul(x)
        .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    r ^ (r >> XSHIFT)
}

/// `SeedSequence(seed).generate_state(n_words, uint64)` for a non-negative integer seed.
fn seed_sequence_u64(seed: u64, n_words: usize) -> Vec<u64> {
    let mut entropy = vec![seed as u32];
    if seed >> 32 != 0 {
        entropy.push((seed >> 32) as u32);
    }
    let mut pool = [0u32; POOL];
    let mut hc = INIT_A;
    for (i, p) in pool.iter_mut().enumerate() {
        *p = hashmix(entropy.get(i).copied().unwrap_or(0), &mut hc);
    }
    for src in 0..POOL {
        for dst in 0..POOL {
            if src != dst {
                let h = hashmix(pool[src], &mut hc);
                pool[dst] = mix(pool[dst], h);
            }
        }
    }
    for &e in entropy.iter().skip(POOL) {
        for p in pool.iter_mut() {
            let h = hashmix(e, &mut hc);
            *p = mix(*p, h);
        }
    }
    let mut hb = INIT_B;
    let words: Vec<u32> = (0..2 * n_words)
        .map(|i| {
            let mut v = pool[i % POOL];
            v ^= hb;
            hb = hb.wrapping_mul(MULT_B);
            v = v.wrapping_mul(hb);
            v ^ (v >> XSHIFT)
        })
        .collect();
    words
        .chunks_exact(2)
        .map(|w| (w[0] as u64) | ((w[1] as u64) << 32))
        .collect()
}

const PCG_MULT: u128 = 0x2360_ed05_1fc6_5da4_4385_df64_9fcc_f645;

/// numpy's PCG64 (XSL-RR 128/64) bit generator.
struct Pcg64 {
    state: u128,
    inc: u128,
    buffered: Option<u32>,
}

impl Pcg64 {
    fn from_seed(seed: u64) -> Self {
        let v = seed_sequence_u64(seed, 4);
        let initstate = ((v[0] as u128) << 64) | v[1] as u128;
        let initseq = ((v[2] as u128) << 64) | v[3] as u128;
        let mut g = Pcg64 {
            state: 0,
            inc: (initseq << 1) | 1,
            buffered: None,
        };
        g.step();
        g.state = g.state.wrapping_add(initstate);
        g.step();
        g
    }
    fn step(&mut self) {
        self.state = self.state.wrapping_mul(PCG_MULT).wrapping_add(self.inc);
    }
    fn next_u64(&mut self) -> u64 {
        self.step();
        let s = self.state;
        let v = ((s >> 64) as u64) ^ (s as u64);
        v.rotate_right((s >> 122) as u32)
    }
    fn next_u32(&mut self) -> u32 {
        if let Some(u) = self.buffered.take() {
            return u;
        }
        let n = self.next_u64();
        self.buffered = Some((n >> 32) as u32);
        n as u32
    }
    /// `integers(0, rng + 1)` for one value (numpy's Lemire path, unmasked).
    fn bounded(&mut self, rng: u64) -> u64 {
        if rng == 0 {
            return 0;
        }
        if rng <= 0xffff_ffff {
            let rng = rng as u32;
            if rng == u32::MAX {
                return self.next_u32() as u64;
            }
            let excl = rng + 1;
            let mut m = self.next_u32() as u64 * excl as u64;
            let mut left = m as u32;
            if left < excl {
                let threshold = (u32::MAX - rng) % excl;
                while left < threshold {
                    m = self.next_u32() as u64 * excl as u64;
                    left = m as u32;
                }
            }
            return m >> 32;
        }
        if rng == u64::MAX {
            return self.next_u64();
        }
        let excl = rng + 1;
        let mut m = self.next_u64() as u128 * excl as u128;
        let mut left = m as u64;
        if left < excl {
            let threshold = (u64::MAX - rng) % excl;
            while left < threshold {
                m = self.next_u64() as u128 * excl as u128;
                left = m as u64;
            }
        }
        (m >> 64) as u64
    }
}

// ---- primes ---------------------------------------------------------------------------------

fn mul_mod(a: u64, b: u64, m: u64) -> u64 {
    ((a as u128 * b as u128) % m as u128) as u64
}

fn pow_mod(mut a: u64, mut e: u64, m: u64) -> u64 {
    let mut r = 1u64;
    a %= m;
    while e > 0 {
        if e & 1 == 1 {
            r = mul_mod(r, a, m);
        }
        a = mul_mod(a, a, m);
        e >>= 1;
    }
    r
}

/// Deterministic Miller-Rabin for 64-bit integers.
pub fn is_prime(n: u64) -> bool {
    const BASES: [u64; 12] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37];
    if n < 2 {
        return false;
    }
    for p in BASES {
        if n.is_multiple_of(p) {
            return n == p;
        }
    }
    let (mut d, mut r) = (n - 1, 0);
    while d % 2 == 0 {
        d /= 2;
        r += 1;
    }
    'outer: for a in BASES {
        let mut x = pow_mod(a, d, n);
        if x == 1 || x == n - 1 {
            continue;
        }
        for _ in 0..r - 1 {
            x = mul_mod(x, x, n);
            if x == n - 1 {
                continue 'outer;
            }
        }
        return false;
    }
    true
}

/// Host-side Engram hasher: token ids → table row ids per Engram layer.
#[derive(Debug, Clone)]
pub struct EngramHasher {
    n: usize,
    heads: usize,
    token_map: Vec<i64>,
    pad: i64,
    /// `[layer][ngram-2][head]` moduli.
    primes: Vec<Vec<Vec<u64>>>,
    /// `[layer][shift]` odd multipliers.
    mult: Vec<Vec<i64>>,
    /// `[layer][column]` row offsets.
    offsets: Vec<Vec<i64>>,
}

impl EngramHasher {
    /// Build from the config and the token → compressed-id map.
    pub fn new(
        c: &EngramConfig,
        token_map: Vec<i64>,
        vocab_size: usize,
    ) -> Result<Self, EngramError> {
        if token_map.len() < vocab_size {
            return Err(EngramError::TokenMap(format!(
                "{} entries for a vocabulary of {vocab_size}",
                token_map.len()
            )));
        }
        if let Some(bad) = token_map
            .iter()
            .find(|&&t| t < 0 || t as u64 >= c.compressed_vocab_size)
        {
            return Err(EngramError::TokenMap(format!(
                "compressed id {bad} outside 0..{}",
                c.compressed_vocab_size
            )));
        }
        if c.pad_token_id >= token_map.len() {
            return Err(EngramError::TokenMap(
                "engram_pad_token_id outside the map".into(),
            ));
        }
        let pad = token_map[c.pad_token_id];
        let mut seen = std::collections::HashSet::new();
        let mut primes = Vec::new();
        for _ in &c.layer_ids {
            let mut per_n = Vec::new();
            for _ in 0..c.max_ngram_size - 1 {
                let mut cur = c.vocab_size.saturating_sub(1);
                let mut sizes = Vec::new();
                for _ in 0..c.n_heads {
                    cur += 1;
                    while !is_prime(cur) || seen.contains(&cur) {
                        cur += 1;
                    }
                    seen.insert(cur);
                    sizes.push(cur);
                }
                per_n.push(sizes);
            }
            primes.push(per_n);
        }
        let mut offsets = Vec::new();
        for (li, per_n) in primes.iter().enumerate() {
            let flat: Vec<u64> = per_n.iter().flatten().copied().collect();
            let total: u64 = flat.iter().sum();
            if total != c.num_embeddings[li] {
                return Err(EngramError::TableSize {
                    layer: li,
                    configured: c.num_embeddings[li],
                    computed: total,
                });
            }
            let mut acc = 0i64;
            offsets.push(
                flat.iter()
                    .map(|&p| {
                        let o = acc;
                        acc += p as i64;
                        o
                    })
                    .collect(),
            );
        }
        let bound = ((i64::MAX as u64) / c.compressed_vocab_size / 2).max(1);
        let mult = c
            .layer_ids
            .iter()
            .map(|&lid| {
                let mut g = Pcg64::from_seed(10007 * lid as u64);
                (0..c.max_ngram_size)
                    .map(|_| g.bounded(bound - 1) as i64 * 2 + 1)
                    .collect()
            })
            .collect();
        Ok(EngramHasher {
            n: c.max_ngram_size,
            heads: c.n_heads,
            token_map,
            pad,
            primes,
            mult,
            offsets,
        })
    }

    /// Hash columns per layer: `(max_ngram_size - 1) * n_heads`.
    pub fn columns(&self) -> usize {
        (self.n - 1) * self.heads
    }

    /// Tokens of look-back the hash needs.
    pub fn lookback(&self) -> usize {
        self.n - 1
    }

    /// Row ids for `new_ids` following `history` (at least the last `lookback()` earlier ids,
    /// positioned so that `history.len()` = number of tokens before `new_ids` when shorter
    /// than the look-back). Returns `[S][layer][column]` flattened as `S * layers * columns`.
    pub fn hash(&self, history: &[u32], start_pos: usize, new_ids: &[u32]) -> Vec<i64> {
        let cols = self.columns();
        let nl = self.primes.len();
        let mut out = vec![0i64; new_ids.len() * nl * cols];
        for (s, _) in new_ids.iter().enumerate() {
            let p = start_pos + s;
            let mut vals = Vec::with_capacity(self.n);
            let mut blocked = false;
            for sh in 0..self.n {
                blocked = blocked || p < sh;
                if blocked {
                    vals.push(self.pad);
                    continue;
                }
                // position p - sh: inside this chunk or in the history tail
                let tok = if sh <= s {
                    new_ids[s - sh]
                } else {
                    history[history.len() - (sh - s)]
                };
                vals.push(
                    self.token_map
                        .get(tok as usize)
                        .copied()
                        .unwrap_or(self.pad),
                );
            }
            for li in 0..nl {
                let m = &self.mult[li];
                let mut rolling = vals[0].wrapping_mul(m[0]);
                for sh in 1..self.n {
                    rolling ^= vals[sh].wrapping_mul(m[sh]);
                    for h in 0..self.heads {
                        let col = (sh - 1) * self.heads + h;
                        let prime = self.primes[li][sh - 1][h] as i64;
                        out[(s * nl + li) * cols + col] =
                            rolling.rem_euclid(prime) + self.offsets[li][col];
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primes() {
        assert!(is_prime(2) && is_prime(97) && is_prime(1_000_000_007));
        assert!(!is_prime(1) && !is_prime(91) && !is_prime(1_000_000_007 * 3));
    }
}
