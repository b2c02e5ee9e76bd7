// Elementwise ops. Broadcasting: b has nb elements and repeats over a's leading axes.

extern "C" __global__ void add_bcast(const float* a, const float* b, float* y, u64 n, u64 nb) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i % nb];
}

extern "C" __global__ void mul_bcast(const float* a, const float* b, float* y, u64 n, u64 nb) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] * b[i % nb];
}

extern "C" __global__ void affine(const float* a, float* y, u64 n, float s, float c) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] * s + c;
}

// op: 0 silu, 1 sigmoid, 2 softplus, 3 sqrt(softplus), 4 relu, 5 exp, 6 neg,
// 7 sigmoid(signed sqrt) (Engram gate).
extern "C" __global__ void unary(const float* a, float* y, u64 n, int op) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = a[i], r;
    switch (op) {
        case 0: r = v * sigmoidf_(v); break;
        case 1: r = sigmoidf_(v); break;
        case 2: r = fmaxf(v, 0.0f) + log1pf(expf(-fabsf(v))); break;
        case 3: r = sqrtf(fmaxf(v, 0.0f) + log1pf(expf(-fabsf(v)))); break;
        case 4: r = fmaxf(v, 0.0f); break;
        case 5: r = expf(v); break;
        case 7: r = sigmoidf_(copysignf(sqrtf(fmaxf(fabsf(v), 1e-6f)), v)); break;
        default: r = -v; break;
    }
    y[i] = r;
}

extern "C" __global__ void swiglu(const float* g, const float* u, float* y, u64 n, float limit) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gv = g[i], uv = u[i];
    if (limit > 0.0f) {
        gv = fminf(gv, limit);
        uv = fminf(fmaxf(uv, -limit), limit);
    }
    y[i] = gv * sigmoidf_(gv) * uv;
}

extern "C" __global__ void f32_to_bf16(const float* a, u16* y, u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u32 b = __float_as_uint(a[i]);
    if ((b & 0x7fffffffu) > 0x7f800000u) { y[i] = (u16)((b >> 16) | 0x40); return; }
    y[i] = (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

extern "C" __global__ void bf16_to_f32_k(const u16* a, float* y, u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = bf16_to_f32(a[i]);
}
