// Paged block copy (copy-on-write): two passes through a staging buffer so that every source
// is read before any destination is written. Plus embedding gather.
extern "C" __global__ void copy_blocks_stage(const u32* cache, u32* stage, const int* src, int pairs, u64 words) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)pairs * words) return;
    u64 p = t / words, w = t % words;
    stage[t] = cache[(u64)src[p] * words + w];
}

extern "C" __global__ void copy_blocks_commit(u32* cache, const u32* stage, const int* dst, int pairs, u64 words) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)pairs * words) return;
    u64 p = t / words, w = t % words;
    cache[(u64)dst[p] * words + w] = stage[t];
}

// Embedding gather: out[i, :] = table[ids[i], :]. An id outside [0, rows) reads nothing and
// gives a NaN row (the CPU backend rejects it; a kernel cannot return an error).
extern "C" __global__ void gather_rows_f32(const float* table, const long long* ids, float* out, int n, int row,
                                           long long rows) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)n * row) return;
    long long id = ids[t / row];
    out[t] = (id >= 0 && id < rows) ? table[(u64)id * row + t % row] : __int_as_float(0x7fc00000);
}

extern "C" __global__ void gather_rows_bf16(const u16* table, const long long* ids, float* out, int n, int row,
                                            long long rows) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)n * row) return;
    long long id = ids[t / row];
    out[t] = (id >= 0 && id < rows) ? bf16_to_f32(table[(u64)id * row + t % row]) : __int_as_float(0x7fc00000);
}
