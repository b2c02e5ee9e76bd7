// Shared by every kernel file (prepended before compilation; NVRTC needs no headers).
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }

// Butterfly sum over a warp: every lane ends with the same value, computed in a fixed order.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The warp-per-output layout of the GEMV kernels (gemv.cu, gemv_wide.cu): warp `col` along
// the grid's x dimension computes y[row, col], row = blockIdx.y. A whole warp shares its slot,
// so a warp past the edge returns as one and the full-mask shuffles stay valid.
struct GemvSlot {
    int row, col, lane;
};

// This thread's slot; false when the warp lies past the edge of y[m, n].
__device__ __forceinline__ bool gemv_slot(int m, int n, GemvSlot* s) {
    s->col = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    s->lane = threadIdx.x & 31;
    s->row = blockIdx.y;
    return s->col < n && s->row < m;
}

// Butterfly sum of the lanes' partial sums; lane 0 writes y[row, col].
__device__ __forceinline__ void gemv_store(float acc, float* __restrict__ y, int n, GemvSlot s) {
    acc = warp_sum(acc);
    if (s.lane == 0) y[(size_t)s.row * n + s.col] = acc;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Fixed-shape tree reduction over a block of blockDim.x (a power of two) threads.
__device__ __forceinline__ float block_sum(float v, float* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x >> 1; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float block_max(float v, float* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x >> 1; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// Exact decoders of the quantised formats (the CPU backend's tables, bit for bit).
__device__ __forceinline__ float e4m3_to_f32(u8 b) {
    u32 sign = (u32)(b & 0x80) << 24;
    u32 e = (b >> 3) & 0xf, m = b & 7;
    float mag;
    if (e == 0) mag = (float)m * 0.001953125f;  // 2^-9
    else if (e == 15 && m == 7) mag = __int_as_float(0x7fc00000);
    else mag = __uint_as_float(((e + 120) << 23) | (m << 20));
    return __uint_as_float(__float_as_uint(mag) | sign);
}

// 2^(b - 127); 0 is the subnormal 2^-127, 255 is NaN.
__device__ __forceinline__ float ue8m0_to_f32(u8 b) {
    if (b == 255) return __int_as_float(0x7fc00000);
    return b == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(((u32)b) << 23);
}

__device__ __constant__ float E2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
