// Absorbed MLA decode attention over the latent cache (one query token per row).
//
// Shapes (the host prepends #define C_DIM, R_DIM for the model at hand):
//   q_lat [B, H, C]  query with W_uk folded in (latent space), contiguous
//   q_pe  [B, H, R]  RoPE part of the query, contiguous
//   c_kv  [B, S, C]  cached normalised latent; rows contiguous, batch stride ckv_bstride elements
//   k_pe  [B, S, R]  cached RoPE key; rows contiguous, batch stride kpe_bstride elements
//   lens  [B]        int32, keys 0..lens[b] of row b are visible (clamped to 0..S)
//   out   [B, H, C]  softmax(scale * (q_lat . c_kv + q_pe . k_pe)) . c_kv
// A row with no visible key gets zeros.
//
// Two kernels compute this:
//   mla_decode_simt_{f32,bf16}: one block per (head, row), plain FMA; any C, R.
//   mla_decode_tc_bf16 + mla_decode_combine: tensor cores (mma.sync m16n8k16 bf16, f32
//     accumulate), 16 heads per block, the keys split across blocks (flash-decoding); needs
//     C % 32 == 0 and (C + R) % 16 == 0 and 16-byte aligned rows.

#define D_DIM (C_DIM + R_DIM)

// ---------------------------------------------------------------------------------------------
// SIMT path
// ---------------------------------------------------------------------------------------------

#define SIMT_THREADS 128
#define SIMT_WARPS (SIMT_THREADS / 32)
#define SIMT_TILE 32
#define SIMT_ACC ((C_DIM + SIMT_THREADS - 1) / SIMT_THREADS)

template <typename T>
__device__ __forceinline__ void mla_decode_simt(const T* __restrict__ q_lat,
                                                const T* __restrict__ q_pe,
                                                const T* __restrict__ c_kv, i64 ckv_bstride,
                                                const T* __restrict__ k_pe, i64 kpe_bstride,
                                                const int* __restrict__ lens, int S, int H,
                                                float scale, T* __restrict__ out) {
    __shared__ float q_s[D_DIM];
    __shared__ float p_s[SIMT_TILE];
    __shared__ float alpha_s;
    __shared__ float l_s;
    const int h = blockIdx.x;
    const int b = blockIdx.y;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const i64 bh = (i64)b * H + h;
    for (int i = tid; i < C_DIM; i += SIMT_THREADS) q_s[i] = ld_f32(q_lat, bh * C_DIM + i);
    for (int i = tid; i < R_DIM; i += SIMT_THREADS) q_s[C_DIM + i] = ld_f32(q_pe, bh * R_DIM + i);
    int len = lens[b];
    len = len < 0 ? 0 : (len > S ? S : len);
    const T* ckv = c_kv + (i64)b * ckv_bstride;
    const T* kpe = k_pe + (i64)b * kpe_bstride;
    float acc[SIMT_ACC];
#pragma unroll
    for (int a = 0; a < SIMT_ACC; ++a) acc[a] = 0.f;
    // Running max and sum of the softmax; only warp 0 keeps them (all its lanes agree).
    float m_run = NEG_INF;
    float l_run = 0.f;
    __syncthreads();
    for (int s0 = 0; s0 < len; s0 += SIMT_TILE) {
        const int n = min(SIMT_TILE, len - s0);
        // Scores: warp w takes keys w, w + 4, ...; lanes split the D dims.
        for (int k = warp; k < SIMT_TILE; k += SIMT_WARPS) {
            float dot = 0.f;
            if (k < n) {
                const i64 key = s0 + k;
                for (int i = lane; i < C_DIM; i += 32) dot += q_s[i] * ld_f32(ckv, key * C_DIM + i);
                for (int i = lane; i < R_DIM; i += 32)
                    dot += q_s[C_DIM + i] * ld_f32(kpe, key * R_DIM + i);
            }
            dot = warp_sum(dot);
            if (lane == 0) p_s[k] = (k < n) ? dot * scale : NEG_INF;
        }
        __syncthreads();
        // Online softmax over this tile (SIMT_TILE == 32: one score per lane of warp 0).
        if (warp == 0) {
            const float s = p_s[lane];
            const float m_new = fmaxf(m_run, warp_max(s));  // finite: n >= 1
            const float p = expf(s - m_new);
            const float alpha = expf(m_run - m_new);        // 0 on the first tile
            l_run = l_run * alpha + warp_sum(p);
            m_run = m_new;
            p_s[lane] = p;
            if (lane == 0) alpha_s = alpha;
        }
        __syncthreads();
        const float alpha = alpha_s;
#pragma unroll
        for (int a = 0; a < SIMT_ACC; ++a) {
            const int j = tid + a * SIMT_THREADS;
            if (j < C_DIM) {
                float v = acc[a] * alpha;
                for (int k = 0; k < n; ++k) v += p_s[k] * ld_f32(ckv, (i64)(s0 + k) * C_DIM + j);
                acc[a] = v;
            }
        }
        __syncthreads();  // p_s is rewritten by the next tile
    }
    if (tid == 0) l_s = l_run;
    __syncthreads();
    const float inv = l_s > 0.f ? 1.f / l_s : 0.f;
#pragma unroll
    for (int a = 0; a < SIMT_ACC; ++a) {
        const int j = tid + a * SIMT_THREADS;
        if (j < C_DIM) st_f32(out, bh * C_DIM + j, acc[a] * inv);
    }
}

