// Interleaved partial RoPE on the trailing 2 * half channels of each d-row; x is [S, inner, d].
// Angles and rotation in double, like the CPU reference.
extern "C" __global__ void rope_interleaved(float* x, int s_len, int inner, int d, int half,
                                            const long long* pos, const double* inv_freq, double sign) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 total = (u64)s_len * inner * half;
    if (t >= total) return;
    int i = (int)(t % half);
    u64 rowi = t / half;
    int s = (int)(rowi / inner);
    float* row = x + rowi * d + (d - 2 * half);
    double ang = (double)pos[s] * inv_freq[i];
    double sn, c;
    sincos(ang, &sn, &c);
    sn *= sign;
    double a = row[2 * i], b = row[2 * i + 1];
    row[2 * i] = (float)(a * c - b * sn);
    row[2 * i + 1] = (float)(a * sn + b * c);
}
