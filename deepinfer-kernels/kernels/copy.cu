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

extern "C" __global__ void gather_rows_f32(const float* table, const long long* ids, float* out, int n, int row) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)n * row) return;
    out[t] = table[(u64)ids[t / row] * row + t % row];
}

extern "C" __global__ void gather_rows_bf16(const u16* table, const long long* ids, float* out, int n, int row) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)n * row) return;
    out[t] = bf16_to_f32(table[(u64)ids[t / row] * row + t % row]);
}
