// MoE routing and routed experts.
// score: 0 sqrt(softplus), 1 softmax, 2 sigmoid. One thread per row; top-k by k passes
// (largest biased score first, ties to the lower expert id).
__device__ double route_score(const float* l, int e, int i, int score, double lse_max, double lse_sum) {
    double x = l[i];
    if (score == 0) return sqrt(fmax(x, 0.0) + log1p(exp(-fabs(x))));
    if (score == 1) return exp(x - lse_max) / lse_sum;
    return 1.0 / (1.0 + exp(-x));
}

extern "C" __global__ void moe_route(const float* __restrict__ logits, const float* __restrict__ bias,
                                     int* __restrict__ idx, float* __restrict__ wts, int s_len, int e,
                                     int k, int score, int renorm, float route_scale) {
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= s_len || k > 32) return;
    const float* l = logits + (size_t)s * e;
    double mx = -1e300, sum = 0.0;
    if (score == 1) {
        for (int i = 0; i < e; i++) mx = fmax(mx, (double)l[i]);
        for (int i = 0; i < e; i++) sum += exp((double)l[i] - mx);
    }
    int picked[32];
    double w[32], total = 0.0;
    for (int r = 0; r < k; r++) {
        float best = -__int_as_float(0x7f800000);
        int bi = -1;
        for (int i = 0; i < e; i++) {
            int used = 0;
            for (int q = 0; q < r; q++) used |= picked[q] == i;
            if (used) continue;
            float b = (float)(route_score(l, e, i, score, mx, sum) + (bias ? (double)bias[i] : 0.0));
            if (bi < 0 || b > best) { best = b; bi = i; }
        }
        picked[r] = bi;
        w[r] = bi >= 0 ? route_score(l, e, bi, score, mx, sum) : 0.0;
        total += w[r];
    }
    for (int r = 0; r < k; r++) {
        double v = renorm ? w[r] / (total + 1e-20) : w[r];
        idx[(size_t)s * k + r] = picked[r];
        wts[(size_t)s * k + r] = (float)(v * route_scale);
    }
}

// Grouped expert GEMV over (row, slot) pairs: y[p, :] = W_e . x[row_p] with e = expert[p].
// weights: device array of per-expert [n, kdim] f32 matrices. One warp per output element.
extern "C" __global__ void expert_gemv(const float* __restrict__ x, const u64* __restrict__ weights,
                                       const int* __restrict__ pair_row, const int* __restrict__ pair_expert,
                                       float* __restrict__ y, int pairs, int n, int kdim) {
    int col = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    int p = blockIdx.y;
    if (col >= n || p >= pairs) return;
    const float* w = (const float*)weights[pair_expert[p]] + (size_t)col * kdim;
    const float* xr = x + (size_t)pair_row[p] * kdim;
    float acc = 0.0f;
    for (int i = lane; i < kdim; i += 32) acc += xr[i] * w[i];
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)p * n + col] = acc;
}

// out[s, :] = sum_j wts[s, j] * y[s * k + j, :] in slot order (slots with expert -1 skipped).
extern "C" __global__ void moe_combine(const float* __restrict__ y, const int* __restrict__ idx,
                                       const float* __restrict__ wts, float* __restrict__ out,
                                       int s_len, int k, int d) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)s_len * d) return;
    int s = (int)(t / d), c = (int)(t % d);
    float acc = 0.0f;
    for (int j = 0; j < k; j++)
        if (idx[s * k + j] >= 0) acc += wts[s * k + j] * y[((size_t)s * k + j) * d + c];
    out[t] = acc;
}
