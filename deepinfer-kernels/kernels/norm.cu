// RMSNorm and softmax along rows: one block (power-of-two threads) per row, fixed-shape trees.

extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w,
                                    float* __restrict__ y, int d, float eps) {
    extern __shared__ float sh[];
    const float* xr = x + (size_t)blockIdx.x * d;
    float* yr = y + (size_t)blockIdx.x * d;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) acc += xr[i] * xr[i];
    float ms = block_sum(acc, sh) / (float)d;
    float inv = rsqrtf(ms + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = w ? xr[i] * inv * w[i] : xr[i] * inv;
}

extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int d) {
    extern __shared__ float sh[];
    const float* xr = x + (size_t)blockIdx.x * d;
    float* yr = y + (size_t)blockIdx.x * d;
    float mx = -__int_as_float(0x7f800000);
    for (int i = threadIdx.x; i < d; i += blockDim.x) mx = fmaxf(mx, xr[i]);
    mx = block_max(mx, sh);
    if (mx == -__int_as_float(0x7f800000)) {
        for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = 0.0f;
        return;
    }
    float acc = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) acc += expf(xr[i] - mx);
    float inv = 1.0f / block_sum(acc, sh);
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = expf(xr[i] - mx) * inv;
}
