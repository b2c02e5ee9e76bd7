// MXFP4 / FP8 (UE8M0, 1x32) quantisation of activations or weights, one warp per 32-block:
// amax by warp max, power-of-two scale, round-to-nearest-even codes (same rules as the CPU).
__device__ __forceinline__ int ceil_log2f(float x) {
    int e = ((__float_as_uint(x) >> 23) & 0xff) - 127;
    return (__float_as_uint(x) & 0x7fffff) ? e + 1 : e;
}

__device__ __forceinline__ u8 e2m1_code(float v) {
    float a = fabsf(v);
    u8 c = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
    return (v < 0.0f && c) ? (c | 8) : c;
}

__device__ __forceinline__ u8 e4m3_code(float v) {
    u32 bits = __float_as_uint(v), x = bits & 0x7fffffffu;
    u8 sign = (u8)((bits >> 24) & 0x80);
    if (x > 0x7f800000u) return 0x7f;
    u32 code;
    if (x < 0x3c800000u) code = (u32)__float2int_rn(__uint_as_float(x) * 512.0f);
    else code = min(((x + 0x7ffffu + ((x >> 20) & 1u)) >> 20) - (120u << 3), 0x7eu);
    return sign | (u8)code;
}

extern "C" __global__ void quantize_mxfp4(const float* __restrict__ x, u8* __restrict__ q,
                                          u8* __restrict__ scales, u64 blocks) {
    u64 b = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (b >= blocks) return;
    float v = x[b * 32 + lane];
    float amax = fmaxf(warp_max(fabsf(v)), 6.0f * 1.1754944e-38f);
    int p = ceil_log2f(amax / 6.0f);
    float s = __uint_as_float((u32)(p + 127) << 23);
    u8 code = e2m1_code(fminf(fmaxf(v / s, -6.0f), 6.0f));
    u8 other = (u8)__shfl_down_sync(0xffffffffu, (u32)code, 1);
    if ((lane & 1) == 0) q[b * 16 + lane / 2] = code | (other << 4);
    if (lane == 0) scales[b] = (u8)(p + 127);
}

extern "C" __global__ void quantize_fp8_ue8m0(const float* __restrict__ x, u8* __restrict__ q,
                                              u8* __restrict__ scales, u64 blocks) {
    u64 b = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (b >= blocks) return;
    float v = x[b * 32 + lane];
    float amax = fmaxf(warp_max(fabsf(v)), 1e-12f);
    int p = max(min(ceil_log2f(amax / 448.0f), 127), -126);
    float s = __uint_as_float((u32)(p + 127) << 23);
    q[b * 32 + lane] = e4m3_code(v / s);
    if (lane == 0) scales[b] = (u8)(p + 127);
}

// Dequantisation, bit-identical to the CPU backend (one exact multiply per value).
// FP8 with one f32 scale per (block_rows x block_cols) tile (UE8M0 scales are decoded to f32
// on upload, exactly).
extern "C" __global__ void dequantize_fp8(const u8* __restrict__ q, const float* __restrict__ scales,
                                          float* __restrict__ y, int rows, int cols, int block_rows,
                                          int block_cols) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)rows * cols) return;
    int r = (int)(t / cols), c = (int)(t % cols);
    int nbc = (cols + block_cols - 1) / block_cols;
    y[t] = e4m3_to_f32(q[t]) * scales[(size_t)(r / block_rows) * nbc + c / block_cols];
}

// MXFP4 (block 32, UE8M0) / NVFP4 (block 16, E4M3 x tensor scale); one thread per byte.
extern "C" __global__ void dequantize_fp4(const u8* __restrict__ q, const u8* __restrict__ scales,
                                          float* __restrict__ y, u64 bytes, int nvfp4, float tensor_scale) {
    u64 p = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= bytes) return;
    int block = nvfp4 ? 16 : 32;
    u8 sb = scales[(2 * p) / block];
    float s = nvfp4 ? e4m3_to_f32(sb) * tensor_scale : ue8m0_to_f32(sb);
    u8 b = q[p];
    y[2 * p] = E2M1[b & 15] * s;
    y[2 * p + 1] = E2M1[b >> 4] * s;
}
