// Manifold-constrained hyper-connections. hc_mixes: one thread per row, in double (N <= 8).
extern "C" __global__ void hc_mixes(const float* __restrict__ mix, const float* __restrict__ scale,
                                    const float* __restrict__ base, float* __restrict__ pre,
                                    float* __restrict__ post, float* __restrict__ comb, int s_len,
                                    int n, float eps_f, int iters) {
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= s_len || n > 8) return;
    double eps = eps_f;
    int width = (2 + n) * n;
    const float* m = mix + (size_t)s * width;
    double c[64];
    for (int i = 0; i < n; i++) {
        pre[s * n + i] = (float)(1.0 / (1.0 + exp(-((double)m[i] * scale[0] + base[i]))) + eps);
        post[s * n + i] = (float)(2.0 / (1.0 + exp(-((double)m[n + i] * scale[1] + base[n + i]))));
    }
    for (int j = 0; j < n; j++) {
        double mx = -1e300, sum = 0.0;
        for (int k = 0; k < n; k++) {
            c[j * n + k] = (double)m[2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k];
            mx = fmax(mx, c[j * n + k]);
        }
        for (int k = 0; k < n; k++) { c[j * n + k] = exp(c[j * n + k] - mx); sum += c[j * n + k]; }
        for (int k = 0; k < n; k++) c[j * n + k] = c[j * n + k] / sum + eps;
    }
    for (int it = 0; it < (iters < 1 ? 1 : iters); it++) {
        if (it > 0) {
            for (int j = 0; j < n; j++) {
                double sum = 0.0;
                for (int k = 0; k < n; k++) sum += c[j * n + k];
                for (int k = 0; k < n; k++) c[j * n + k] /= sum + eps;
            }
        }
        for (int k = 0; k < n; k++) {
            double sum = 0.0;
            for (int j = 0; j < n; j++) sum += c[j * n + k];
            for (int j = 0; j < n; j++) c[j * n + k] /= sum + eps;
        }
    }
    for (int i = 0; i < n * n; i++) comb[(size_t)s * n * n + i] = (float)c[i];
}

// y[s, :] = sum_n pre[s, n] x[s, n, :]
extern "C" __global__ void hc_collapse(const float* x, const float* pre, float* y, int s_len, int n, int d) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)s_len * d) return;
    int s = (int)(t / d), c = (int)(t % d);
    float acc = 0.0f;
    for (int j = 0; j < n; j++) acc += pre[s * n + j] * x[((size_t)s * n + j) * d + c];
    y[t] = acc;
}

// y[s, k, :] = post[s, k] out[s, :] + sum_j comb[s, j, k] x[s, j, :]
extern "C" __global__ void hc_expand(const float* x, const float* out, const float* post, const float* comb,
                                     float* y, int s_len, int n, int d) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)s_len * n * d) return;
    int c = (int)(t % d), k = (int)((t / d) % n), s = (int)(t / ((u64)d * n));
    float acc = post[s * n + k] * out[(size_t)s * d + c];
    for (int j = 0; j < n; j++) acc += comb[((size_t)s * n + j) * n + k] * x[((size_t)s * n + j) * d + c];
    y[t] = acc;
}