extern "C" __global__ void __launch_bounds__(SIMT_THREADS)
mla_decode_simt_f32(const float* q_lat, const float* q_pe, const float* c_kv, i64 ckv_bstride,
                    const float* k_pe, i64 kpe_bstride, const int* lens, int S, int H,
                    float scale, float* out) {
    mla_decode_simt<float>(q_lat, q_pe, c_kv, ckv_bstride, k_pe, kpe_bstride, lens, S, H, scale,
                           out);
}

extern "C" __global__ void __launch_bounds__(SIMT_THREADS)
mla_decode_simt_bf16(const bf16_t* q_lat, const bf16_t* q_pe, const bf16_t* c_kv,
                     i64 ckv_bstride, const bf16_t* k_pe, i64 kpe_bstride, const int* lens, int S,
                     int H, float scale, bf16_t* out) {
    mla_decode_simt<bf16_t>(q_lat, q_pe, c_kv, ckv_bstride, k_pe, kpe_bstride, lens, S, H, scale,
                            out);
}

// ---------------------------------------------------------------------------------------------
// Tensor-core path (bf16), split over keys
// ---------------------------------------------------------------------------------------------
//
// Block = 4 warps, 16 heads (zero-padded past H), one row b, keys [split*split_len, ...).
// Per tile of TC_TK = 32 keys:
//   1. load the keys (c_kv | k_pe, D_DIM bf16 per key) into shared memory, 16 bytes a thread;
//   2. S[16, 32] = Q[16, D] . K[32, D]^T  (warp w: keys 8w..8w+7, D/16 mma steps);
//   3. online softmax per head (warp w: heads 4w..4w+3), P in bf16;
//   4. O[16, C] = alpha * O + P[16, 32] . V[32, C], V = the c_kv part of the key tile
//      (warp w: value columns [w*C/4, (w+1)*C/4), accumulators in registers).
// Each block writes its unnormalised O with the running max m and sum l; mla_decode_combine
// merges the splits of a (row, head).
//
// mma.sync.m16n8k16.row.col.f32.bf16 fragments (PTX ISA), g = lane / 4, t = lane % 4:
//   A (16x16): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16x8):  b0 = (k = 2t..2t+1, n = g), b1 = (k = 2t+8..2t+9, n = g)
//   C (16x8):  c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1)
// Each 32-bit register holds two bf16, the lower index in the low half.

