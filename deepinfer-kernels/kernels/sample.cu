// Sampling kernel: the same token as deepinfer-sample (and the CPU backend) from the same
// logits. Every float operation is spelled with an _rn intrinsic so no FMA contraction
// changes det_exp's bits; the CDF walk is integer arithmetic. One block (256 threads) per row.

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

__device__ void philox(u32 c[4], u32 k0, u32 k1) {
    for (int round = 0; round < 10; round++) {
        if (round > 0) { k0 += PHILOX_W0; k1 += PHILOX_W1; }
        u64 p0 = (u64)PHILOX_M0 * c[0], p1 = (u64)PHILOX_M1 * c[2];
        u32 n0 = (u32)(p1 >> 32) ^ c[1] ^ k0, n1 = (u32)p1, n2 = (u32)(p0 >> 32) ^ c[3] ^ k1, n3 = (u32)p0;
        c[0] = n0; c[1] = n1; c[2] = n2; c[3] = n3;
    }
}

struct Stream { u32 k0, k1; u64 offset, block; u32 buf[4]; int used; };

__device__ u32 next_u32(Stream& s) {
    if (s.used == 4) {
        s.buf[0] = (u32)s.offset; s.buf[1] = (u32)(s.offset >> 32);
        s.buf[2] = (u32)s.block; s.buf[3] = (u32)(s.block >> 32);
        philox(s.buf, s.k0, s.k1);
        s.block++;
        s.used = 0;
    }
    return s.buf[s.used++];
}

__device__ u64 below(Stream& s, u64 n) {
    if (n <= 1) return 0;
    int bits = 64 - __clzll((long long)(n - 1));
    for (;;) {
        u64 hi = next_u32(s);
        u64 x = ((hi << 32) | next_u32(s)) >> (64 - bits);
        if (x < n) return x;
    }
}

__device__ float det_exp(float x) {
    bool below_cut = (x != x) || x < -87.0f;
    x = below_cut ? -87.0f : fminf(x, 0.0f);
    float n = __fsub_rn(__fadd_rn(__fmul_rn(x, 1.44269502f), 12582912.0f), 12582912.0f);
    float f = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0.6933594f)), __fmul_rn(n, -2.1219444e-4f));
    float p = __fadd_rn(__fmul_rn(1.9875691e-4f, f), 1.3981999e-3f);
    p = __fadd_rn(__fmul_rn(p, f), 8.333452e-3f);
    p = __fadd_rn(__fmul_rn(p, f), 4.1665796e-2f);
    p = __fadd_rn(__fmul_rn(p, f), 1.6666665e-1f);
    p = __fadd_rn(__fmul_rn(p, f), 0.5f);
    p = __fadd_rn(__fadd_rn(__fmul_rn(p, __fmul_rn(f, f)), f), 1.0f);
    float r = __fmul_rn(p, __int_as_float((__float2int_rz(n) + 127) << 23));
    return below_cut ? 0.0f : r;
}

__device__ __forceinline__ u64 weight_of(float l, float l_max, float t) {
    return (u64)((double)det_exp(__fdiv_rn(__fsub_rn(l, l_max), t)) * 4294967296.0);
}

extern "C" __global__ void __launch_bounds__(256) sample_rows(
    const float* __restrict__ logits, const u64* __restrict__ seeds, const u64* __restrict__ positions,
    const float* __restrict__ temps, int* __restrict__ out, int vocab) {
    __shared__ float fred[256];
    __shared__ u64 chunk[256];
    __shared__ u64 target;
    const float* l = logits + (size_t)blockIdx.x * vocab;
    float t = fmaxf(temps[blockIdx.x], 1e-5f);
    float mx = -__int_as_float(0x7f800000);
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) mx = fmaxf(mx, l[i]);
    mx = block_max(mx, fred);
    // Contiguous chunk per thread so the CDF is walked in token order.
    int per = (vocab + blockDim.x - 1) / blockDim.x;
    int lo = threadIdx.x * per, hi = min(vocab, lo + per);
    u64 sum = 0;
    for (int i = lo; i < hi; i++) sum += weight_of(l[i], mx, t);
    chunk[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 total = 0;
        for (int i = 0; i < blockDim.x; i++) { u64 c = chunk[i]; chunk[i] = total; total += c; }
        u64 seed = seeds[blockIdx.x];
        Stream s;
        s.k0 = (u32)seed; s.k1 = (u32)(seed >> 32);
        s.offset = positions[blockIdx.x] * 3ull; s.block = 0; s.used = 4;
        target = total == 0 ? ~0ull : below(s, total);
        if (total == 0) out[blockIdx.x] = -1;
    }
    __syncthreads();
    if (target == ~0ull) return;
    u64 acc = chunk[threadIdx.x];
    if (acc > target) return;
    for (int i = lo; i < hi; i++) {
        acc += weight_of(l[i], mx, t);
        if (acc > target) { out[blockIdx.x] = i; return; }
    }
}
