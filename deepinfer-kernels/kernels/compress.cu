// KV compressor gated pooling (see Backend::compress_pool); one thread per (entry, channel).
extern "C" __global__ void compress_pool(const float* __restrict__ a, const float* __restrict__ z,
                                         float* __restrict__ out, int n_out, int ratio, int width,
                                         int overlap, int first) {
    int c = overlap ? width / 2 : width;
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_out * c) return;
    int ch = t % c, w = t / c + first;
    float mx = -__int_as_float(0x7f800000);
    int prev = overlap && w > 0;
    for (int pass = 0; pass < 2; pass++) {
        float num = 0.0f, den = 0.0f;
        for (int part = prev ? 0 : 1; part < 2; part++) {
            for (int r = 0; r < ratio; r++) {
                size_t i;
                if (!overlap) { if (part == 0) continue; i = ((size_t)w * ratio + r) * width + ch; }
                else if (part == 0) i = ((size_t)(w - 1) * ratio + r) * width + ch;
                else i = ((size_t)w * ratio + r) * width + c + ch;
                if (pass == 0) mx = fmaxf(mx, z[i]);
                else { float e = expf(z[i] - mx); den += e; num += e * a[i]; }
            }
        }
        if (pass == 1) out[t] = num / den;
    }
}
