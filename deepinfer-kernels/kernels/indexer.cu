// Lightning-indexer scores: score[s, t] = scale * sum_h w[s, h] * relu(q[s, h] . k[t]), -inf
// for t >= visible[s]. One thread per (s, t), heads and channels in order.
extern "C" __global__ void indexer_scores(const float* __restrict__ q, const float* __restrict__ k,
                                          const float* __restrict__ w, const int* __restrict__ visible,
                                          float* __restrict__ out, int s_len, int hi, int di, int t_len,
                                          float scale) {
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (u64)s_len * t_len) return;
    int t = (int)(g % t_len), s = (int)(g / t_len);
    if (t >= visible[s]) { out[g] = -__int_as_float(0x7f800000); return; }
    const float* kt = k + (size_t)t * di;
    float acc = 0.0f;
    for (int h = 0; h < hi; h++) {
        const float* qh = q + ((size_t)s * hi + h) * di;
        float dot = 0.0f;
        for (int c = 0; c < di; c++) dot += qh[c] * kt[c];
        acc += w[(size_t)s * hi + h] * fmaxf(dot, 0.0f);
    }
    out[g] = acc * scale;
}

// Top-k per row (largest first, ties to the lower index, -inf picks -> -1): k rounds of a
// block argmax over a scratch copy of the row. Portable fallback; O(k * T / threads).
extern "C" __global__ void topk_rows(const float* __restrict__ x, float* __restrict__ scratch,
                                     int* __restrict__ out, int t_len, int k) {
    __shared__ float bv[256];
    __shared__ int bi[256];
    const float* xr = x + (size_t)blockIdx.x * t_len;
    float* sr = scratch + (size_t)blockIdx.x * t_len;
    for (int i = threadIdx.x; i < t_len; i += blockDim.x) sr[i] = (xr[i] != xr[i]) ? -__int_as_float(0x7f800000) : xr[i];
    __syncthreads();
    for (int r = 0; r < k; r++) {
        float v = -__int_as_float(0x7f800000);
        int vi = 0x7fffffff;
        for (int i = threadIdx.x; i < t_len; i += blockDim.x)
            if (sr[i] > v || (sr[i] == v && i < vi)) { v = sr[i]; vi = i; }
        bv[threadIdx.x] = v;
        bi[threadIdx.x] = vi;
        __syncthreads();
        for (int s = blockDim.x >> 1; s > 0; s >>= 1) {
            if (threadIdx.x < s) {
                float ov = bv[threadIdx.x + s];
                int oi = bi[threadIdx.x + s];
                if (ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < bi[threadIdx.x])) {
                    bv[threadIdx.x] = ov;
                    bi[threadIdx.x] = oi;
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            int pick = (r < t_len && bv[0] > -__int_as_float(0x7f800000)) ? bi[0] : -1;
            out[(size_t)blockIdx.x * k + r] = pick;
            if (pick >= 0) sr[pick] = __int_as_float(0xff800001);  // a NaN never compares >= anything: never picked again
        }
        __syncthreads();
    }
}
