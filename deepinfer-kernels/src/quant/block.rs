//! The inner loops of quantise / dequantise, written in fixed-width chunks the compiler
//! vectorises (block maxima on integer bit patterns, branch-free encoders, table decoders),
//! with an AVX2 build selected at run time on x86-64. The same IEEE operations run in every
//! build, so the results do not depend on the CPU.

use super::ScaleFormat;
use super::fp4::{self, E2M1_PAIR_LUT, e2m1_encode};
use super::fp8::{self, E4M3_LUT, ceil_log2, e4m3_encode, exp2i, ue8m0_decode, ue8m0_encode_pow2};

/// Values per chunk of the vectorised loops.
const W: usize = 16;

/// The largest `|v|` bit pattern (sign cleared) in `x`, 0 when empty.
///
/// For finite values it orders like `|v|`, so `f32::from_bits` of it is the block's absolute
/// maximum; NaN and ±inf give a pattern `>= 0x7f80_0000`, which makes it a finiteness check
/// in the same pass.
#[inline(always)]
fn amax_bits_body(x: &[f32]) -> u32 {
    let mut acc = [0u32; W];
    let mut c = x.chunks_exact(W);
    for ch in &mut c {
        for l in 0..W {
            acc[l] = acc[l].max(ch[l].to_bits() & 0x7fff_ffff);
        }
    }
    let mut m = 0;
    for v in c.remainder() {
        m = m.max(v.to_bits() & 0x7fff_ffff);
    }
    acc.iter().fold(m, |m, &a| m.max(a))
}

/// `out[i] = e4m3(x[i] * inv)`.
#[inline(always)]
fn encode_fp8_body(x: &[f32], inv: f32, out: &mut [u8]) {
    let n = x.len().min(out.len());
    let (x, out) = (&x[..n], &mut out[..n]);
    let mut xc = x.chunks_exact(W);
    let mut oc = out.chunks_exact_mut(W);
    for (xs, os) in (&mut xc).zip(&mut oc) {
        for l in 0..W {
            os[l] = e4m3_encode(xs[l] * inv);
        }
    }
    for (o, &v) in oc.into_remainder().iter_mut().zip(xc.remainder()) {
        *o = e4m3_encode(v * inv);
    }
}

/// `out[i] = e2m1(x[2i] * inv) | e2m1(x[2i + 1] * inv) << 4` (`x` has an even length).
#[inline(always)]
fn encode_fp4_body(x: &[f32], inv: f32, out: &mut [u8]) {
    let n = (x.len() / 2).min(out.len());
    let (x, out) = (&x[..2 * n], &mut out[..n]);
    let mut xc = x.chunks_exact(W);
    let mut oc = out.chunks_exact_mut(W / 2);
    for (xs, os) in (&mut xc).zip(&mut oc) {
        let mut c = [0u8; W];
        for l in 0..W {
            c[l] = e2m1_encode(xs[l] * inv);
        }
        for i in 0..W / 2 {
            os[i] = c[2 * i] | (c[2 * i + 1] << 4);
        }
    }
    for (o, p) in oc
        .into_remainder()
        .iter_mut()
        .zip(xc.remainder().chunks_exact(2))
    {
        *o = e2m1_encode(p[0] * inv) | (e2m1_encode(p[1] * inv) << 4);
    }
}

/// Block-scaled FP8 over a `[rows, cols]` matrix, one `br × bc` scale tile at a time: its
/// maximum, then its encoding while it is still in cache. Writes `scales` (f32, one per
/// tile) and `data`; `false` on non-finite input.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn quantize_fp8_body(
    x: &[f32],
    (rows, cols): (usize, usize),
    (br, bc): (usize, usize),
    scale: ScaleFormat,
    scales: &mut [f32],
    data: &mut [u8],
) -> bool {
    let nbc = cols.div_ceil(bc);
    for (bi, r0) in (0..rows).step_by(br).enumerate() {
        let r1 = (r0 + br).min(rows);
        for (bj, c0) in (0..cols).step_by(bc).enumerate() {
            let c1 = (c0 + bc).min(cols);
            let mut m = 0u32;
            for r in r0..r1 {
                m = m.max(amax_bits_body(&x[r * cols + c0..r * cols + c1]));
            }
            if non_finite(m) {
                return false;
            }
            let amax = f32::from_bits(m).max(1e-12);
            let s = match scale {
                ScaleFormat::F32 => amax / fp8::E4M3_MAX,
                ScaleFormat::Ue8m0 => exp2i(ceil_log2(amax / fp8::E4M3_MAX).clamp(-127, 127)),
            };
            scales[bi * nbc + bj] = s;
            // Multiplying by the reciprocal (exact for power-of-two scales) keeps the loop
            // vectorisable; for f32 scales it may differ from `v / s` in the last bit.
            let inv = 1.0 / s;
            for r in r0..r1 {
                let (a, b) = (r * cols + c0, r * cols + c1);
                encode_fp8_body(&x[a..b], inv, &mut data[a..b]);
            }
        }
    }
    true
}