#define TC_THREADS 128
#define TC_TK 32
#define TC_HEADS 16
#define TC_DS (D_DIM + 8)          // shared row stride (elements): rows shift by 4 banks
#define TC_PS (TC_TK + 8)
#define TC_NT (C_DIM / 32)         // 8-column tiles of O per warp

__device__ __forceinline__ void mma_16816_bf16(float* c, unsigned a0, unsigned a1, unsigned a2,
                                               unsigned a3, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned ld_pair(const bf16_t* p) {
    return *reinterpret_cast<const unsigned*>(p);
}

__device__ __forceinline__ unsigned pack_pair(bf16_t lo, bf16_t hi) {
    return (unsigned)lo | ((unsigned)hi << 16);
}

// Shared memory of one block, in bytes (the host computes the same number).
#define TC_SMEM_BYTES                                                                    \
    ((TC_HEADS * TC_DS + TC_TK * TC_DS) * 2 + TC_HEADS * TC_TK * 4 + TC_HEADS * TC_PS * 2 + \
     3 * TC_HEADS * 4)

extern "C" __global__ void __launch_bounds__(TC_THREADS)
mla_decode_tc_bf16(const bf16_t* __restrict__ q_lat, const bf16_t* __restrict__ q_pe,
                   const bf16_t* __restrict__ c_kv, i64 ckv_bstride,
                   const bf16_t* __restrict__ k_pe, i64 kpe_bstride,
                   const int* __restrict__ lens, int S, int H, int n_split, int split_len,
                   float scale, float* __restrict__ ws_o, float* __restrict__ ws_ml) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16_t* q_s = reinterpret_cast<bf16_t*>(smem);           // [16][TC_DS]
    bf16_t* k_s = q_s + TC_HEADS * TC_DS;                     // [TC_TK][TC_DS]
    float* s_s = reinterpret_cast<float*>(k_s + TC_TK * TC_DS); // [16][TC_TK]
    bf16_t* p_s = reinterpret_cast<bf16_t*>(s_s + TC_HEADS * TC_TK); // [16][TC_PS]
    float* alpha_s = reinterpret_cast<float*>(p_s + TC_HEADS * TC_PS); // [16]
    float* m_s = alpha_s + TC_HEADS;                          // [16]
    float* l_s = m_s + TC_HEADS;                              // [16]

    const int split = blockIdx.x;
    const int hg = blockIdx.y;
    const int b = blockIdx.z;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;

    int len = lens[b];
    len = len < 0 ? 0 : (len > S ? S : len);
    const int s_begin = split * split_len;
    const int s_end = min(len, s_begin + split_len);

    // Queries of this head group: [16][C | R], zero past H.
    for (int i = tid; i < TC_HEADS * D_DIM; i += TC_THREADS) {
        const int hh = i / D_DIM;
        const int d = i - hh * D_DIM;
        const int h = hg * TC_HEADS + hh;
        bf16_t v = 0;
        if (h < H) {
            const i64 bh = (i64)b * H + h;
            v = d < C_DIM ? q_lat[bh * C_DIM + d] : q_pe[bh * R_DIM + (d - C_DIM)];
        }
        q_s[hh * TC_DS + d] = v;
    }
    if (tid < TC_HEADS) {
        m_s[tid] = NEG_INF;
        l_s[tid] = 0.f;
    }
    float acc[TC_NT][4];
#pragma unroll
    for (int nt = 0; nt < TC_NT; ++nt) {
        acc[nt][0] = 0.f;
        acc[nt][1] = 0.f;
        acc[nt][2] = 0.f;
        acc[nt][3] = 0.f;
    }
    const bf16_t* ckv = c_kv + (i64)b * ckv_bstride;
    const bf16_t* kpe = k_pe + (i64)b * kpe_bstride;
    const int chunks = D_DIM / 8;  // 16-byte chunks per key

    for (int s0 = s_begin; s0 < s_end; s0 += TC_TK) {
        const int n = min(TC_TK, s_end - s0);
        __syncthreads();  // the previous tile's reads of k_s and p_s are done
        for (int i = tid; i < TC_TK * chunks; i += TC_THREADS) {
            const int kk = i / chunks;
            const int ch = i - kk * chunks;
            uint4 v;
            v.x = 0u;
            v.y = 0u;
            v.z = 0u;
            v.w = 0u;
            if (kk < n) {
                const i64 key = s0 + kk;
                if (ch < C_DIM / 8) {
                    v = *reinterpret_cast<const uint4*>(ckv + key * C_DIM + ch * 8);
                } else {
                    v = *reinterpret_cast<const uint4*>(kpe + key * R_DIM + (ch - C_DIM / 8) * 8);
                }
            }
            *reinterpret_cast<uint4*>(k_s + kk * TC_DS + ch * 8) = v;
        }
        __syncthreads();

        // 2. Scores of keys [8w, 8w + 8).
        {
            float c[4] = {0.f, 0.f, 0.f, 0.f};
            const int n0 = warp * 8;
            const bf16_t* qa = q_s + g * TC_DS + 2 * t;
            const bf16_t* qb = q_s + (g + 8) * TC_DS + 2 * t;
            const bf16_t* kr = k_s + (n0 + g) * TC_DS + 2 * t;
#pragma unroll 4
            for (int k0 = 0; k0 < D_DIM; k0 += 16) {
                mma_16816_bf16(c, ld_pair(qa + k0), ld_pair(qb + k0), ld_pair(qa + k0 + 8),
                               ld_pair(qb + k0 + 8), ld_pair(kr + k0), ld_pair(kr + k0 + 8));
            }
            const int col = n0 + 2 * t;
            s_s[g * TC_TK + col] = col < n ? c[0] * scale : NEG_INF;
            s_s[g * TC_TK + col + 1] = col + 1 < n ? c[1] * scale : NEG_INF;
            s_s[(g + 8) * TC_TK + col] = col < n ? c[2] * scale : NEG_INF;
            s_s[(g + 8) * TC_TK + col + 1] = col + 1 < n ? c[3] * scale : NEG_INF;
        }
        __syncthreads();

        // 3. Online softmax, heads [4w, 4w + 4), one key per lane.
        for (int hh = warp * 4; hh < warp * 4 + 4; ++hh) {
            const float s = s_s[hh * TC_TK + lane];
            const float m_old = m_s[hh];
            const float m_new = fmaxf(m_old, warp_max(s));  // finite: n >= 1
            const float p = expf(s - m_new);
            const float sum = warp_sum(p);
            p_s[hh * TC_PS + lane] = f32_to_bf16(p);
            __syncwarp();
            if (lane == 0) {
                const float alpha = expf(m_old - m_new);
                alpha_s[hh] = alpha;
                l_s[hh] = l_s[hh] * alpha + sum;
                m_s[hh] = m_new;
            }
        }
        __syncthreads();

        // 4. O = alpha * O + P . V on value columns [w*C/4, (w+1)*C/4).
        const float al0 = alpha_s[g];
        const float al1 = alpha_s[g + 8];
#pragma unroll
        for (int nt = 0; nt < TC_NT; ++nt) {
            acc[nt][0] *= al0;
            acc[nt][1] *= al0;
            acc[nt][2] *= al1;
            acc[nt][3] *= al1;
        }
#pragma unroll
        for (int kk = 0; kk < TC_TK; kk += 16) {
            const unsigned a0 = ld_pair(p_s + g * TC_PS + kk + 2 * t);
            const unsigned a1 = ld_pair(p_s + (g + 8) * TC_PS + kk + 2 * t);
            const unsigned a2 = ld_pair(p_s + g * TC_PS + kk + 8 + 2 * t);
            const unsigned a3 = ld_pair(p_s + (g + 8) * TC_PS + kk + 8 + 2 * t);
            const bf16_t* v0 = k_s + (kk + 2 * t) * TC_DS + g;  // key kk + 2t, column g
#pragma unroll
            for (int nt = 0; nt < TC_NT; ++nt) {
                const int n0 = (warp * TC_NT + nt) * 8;
                const unsigned b0 = pack_pair(v0[n0], v0[TC_DS + n0]);
                const unsigned b1 = pack_pair(v0[8 * TC_DS + n0], v0[9 * TC_DS + n0]);
                mma_16816_bf16(acc[nt], a0, a1, a2, a3, b0, b1);
            }
        }
    }
    __syncthreads();

    // Unnormalised partial output and (m, l) of this split.
    const int h0 = hg * TC_HEADS + g;
    const int h1 = h0 + 8;
#pragma unroll
    for (int nt = 0; nt < TC_NT; ++nt) {
        const int col = (warp * TC_NT + nt) * 8 + 2 * t;
        if (h0 < H) {
            float* o = ws_o + (((i64)b * H + h0) * n_split + split) * C_DIM;
            o[col] = acc[nt][0];
            o[col + 1] = acc[nt][1];
        }
        if (h1 < H) {
            float* o = ws_o + (((i64)b * H + h1) * n_split + split) * C_DIM;
            o[col] = acc[nt][2];
            o[col + 1] = acc[nt][3];
        }
    }
    if (tid < TC_HEADS) {
        const int h = hg * TC_HEADS + tid;
        if (h < H) {
            float* ml = ws_ml + (((i64)b * H + h) * n_split + split) * 2;
            ml[0] = m_s[tid];
            ml[1] = l_s[tid];
        }
    }
}

