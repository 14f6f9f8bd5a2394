// Shared helpers for Corvid's NVRTC kernels. No #include: NVRTC here has no CUDA headers on its
// search path (the PyTorch wheel ships libnvrtc without them), so bf16 is a raw 16-bit pattern
// and tensor-core instructions are inline PTX.

typedef unsigned short bf16_t;
typedef long long i64;

#define NEG_INF __int_as_float(0xff800000)

// bf16 -> f32 is exact: the bf16 bits are the high half of the f32.
__device__ __forceinline__ float bf16_to_f32(bf16_t x) {
    return __uint_as_float(((unsigned int)x) << 16);
}

// f32 -> bf16, round to nearest even (what PyTorch's .to(bfloat16) does); NaN stays NaN.
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (bf16_t)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

// Element load/store in f32 for the two storage types.
__device__ __forceinline__ float ld_f32(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ float ld_f32(const bf16_t* p, i64 i) { return bf16_to_f32(p[i]); }
__device__ __forceinline__ void st_f32(float* p, i64 i, float v) { p[i] = v; }
__device__ __forceinline__ void st_f32(bf16_t* p, i64 i, float v) { p[i] = f32_to_bf16(v); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
