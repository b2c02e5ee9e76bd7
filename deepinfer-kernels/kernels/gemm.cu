// Portable prefill GEMM: C[m, n] = A[m, k] . B[n, k]^T, 64x64 tiles, 16x16 threads with 4x4
// outputs each, k ascending (one fixed order per output whatever m is).
#define TS 64
#define TK 16

extern "C" __global__ void __launch_bounds__(256) gemm_f32_tn(const float* __restrict__ a,
                                                              const float* __restrict__ b,
                                                              float* __restrict__ c, int m, int n, int k) {
    __shared__ float as[TK][TS + 1];
    __shared__ float bs[TK][TS + 1];
    int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    int row0 = blockIdx.y * TS, col0 = blockIdx.x * TS;
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < k; k0 += TK) {
        for (int t = threadIdx.x; t < TS * TK; t += 256) {
            int r = t / TK, kk = t % TK;
            int ar = row0 + r, bc = col0 + r, kx = k0 + kk;
            as[kk][r] = (ar < m && kx < k) ? a[(size_t)ar * k + kx] : 0.0f;
            bs[kk][r] = (bc < n && kx < k) ? b[(size_t)bc * k + kx] : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < TK; kk++) {
            float av[4], bv[4];
            for (int i = 0; i < 4; i++) av[i] = as[kk][ty * 4 + i];
            for (int j = 0; j < 4; j++) bv[j] = bs[kk][tx * 4 + j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            int r = row0 + ty * 4 + i, cc = col0 + tx * 4 + j;
            if (r < m && cc < n) c[(size_t)r * n + cc] = acc[i][j];
        }
}

// Grouped low-rank projection: y[s, g, r] = sum_i x[s, g, i] * w[g, r, i]; one warp per output.
extern "C" __global__ void grouped_matmul(const float* __restrict__ x, const float* __restrict__ w,
                                          float* __restrict__ y, int s_len, int groups, int inner, int rank) {
    int out = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (out >= s_len * groups * rank) return;
    int r = out % rank, g = (out / rank) % groups, s = out / (rank * groups);
    const float* xr = x + ((size_t)s * groups + g) * inner;
    const float* wr = w + ((size_t)g * rank + r) * inner;
    float acc = 0.0f;
    for (int i = lane; i < inner; i += 32) acc += xr[i] * wr[i];
    acc = warp_sum(acc);
    if (lane == 0) y[out] = acc;
}
