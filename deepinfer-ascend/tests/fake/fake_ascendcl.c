/* A fake libascendcl + aclrtc for the host-runtime tests. Host memory stands in for device
 * memory; "compiling" produces "BIN:<name>" and fails on sources containing
 * FAKE_COMPILE_ERROR or on a wrong --npu-arch. Counters are exported for the tests.
 * Build switches: -DFAKE_SOC="...", -DFAKE_DEVICES=n, -DOMIT_LAUNCH. */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

#ifndef FAKE_SOC
#define FAKE_SOC "Ascend910B2"
#endif
#ifndef FAKE_DEVICES
#define FAKE_DEVICES 1
#endif

static int g_live_allocs = 0, g_compiles = 0, g_finalized = 0, g_inited = 0;
static unsigned g_last_block_dim = 0;
static size_t g_last_args_size = 0;
static int g_ctx = 42;

int fake_live_allocs(void) { return g_live_allocs; }
int fake_compile_count(void) { return g_compiles; }
int fake_finalized(void) { return g_finalized; }
unsigned fake_last_block_dim(void) { return g_last_block_dim; }
size_t fake_last_args_size(void) { return g_last_args_size; }

int aclInit(const char *cfg) { (void)cfg; g_inited = 1; return 0; }
int aclFinalize(void) { g_finalized++; return 0; }
int aclrtGetDeviceCount(uint32_t *n) { *n = FAKE_DEVICES; return 0; }
int aclrtSetDevice(int32_t id) { return (id >= 0 && id < FAKE_DEVICES) ? 0 : 107001; }
int aclrtResetDevice(int32_t id) { (void)id; return 0; }
const char *aclrtGetSocName(void) { return FAKE_SOC; }
int aclrtGetCurrentContext(void **ctx) { *ctx = &g_ctx; return 0; }
int aclrtSetCurrentContext(void *ctx) { return ctx == &g_ctx ? 0 : 107002; }
int aclrtCreateStream(void **s) { *s = malloc(1); return 0; }
int aclrtDestroyStream(void *s) { free(s); return 0; }
int aclrtSynchronizeStream(void *s) { return s ? 0 : 107003; }
int aclrtMalloc(void **p, size_t n, int policy) {
    (void)policy;
    if (n == 0) return 107004;
    *p = calloc(1, n);
    g_live_allocs++;
    return 0;
}
int aclrtFree(void *p) { free(p); g_live_allocs--; return 0; }
int aclrtMemcpy(void *dst, size_t dst_max, const void *src, size_t n, int kind) {
    (void)kind;
    if (n > dst_max) return 107005;
    memcpy(dst, src, n);
    return 0;
}
int aclrtBinaryLoadFromData(const void *data, size_t len, const void *opts, void **h) {
    (void)opts;
    if (len < 4 || memcmp(data, "BIN:", 4) != 0) return 107006;
    char *copy = malloc(len + 1);
    memcpy(copy, data, len);
    copy[len] = 0;
    *h = copy;
    return 0;
}
int aclrtBinaryGetFunction(void *bin, const char *name, void **f) {
    if (strcmp((char *)bin + 4, name) != 0) return 107007;
    *f = bin;
    return 0;
}
int aclrtBinaryUnLoad(void *bin) { free(bin); return 0; }
#ifndef OMIT_LAUNCH
int aclrtLaunchKernel(void *f, uint32_t block_dim, const void *args, size_t args_size, void *stream) {
    (void)args;
    if (!f || !stream) return 107008;
    g_last_block_dim = block_dim;
    g_last_args_size = args_size;
    return 0;
}
#endif

typedef struct { char *src; char *name; char *log; char *bin; size_t bin_len; } Prog;

int aclrtcCreateProg(void **prog, const char *src, const char *name, int nh, const char **h, const char **inc) {
    (void)h; (void)inc;
    if (nh != 0) return 1;
    Prog *p = calloc(1, sizeof(Prog));
    p->src = strdup(src);
    p->name = strdup(name);
    *prog = p;
    return 0;
}
int aclrtcCompileProg(void *prog, int n, const char **opts) {
    Prog *p = prog;
    g_compiles++;
    const char *want = strncmp(FAKE_SOC, "Ascend950", 9) == 0 ? "--npu-arch=dav-3510" : "--npu-arch=dav-2201";
    int arch_ok = 0;
    for (int i = 0; i < n; i++) if (strcmp(opts[i], want) == 0) arch_ok = 1;
    if (!arch_ok) { p->log = strdup("fake: wrong or missing --npu-arch"); return 2; }
    if (strstr(p->src, "FAKE_COMPILE_ERROR")) { p->log = strdup("fake compile error: FAKE_COMPILE_ERROR found"); return 3; }
    p->bin_len = 4 + strlen(p->name);
    p->bin = malloc(p->bin_len);
    memcpy(p->bin, "BIN:", 4);
    memcpy(p->bin + 4, p->name, strlen(p->name));
    return 0;
}
int aclrtcGetBinDataSize(void *prog, size_t *n) { *n = ((Prog *)prog)->bin_len; return 0; }
int aclrtcGetBinData(void *prog, char *out) { Prog *p = prog; memcpy(out, p->bin, p->bin_len); return 0; }
int aclrtcGetCompileLogSize(void *prog, size_t *n) { Prog *p = prog; *n = p->log ? strlen(p->log) + 1 : 0; return 0; }
int aclrtcGetCompileLog(void *prog, char *out) { Prog *p = prog; if (p->log) strcpy(out, p->log); return 0; }
int aclrtcDestroyProg(void **prog) {
    Prog *p = *prog;
    free(p->src); free(p->name); free(p->log); free(p->bin); free(p);
    *prog = NULL;
    return 0;
}
