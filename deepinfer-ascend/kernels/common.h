// Shared by every kernel in this folder. The host runtime splices this file in place of
// `#include "common.h"` before handing a source to aclrtc, so no include path is needed.
#pragma once
#include "kernel_operator.h"
using namespace AscendC;

// Depth of every double-buffered queue; equals deepinfer_ascend::tiling::BUFFER_NUM.
constexpr int32_t BUFFER_NUM = 2;
// Elements per MX scale block; equals deepinfer_ascend::mx::MX_BLOCK.
constexpr uint32_t MX_BLOCK = 32;
// Bytes per DataCopy block; equals deepinfer_ascend::chip::BLOCK_BYTES.
constexpr uint32_t BLOCK_BYTES = 32;

// Tiling structs are flat arrays of 4-byte fields, read word by word from global memory.
template <typename T>
__aicore__ inline void CopyTiling(T *dst, GM_ADDR src)
{
    __gm__ uint32_t *in = reinterpret_cast<__gm__ uint32_t *>(src);
    uint32_t *out = reinterpret_cast<uint32_t *>(dst);
    for (uint32_t i = 0; i < sizeof(T) / sizeof(uint32_t); ++i) {
        out[i] = in[i];
    }
}

// Make scalar reads of vector results safe: wait until the vector pipe has written them.
__aicore__ inline void VectorToScalarSync()
{
    event_t ev = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::V_S));
    SetFlag<HardEvent::V_S>(ev);
    WaitFlag<HardEvent::V_S>(ev);
}

// Make vector reads of scalar-written UB values safe.
__aicore__ inline void ScalarToVectorSync()
{
    event_t ev = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::S_V));
    SetFlag<HardEvent::S_V>(ev);
    WaitFlag<HardEvent::S_V>(ev);
}

// E8M0 exponent of the MX scale for a block maximum: ceil(log2(amax / elemMax)).
__aicore__ inline int32_t MxScaleExp(float amax, float amaxFloor, float elemMax)
{
    float r = (amax > amaxFloor ? amax : amaxFloor) / elemMax;
    uint32_t bits = *reinterpret_cast<uint32_t *>(&r);
    int32_t e = static_cast<int32_t>((bits >> 23) & 0xff) - 127;
    if ((bits & 0x7fffff) != 0) {
        e += 1;
    }
    return e < -127 ? -127 : (e > 127 ? 127 : e);
}

// 2^-e as a float (exact for -126 <= e <= 127).
__aicore__ inline float Pow2Neg(int32_t e)
{
    uint32_t bits = static_cast<uint32_t>(127 - e) << 23;
    return *reinterpret_cast<float *>(&bits);
}
