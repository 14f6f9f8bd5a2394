// MoE token dispatch and combine.
//
// The host plans the permutation (see moe_dispatch.rs): routed row r = token * k + j goes to
// slot[r] of the expert-sorted buffer, in which every expert's group is padded to a multiple of
// `align` rows (16 bytes of the row count, so grouped GEMM backward gets aligned offsets);
// src[p] is the token feeding slot p, or -1 for a padding slot.
//
//   dispatch: out[p, :] = x[src[p], :]           (zeros where src[p] < 0)
//   combine:  out[t, :] = sum_j w[t, j] * y[slot[t * k + j], :]   (f32 accumulation, j in order)
//
// Combine reads each token's k rows itself, so it needs no atomics and is deterministic.

// dispatch: one block per destination row; the row is moved as V-sized words (V = uint4 when
// rows and pointers are 16-byte aligned, else unsigned int or unsigned short).
template <typename V>
__device__ __forceinline__ V zero_word();
template <>
__device__ __forceinline__ uint4 zero_word<uint4>() {
    uint4 z;
    z.x = 0u;
    z.y = 0u;
    z.z = 0u;
    z.w = 0u;
    return z;
}
template <>
__device__ __forceinline__ unsigned int zero_word<unsigned int>() {
    return 0u;
}
template <>
__device__ __forceinline__ unsigned short zero_word<unsigned short>() {
    return (unsigned short)0;
}

template <typename V>
__device__ __forceinline__ void moe_dispatch_rows(const V* __restrict__ x, i64 x_row_stride,
                                                  const int* __restrict__ src,
                                                  V* __restrict__ out, int row_words) {
    const i64 p = blockIdx.x;
    const int s = src[p];
    V* o = out + p * row_words;
    if (s < 0) {
        for (int i = threadIdx.x; i < row_words; i += blockDim.x) o[i] = zero_word<V>();
    } else {
        const V* xi = x + (i64)s * x_row_stride;
        for (int i = threadIdx.x; i < row_words; i += blockDim.x) o[i] = xi[i];
    }
}

extern "C" __global__ void moe_dispatch_w16(const uint4* x, i64 x_row_stride, const int* src,
                                            uint4* out, int row_words) {
    moe_dispatch_rows<uint4>(x, x_row_stride, src, out, row_words);
}

extern "C" __global__ void moe_dispatch_w4(const unsigned int* x, i64 x_row_stride,
                                           const int* src, unsigned int* out, int row_words) {
    moe_dispatch_rows<unsigned int>(x, x_row_stride, src, out, row_words);
}

extern "C" __global__ void moe_dispatch_w2(const unsigned short* x, i64 x_row_stride,
                                           const int* src, unsigned short* out, int row_words) {
    moe_dispatch_rows<unsigned short>(x, x_row_stride, src, out, row_words);
}

// combine, one element per thread: grid (T, ceil(d / blockDim)).
template <typename T>
__device__ __forceinline__ void moe_combine_elems(const T* __restrict__ y,
                                                  const int* __restrict__ slot,
                                                  const float* __restrict__ w,
                                                  T* __restrict__ out, int k, int d) {
    const i64 tok = blockIdx.x;
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= d) return;
    float acc = 0.f;
    for (int i = 0; i < k; ++i) {
        const int s = slot[tok * k + i];
        acc += w[tok * k + i] * ld_f32(y, (i64)s * d + j);
    }
    st_f32(out, tok * d + j, acc);
}

extern "C" __global__ void moe_combine_f32(const float* y, const int* slot, const float* w,
                                           float* out, int k, int d) {
    moe_combine_elems<float>(y, slot, w, out, k, d);
}

extern "C" __global__ void moe_combine_bf16(const bf16_t* y, const int* slot, const float* w,
                                            bf16_t* out, int k, int d) {
    moe_combine_elems<bf16_t>(y, slot, w, out, k, d);
}

// combine for bf16 rows of 16-byte aligned width: 8 elements per thread, grid (T, ceil(d/8/blockDim)).
extern "C" __global__ void moe_combine_bf16x8(const uint4* __restrict__ y,
                                              const int* __restrict__ slot,
                                              const float* __restrict__ w,
                                              uint4* __restrict__ out, int k, int d8) {
    const i64 tok = blockIdx.x;
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= d8) return;
    float acc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.f;
    for (int i = 0; i < k; ++i) {
        const int s = slot[tok * k + i];
        const float wi = w[tok * k + i];
        const uint4 v = y[(i64)s * d8 + j];
        const unsigned int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            acc[2 * q] += wi * bf16_to_f32((bf16_t)(words[q] & 0xffffu));
            acc[2 * q + 1] += wi * bf16_to_f32((bf16_t)(words[q] >> 16));
        }
    }
    unsigned int packed[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        packed[q] = (unsigned int)f32_to_bf16(acc[2 * q]) |
                    ((unsigned int)f32_to_bf16(acc[2 * q + 1]) << 16);
    }
    uint4 o;
    o.x = packed[0];
    o.y = packed[1];
    o.z = packed[2];
    o.w = packed[3];
    out[tok * d8 + j] = o;
}
