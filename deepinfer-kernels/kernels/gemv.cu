// GEMV / small-m GEMM: y[m, n] = x[m, k] . w[n, k]^T, one warp per output element.
// Lane l sums k = l, l + 32, ... in order, then a butterfly: the order depends on k only,
// so a row's result is the same whatever m is (batch-invariant).

extern "C" __global__ void gemv_f32(const float* __restrict__ x, const float* __restrict__ w,
                                    float* __restrict__ y, int m, int n, int k) {
    GemvSlot g;
    if (!gemv_slot(m, n, &g)) return;
    const float* xr = x + (size_t)g.row * k;
    const float* wr = w + (size_t)g.col * k;
    float acc = 0.0f;
    for (int i = g.lane; i < k; i += 32) acc += xr[i] * wr[i];
    gemv_store(acc, y, n, g);
}

extern "C" __global__ void gemv_bf16(const float* __restrict__ x, const u16* __restrict__ w,
                                     float* __restrict__ y, int m, int n, int k) {
    GemvSlot g;
    if (!gemv_slot(m, n, &g)) return;
    const float* xr = x + (size_t)g.row * k;
    const u16* wr = w + (size_t)g.col * k;
    float acc = 0.0f;
    for (int i = g.lane; i < k; i += 32) acc += xr[i] * bf16_to_f32(wr[i]);
    gemv_store(acc, y, n, g);
}

// FP8 e4m3 weights with one f32 scale per (block_rows x block_cols) tile.
extern "C" __global__ void gemv_fp8(const float* __restrict__ x, const u8* __restrict__ w,
                                    const float* __restrict__ scales, float* __restrict__ y,
                                    int m, int n, int k, int block_rows, int block_cols) {
    GemvSlot g;
    if (!gemv_slot(m, n, &g)) return;
    const float* xr = x + (size_t)g.row * k;
    const u8* wr = w + (size_t)g.col * k;
    int nbc = (k + block_cols - 1) / block_cols;
    const float* sr = scales + (size_t)(g.col / block_rows) * nbc;
    float acc = 0.0f;
    for (int i = g.lane; i < k; i += 32) acc += xr[i] * (e4m3_to_f32(wr[i]) * sr[i / block_cols]);
    gemv_store(acc, y, n, g);
}

// FP4 e2m1 weights, two per byte (even column in the low nibble). MXFP4: block 32, UE8M0
// scales; NVFP4: block 16, E4M3 scales times one f32 tensor scale.
extern "C" __global__ void gemv_fp4(const float* __restrict__ x, const u8* __restrict__ w,
                                    const u8* __restrict__ scales, float* __restrict__ y,
                                    int m, int n, int k, int nvfp4, float tensor_scale) {
    GemvSlot g;
    if (!gemv_slot(m, n, &g)) return;
    int block = nvfp4 ? 16 : 32;
    const float* xr = x + (size_t)g.row * k;
    const u8* wr = w + (size_t)g.col * (k / 2);
    const u8* sr = scales + (size_t)g.col * (k / block);
    float acc = 0.0f;
    for (int p = g.lane; p < k / 2; p += 32) {
        u8 b = wr[p];
        int i = 2 * p;
        float s = nvfp4 ? e4m3_to_f32(sr[i / block]) * tensor_scale : ue8m0_to_f32(sr[i / block]);
        acc += xr[i] * (E2M1[b & 15] * s);
        acc += xr[i + 1] * (E2M1[b >> 4] * s);
    }
    gemv_store(acc, y, n, g);
}