/// MXFP4 (`tensor_scale == None`) or NVFP4 blocks of `bc` values along the flat input:
/// block maximum, scale byte, packed codes. `false` on non-finite input.
#[inline(always)]
fn quantize_fp4_body(
    x: &[f32],
    bc: usize,
    tensor_scale: Option<f32>,
    scale_bytes: &mut [u8],
    data: &mut [u8],
) -> bool {
    // Groups of G blocks in three passes (maxima, scales, codes): the scale arithmetic of one
    // block (two divisions, encode, decode) no longer sits in a serial chain between two
    // blocks' vector loops, so the CPU overlaps it across blocks.
    const G: usize = 64;
    let groups = x
        .chunks(G * bc)
        .zip(data.chunks_mut(G * bc / 2))
        .zip(scale_bytes.chunks_mut(G));
    for ((xg, dg), sg) in groups {
        let mut amax = [0u32; G];
        for (a, blk) in amax.iter_mut().zip(xg.chunks_exact(bc)) {
            *a = amax_bits_body(blk);
        }
        if non_finite(amax.iter().fold(0, |m, &a| m.max(a))) {
            return false;
        }
        let mut inv = [0.0f32; G];
        for ((sb, iv), &m) in sg.iter_mut().zip(inv.iter_mut()).zip(&amax) {
            let amax = f32::from_bits(m);
            let (byte, s) = match tensor_scale {
                None => {
                    let p = ceil_log2(amax.max(fp4::E2M1_MAX * exp2i(-126)) / fp4::E2M1_MAX);
                    let b = ue8m0_encode_pow2(p);
                    (b, ue8m0_decode(b))
                }
                Some(ts) => {
                    let floor = fp4::E2M1_MAX * exp2i(-9);
                    let b = e4m3_encode((amax / ts).max(floor) / fp4::E2M1_MAX);
                    (b, E4M3_LUT[b as usize] * ts)
                }
            };
            *sb = byte;
            *iv = 1.0 / s;
        }
        for ((blk, out), &iv) in xg
            .chunks_exact(bc)
            .zip(dg.chunks_exact_mut(bc / 2))
            .zip(&inv)
        {
            encode_fp4_body(blk, iv, out);
        }
    }
    true
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    // Integer max / compare / blend over 8 lanes need AVX2 (the x86-64 baseline is SSE2).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn amax_bits(x: &[f32]) -> u32 {
        super::amax_bits_body(x)
    }
    /// e4m3 bytes to f32 by bit arithmetic, 8 at a time: normal codes rebias the exponent
    /// (`(b & 0x7f) << 20 + 120 << 23`), subnormal codes are `m · 2^-9` (exact), `0x7f` /
    /// `0xff` are the table's positive quiet NaN; then the sign, then `· s`. The same bits as
    /// the 256-entry table times `s`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn decode_fp8(bytes: &[u8], s: f32, out: &mut [f32]) {
        use std::arch::x86_64::*;
        let n = bytes.len().min(out.len());
        let full = n / 8 * 8;
        let sv = _mm256_set1_ps(s);
        let bias = _mm256_set1_epi32(120 << 23);
        let m7f = _mm256_set1_epi32(0x7f);
        let m78 = _mm256_set1_epi32(0x78);
        let m80 = _mm256_set1_epi32(0x80);
        let m7 = _mm256_set1_epi32(7);
        let step = _mm256_set1_ps(1.0 / 512.0);
        let nan = _mm256_set1_epi32(0x7fc0_0000);
        let zero = _mm256_setzero_si256();
        let mut i = 0;
        while i < full {
            // SAFETY: i + 8 <= full <= n: 8 readable bytes and 8 writable floats.
            unsafe {
                let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(bytes.as_ptr().add(i).cast()));
                let mag = _mm256_and_si256(b, m7f);
                let normal = _mm256_add_epi32(_mm256_slli_epi32::<20>(mag), bias);
                let sub = _mm256_castps_si256(_mm256_mul_ps(
                    _mm256_cvtepi32_ps(_mm256_and_si256(b, m7)),
                    step,
                ));
                let is_sub = _mm256_cmpeq_epi32(_mm256_and_si256(b, m78), zero);
                let v = _mm256_blendv_epi8(normal, sub, is_sub);
                let v = _mm256_or_si256(v, _mm256_slli_epi32::<24>(_mm256_and_si256(b, m80)));
                let v = _mm256_blendv_epi8(v, nan, _mm256_cmpeq_epi32(mag, m7f));
                _mm256_storeu_ps(
                    out.as_mut_ptr().add(i),
                    _mm256_mul_ps(_mm256_castsi256_ps(v), sv),
                );
            }
            i += 8;
        }
        super::decode_fp8_body(&bytes[full..n], s, &mut out[full..n]);
    }

    /// Packed e2m1 pairs to f32, 8 bytes (16 values) at a time: each nibble's magnitude from
    /// an 8-entry register table (`vpermps`), its sign from bit 3, times `s`, then the low and
    /// high nibbles interleaved back into order. The same bits as the pair table times `s`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn decode_fp4(bytes: &[u8], s: f32, out: &mut [f32]) {
        use std::arch::x86_64::*;
        let n = bytes.len().min(out.len() / 2);
        let full = n / 8 * 8;
        let sv = _mm256_set1_ps(s);
        let table = _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
        let (m7, m8, mf) = (
            _mm256_set1_epi32(7),
            _mm256_set1_epi32(8),
            _mm256_set1_epi32(0xf),
        );
        let value = |c: __m256i| {
            let mag = _mm256_permutevar8x32_ps(table, _mm256_and_si256(c, m7));
            let sign = _mm256_slli_epi32::<28>(_mm256_and_si256(c, m8));
            _mm256_mul_ps(_mm256_or_ps(mag, _mm256_castsi256_ps(sign)), sv)
        };
        let mut i = 0;
        while i < full {
            // SAFETY: i + 8 <= full <= n: 8 readable bytes and 16 writable floats at 2i.
            unsafe {
                let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(bytes.as_ptr().add(i).cast()));
                let lo = value(_mm256_and_si256(b, mf));
                let hi = value(_mm256_srli_epi32::<4>(b));
                // Per 128-bit half: [lo0 hi0 lo1 hi1 | lo4 hi4 lo5 hi5] and the next pairs.
                let (a, c) = (_mm256_unpacklo_ps(lo, hi), _mm256_unpackhi_ps(lo, hi));
                let o = out.as_mut_ptr().add(2 * i);
                _mm256_storeu_ps(o, _mm256_permute2f128_ps::<0x20>(a, c));
                _mm256_storeu_ps(o.add(8), _mm256_permute2f128_ps::<0x31>(a, c));
            }
            i += 8;
        }
        super::decode_fp4_body(&bytes[full..], s, &mut out[2 * full..]);
    }

    /// Whole FP4 blocks of `bb` bytes (a multiple of 8), block `j` times `scales[j]`: the
    /// loop of [`decode_fp4`] with the scale changing per block, so short NVFP4 blocks cost no
    /// call each.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn decode_fp4_blocks(
        bytes: &[u8],
        scales: &[f32],
        bb: usize,
        out: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        let n = (bytes.len().min(out.len() / 2).min(scales.len() * bb)) / 8 * 8;
        let table = _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
        let (m7, m8, mf) = (
            _mm256_set1_epi32(7),
            _mm256_set1_epi32(8),
            _mm256_set1_epi32(0xf),
        );
        let mut i = 0;
        while i < n {
            let sv = _mm256_set1_ps(scales[i / bb]);
            let value = |c: __m256i| {
                let mag = _mm256_permutevar8x32_ps(table, _mm256_and_si256(c, m7));
                let sign = _mm256_slli_epi32::<28>(_mm256_and_si256(c, m8));
                _mm256_mul_ps(_mm256_or_ps(mag, _mm256_castsi256_ps(sign)), sv)
            };
            // SAFETY: i + 8 <= n: 8 readable bytes and 16 writable floats at 2i.
            unsafe {
                let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(bytes.as_ptr().add(i).cast()));
                let lo = value(_mm256_and_si256(b, mf));
                let hi = value(_mm256_srli_epi32::<4>(b));
                let (a, c) = (_mm256_unpacklo_ps(lo, hi), _mm256_unpackhi_ps(lo, hi));
                let o = out.as_mut_ptr().add(2 * i);
                _mm256_storeu_ps(o, _mm256_permute2f128_ps::<0x20>(a, c));
                _mm256_storeu_ps(o.add(8), _mm256_permute2f128_ps::<0x31>(a, c));
            }
            i += 8;
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_fp8(
        x: &[f32],
        shape: (usize, usize),
        block: (usize, usize),
        scale: super::ScaleFormat,
        scales: &mut [f32],
        data: &mut [u8],
    ) -> bool {
        super::quantize_fp8_body(x, shape, block, scale, scales, data)
    }
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_fp4(
        x: &[f32],
        bc: usize,
        tensor_scale: Option<f32>,
        scale_bytes: &mut [u8],
        data: &mut [u8],
    ) -> bool {
        super::quantize_fp4_body(x, bc, tensor_scale, scale_bytes, data)
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    use std::sync::OnceLock;
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| std::is_x86_feature_detected!("avx2"))
}

