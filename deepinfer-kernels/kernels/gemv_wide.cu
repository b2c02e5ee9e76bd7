// GEMV with wide vector loads, selected by the backend on compute capability 10.x (Blackwell):
// there each lane reads 32 bytes per load (`ld.global.nc.L1::no_allocate.v8`, a 256-bit load
// that PTX only allows from sm_100 on), so a warp moves 1 KiB per instruction and the
// streaming weights bypass L1. On older targets the same kernels use two 128-bit loads.
//
// y[m, n] = x[m, k] . w[n, k]^T, one warp per output; requires k % 8 == 0 (f32) or
// k % 16 == 0 (bf16) and 32-byte aligned rows (the backend checks, else it uses gemv.cu).
// Lane l reads elements [256c + 8l, 256c + 8l + 8) of chunk c (f32; 512c + 16l for bf16) and
// sums them in ascending order, then the warp butterfly: the order depends on k only.

__device__ __forceinline__ void ld8f(const float* p, float* a) {
#if __CUDA_ARCH__ >= 1000
    asm("ld.global.nc.L1::no_allocate.v8.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, [%8];"
        : "=f"(a[0]), "=f"(a[1]), "=f"(a[2]), "=f"(a[3]), "=f"(a[4]), "=f"(a[5]), "=f"(a[6]), "=f"(a[7])
        : "l"(p));
#else
    float4 u = __ldg((const float4*)p), v = __ldg((const float4*)p + 1);
    a[0] = u.x; a[1] = u.y; a[2] = u.z; a[3] = u.w;
    a[4] = v.x; a[5] = v.y; a[6] = v.z; a[7] = v.w;
#endif
}

// 16 bf16 (32 bytes) as 8 words, low half first.
__device__ __forceinline__ void ld8u(const u16* p, u32* a) {
#if __CUDA_ARCH__ >= 1000
    asm("ld.global.nc.L1::no_allocate.v8.b32 {%0,%1,%2,%3,%4,%5,%6,%7}, [%8];"
        : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]), "=r"(a[4]), "=r"(a[5]), "=r"(a[6]), "=r"(a[7])
        : "l"(p));
#else
    uint4 u = __ldg((const uint4*)p), v = __ldg((const uint4*)p + 1);
    a[0] = u.x; a[1] = u.y; a[2] = u.z; a[3] = u.w;
    a[4] = v.x; a[5] = v.y; a[6] = v.z; a[7] = v.w;
#endif
}

extern "C" __global__ void __launch_bounds__(256) gemv_wide_f32(const float* __restrict__ x,
                                                                const float* __restrict__ w,
                                                                float* __restrict__ y, int m, int n, int k) {
    GemvSlot g;
    if (!gemv_slot(m, n, &g)) return;
    const float* xr = x + (size_t)g.row * k;
    const float* wr = w + (size_t)g.col * k;
    float acc = 0.0f;
    for (int i = 8 * g.lane; i < k; i += 256) {
        float a[8], b[8];
        ld8f(wr + i, a);
        ld8f(xr + i, b);
        for (int j = 0; j < 8; j++) acc += b[j] * a[j];
    }
    gemv_store(acc, y, n, g);
}

extern "C" __global__ void __launch_bounds__(256) gemv_wide_bf16(const float* __restrict__ x,
                                                                 const u16* __restrict__ w,
                                                                 float* __restrict__ y, int m, int n, int k) {
    GemvSlot g;
    if (!gemv_slot(m, n, &g)) return;
    const float* xr = x + (size_t)g.row * k;
    const u16* wr = w + (size_t)g.col * k;
    float acc = 0.0f;
    for (int i = 16 * g.lane; i < k; i += 512) {
        u32 a[8];
        float b[8];
        ld8u(wr + i, a);
        for (int h = 0; h < 2; h++) {
            ld8f(xr + i + 8 * h, b);
            for (int j = 0; j < 4; j++) {
                u32 u = a[4 * h + j];
                acc += b[2 * j] * __uint_as_float(u << 16);
                acc += b[2 * j + 1] * __uint_as_float(u & 0xffff0000u);
            }
        }
    }
    gemv_store(acc, y, n, g);
}