// Merges the splits of one (row, head) per block: out = sum_j e^(m_j - m) O_j / sum_j e^(m_j - m) l_j.
#define COMBINE_THREADS 128
#define COMBINE_MAX_SPLIT 1024

extern "C" __global__ void __launch_bounds__(COMBINE_THREADS)
mla_decode_combine_bf16(const float* __restrict__ ws_o, const float* __restrict__ ws_ml,
                        int n_split, bf16_t* __restrict__ out) {
    __shared__ float w_s[COMBINE_MAX_SPLIT];
    __shared__ float red_s[COMBINE_THREADS / 32];
    __shared__ float m_all;
    __shared__ float inv_l;
    const i64 bh = blockIdx.x;
    const int tid = threadIdx.x;
    const float* ml = ws_ml + bh * n_split * 2;
    float m = NEG_INF;
    for (int j = tid; j < n_split; j += COMBINE_THREADS) {
        if (ml[2 * j + 1] > 0.f) m = fmaxf(m, ml[2 * j]);
    }
    m = warp_max(m);
    if ((tid & 31) == 0) red_s[tid >> 5] = m;
    __syncthreads();
    if (tid == 0) {
        float mm = red_s[0];
        for (int w = 1; w < COMBINE_THREADS / 32; ++w) mm = fmaxf(mm, red_s[w]);
        m_all = mm;
    }
    __syncthreads();
    float l = 0.f;
    for (int j = tid; j < n_split; j += COMBINE_THREADS) {
        const float lj = ml[2 * j + 1];
        const float wj = lj > 0.f ? expf(ml[2 * j] - m_all) : 0.f;
        w_s[j] = wj;
        l += wj * lj;
    }
    l = warp_sum(l);
    __syncthreads();
    if ((tid & 31) == 0) red_s[tid >> 5] = l;
    __syncthreads();
    if (tid == 0) {
        float ll = 0.f;
        for (int w = 0; w < COMBINE_THREADS / 32; ++w) ll += red_s[w];
        inv_l = ll > 0.f ? 1.f / ll : 0.f;
    }
    __syncthreads();
    const float* o = ws_o + bh * n_split * C_DIM;
    for (int d = tid; d < C_DIM; d += COMBINE_THREADS) {
        float v = 0.f;
        for (int j = 0; j < n_split; ++j) {
            const float wj = w_s[j];
            if (wj > 0.f) v += wj * o[(i64)j * C_DIM + d];
        }
        out[bh * C_DIM + d] = f32_to_bf16(v * inv_l);
    }
}
