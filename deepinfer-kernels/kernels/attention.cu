// Attention over one shared key=value head with a learned per-head sink.
// Grid (S, H); block of 128 threads (four warps); dynamic shared memory: K floats of logits +
// 128 scratch. idx[s, :] lists the keys row s reads (-1 = none). Output
// o[s, h, :] = sum_j p_j kv[j].
//
// Logits: one warp per key, its lanes striding the key's d values, so each load instruction
// reads 128 contiguous bytes of one key (one thread per key would read 32 keys' rows at
// once, 32 bytes of each: 3.6x slower on an H200, 6.41 vs 1.77 ms in
// tests/cuda_device.rs' decode case). Output: one thread per column,
// keys in order, so the per-column sum order is fixed.
extern "C" __global__ void __launch_bounds__(128) sink_attention(
    const float* __restrict__ q, const float* __restrict__ kv, const int* __restrict__ idx,
    const float* __restrict__ sink, float* __restrict__ o, int heads, int d, int kk, float scale) {
    extern __shared__ float sh[];
    float* lg = sh;          // kk logits
    float* red = sh + kk;    // 128 reduction slots
    int s = blockIdx.x, h = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const float* qv = q + ((size_t)s * heads + h) * d;
    const int* ir = idx + (size_t)s * kk;
    float mx = sink[h];
    for (int j = warp; j < kk; j += warps) {
        int key = ir[j];
        float l = -__int_as_float(0x7f800000);
        if (key >= 0) {
            const float* kr = kv + (size_t)key * d;
            float acc = 0.0f;
            for (int c = lane; c < d; c += 32) acc += qv[c] * kr[c];
            l = warp_sum(acc) * scale;
        }
        if (lane == 0) lg[j] = l;
        mx = fmaxf(mx, l);
    }
    mx = block_max(mx, red);  // its barriers also publish lg
    float part = 0.0f;
    for (int j = threadIdx.x; j < kk; j += blockDim.x) {
        float e = ir[j] >= 0 ? expf(lg[j] - mx) : 0.0f;
        lg[j] = e;
        part += e;
    }
    float denom = block_sum(part, red) + expf(sink[h] - mx);
    float inv = 1.0f / denom;
    float* out = o + ((size_t)s * heads + h) * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float acc = 0.0f;
#pragma unroll 4
        for (int j = 0; j < kk; j++) {
            int key = ir[j];
            if (key >= 0) acc += lg[j] * kv[(size_t)key * d + c];
        }
        out[c] = acc * inv;
    }
}
