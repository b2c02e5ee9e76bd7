// GEMV / small-m GEMM: y[m, n] = x[m, k] . w[n, k]^T, one warp per output element.
// Lane l sums k = l, l + 32, ... in order, then a butterfly: the order depends on k only,
// so a row's result is the same whatever m is (batch-invariant).

extern "C" __global__ void gemv_f32(const float* __restrict__ x, const float* __restrict__ w,
                                    float* __restrict__ y, int m, int n, int k) {
    int col = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    int row = blockIdx.y;
    if (col >= n || row >= m) return;
    const float* xr = x + (size_t)row * k;
    const float* wr = w + (size_t)col * k;
    float acc = 0.0f;
    for (int i = lane; i < k; i += 32) acc += xr[i] * wr[i];
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)row * n + col] = acc;
}

extern "C" __global__ void gemv_bf16(const float* __restrict__ x, const u16* __restrict__ w,
                                     float* __restrict__ y, int m, int n, int k) {
    int col = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    int row = blockIdx.y;
    if (col >= n || row >= m) return;
    const float* xr = x + (size_t)row * k;
    const u16* wr = w + (size_t)col * k;
    float acc = 0.0f;
    for (int i = lane; i < k; i += 32) acc += xr[i] * bf16_to_f32(wr[i]);
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)row * n + col] = acc;
}

// FP8 e4m3 weights with one f32 scale per (block_rows x block_cols) tile.
__device__ __forceinline__ float e4m3_to_f32(u8 b) {
    u32 sign = (u32)(b & 0x80) << 24;
    u32 e = (b >> 3) & 0xf, m = b & 7;
    float mag;
    if (e == 0) mag = (float)m * 0.001953125f;  // 2^-9
    else if (e == 15 && m == 7) mag = __int_as_float(0x7fc00000);
    else mag = __uint_as_float(((e + 120) << 23) | (m << 20));
    return __uint_as_float(__float_as_uint(mag) | sign);
}

extern "C" __global__ void gemv_fp8(const float* __restrict__ x, const u8* __restrict__ w,
                                    const float* __restrict__ scales, float* __restrict__ y,
                                    int m, int n, int k, int block_rows, int block_cols) {
    int col = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    int row = blockIdx.y;
    if (col >= n || row >= m) return;
    const float* xr = x + (size_t)row * k;
    const u8* wr = w + (size_t)col * k;
    int nbc = (k + block_cols - 1) / block_cols;
    const float* sr = scales + (size_t)(col / block_rows) * nbc;
    float acc = 0.0f;
    for (int i = lane; i < k; i += 32) acc += xr[i] * (e4m3_to_f32(wr[i]) * sr[i / block_cols]);
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)row * n + col] = acc;
}

// FP4 e2m1 weights, two per byte (even column in the low nibble). MXFP4: block 32, UE8M0
// scales; NVFP4: block 16, E4M3 scales times one f32 tensor scale.
__device__ __constant__ float E2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

__device__ __forceinline__ float ue8m0_to_f32(u8 b) {
    return b == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(((u32)b) << 23);
}

extern "C" __global__ void gemv_fp4(const float* __restrict__ x, const u8* __restrict__ w,
                                    const u8* __restrict__ scales, float* __restrict__ y,
                                    int m, int n, int k, int nvfp4, float tensor_scale) {
    int col = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    int row = blockIdx.y;
    if (col >= n || row >= m) return;
    int block = nvfp4 ? 16 : 32;
    const float* xr = x + (size_t)row * k;
    const u8* wr = w + (size_t)col * (k / 2);
    const u8* sr = scales + (size_t)col * (k / block);
    float acc = 0.0f;
    for (int p = lane; p < k / 2; p += 32) {
        u8 b = wr[p];
        int i = 2 * p;
        float s = nvfp4 ? e4m3_to_f32(sr[i / block]) * tensor_scale : ue8m0_to_f32(sr[i / block]);
        acc += xr[i] * (E2M1[b & 15] * s);
        acc += xr[i + 1] * (E2M1[b >> 4] * s);
    }
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)row * n + col] = acc;
}