/// See [`amax_bits_body`].
#[inline]
pub(crate) fn amax_bits(x: &[f32]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2 (checked at run time).
        return unsafe { avx2::amax_bits(x) };
    }
    amax_bits_body(x)
}

/// Whether an [`amax_bits`] result comes from a NaN or an infinity.
#[inline]
pub(crate) fn non_finite(amax_bits: u32) -> bool {
    amax_bits >= 0x7f80_0000
}

/// See [`quantize_fp8_body`].
pub(crate) fn quantize_fp8(
    x: &[f32],
    shape: (usize, usize),
    block: (usize, usize),
    scale: ScaleFormat,
    scales: &mut [f32],
    data: &mut [u8],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2 (checked at run time).
        return unsafe { avx2::quantize_fp8(x, shape, block, scale, scales, data) };
    }
    quantize_fp8_body(x, shape, block, scale, scales, data)
}

/// See [`quantize_fp4_body`].
pub(crate) fn quantize_fp4(
    x: &[f32],
    bc: usize,
    tensor_scale: Option<f32>,
    scale_bytes: &mut [u8],
    data: &mut [u8],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2 (checked at run time).
        return unsafe { avx2::quantize_fp4(x, bc, tensor_scale, scale_bytes, data) };
    }
    quantize_fp4_body(x, bc, tensor_scale, scale_bytes, data)
}

/// `out[i] = e4m3_decode(bytes[i]) * s` (256-entry table).
#[inline(always)]
fn decode_fp8_body(bytes: &[u8], s: f32, out: &mut [f32]) {
    for (o, &b) in out.iter_mut().zip(bytes) {
        *o = E4M3_LUT[b as usize] * s;
    }
}

/// `out[i] = e4m3_decode(bytes[i]) * s`: the table, or its AVX2 bit-arithmetic equivalent.
#[inline]
pub(crate) fn decode_fp8(bytes: &[u8], s: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2 (checked at run time).
        return unsafe { avx2::decode_fp8(bytes, s, out) };
    }
    decode_fp8_body(bytes, s, out)
}

/// Unpacks two e2m1 values per byte times `s`: the pair table, or its AVX2 equivalent.
#[inline]
pub(crate) fn decode_fp4(bytes: &[u8], s: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2 (checked at run time).
        return unsafe { avx2::decode_fp4(bytes, s, out) };
    }
    decode_fp4_body(bytes, s, out)
}

/// Whole FP4 blocks of `bb` bytes, block `j` times `scales[j]`.
#[inline]
pub(crate) fn decode_fp4_blocks(bytes: &[u8], scales: &[f32], bb: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && bb.is_multiple_of(8) {
        // SAFETY: the CPU supports AVX2 (checked at run time); bb is a multiple of 8.
        return unsafe { avx2::decode_fp4_blocks(bytes, scales, bb, out) };
    }
    let blocks = bytes.chunks(bb).zip(out.chunks_mut(2 * bb));
    for ((b, o), &s) in blocks.zip(scales) {
        decode_fp4_body(b, s, o);
    }
}

/// Unpacks two e2m1 values per byte times `s` (one 256-entry table load per byte).
#[inline(always)]
fn decode_fp4_body(bytes: &[u8], s: f32, out: &mut [f32]) {
    let last = bytes.get(out.len() / 2).copied();
    let mut pairs = out.chunks_exact_mut(2);
    for (pair, &b) in (&mut pairs).zip(bytes) {
        let v = E2M1_PAIR_LUT[b as usize];
        pair[0] = v[0] * s;
        pair[1] = v[1] * s;
    }
    // An odd length ends on the low nibble of its last byte.
    if let ([o], Some(b)) = (pairs.into_remainder(), last) {
        *o = E2M1_PAIR_LUT[b as usize][0] * s;
    }
}
