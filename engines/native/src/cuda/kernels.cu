// Kernels of the native engine's CUDA backend, compiled by NVRTC at load time for the GPU found
// (no CUDA headers needed: 16-bit values travel as unsigned short and are converted here).
//
// Activations are f32; a kernel that feeds a matrix product writes its output in the weights'
// type (`dt`: 0 f32, 1 bf16, 2 f16) so that cuBLAS multiplies like types. The KV cache is f16,
// laid out per block as the host cache is: [layer][k|v][kv_head][BLOCK_TOKENS][head_dim].

typedef unsigned short u16;
#define BLOCK_TOKENS 16

__device__ __forceinline__ float bf16_to_f32(u16 v) { return __uint_as_float(((unsigned)v) << 16); }
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                     // round to nearest even
    return (u16)(u >> 16);
}
__device__ __forceinline__ float f16_to_f32(u16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
}
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float load(const void* p, size_t i, int dt) {
    if (dt == 0) return ((const float*)p)[i];
    u16 v = ((const u16*)p)[i];
    return dt == 1 ? bf16_to_f32(v) : f16_to_f32(v);
}
__device__ __forceinline__ void store(void* p, size_t i, int dt, float f) {
    if (dt == 0) ((float*)p)[i] = f;
    else ((u16*)p)[i] = dt == 1 ? f32_to_bf16(f) : f32_to_f16(f);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The sum of `v` over the thread block (blockDim.x a multiple of 32), given to every thread.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    v = warp_sum(v);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? partial[lane] : 0.f;
    return warp_sum(v);
}

// x[t] = table[tokens[t]] * scale, one block per token.
extern "C" __global__ void embed(const void* table, int dt, const int* tokens, float* x, int d, float scale) {
    size_t t = blockIdx.x, row = (size_t)tokens[t] * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[t * d + i] = load(table, row + i, dt) * scale;
}

// y = x / rms(x) * (offset + w) per row of `d` (offset 1 for Gemma's zero-centred weights), one
// block per row, after `x += residual` when `residual` is set (the residual add of the layer
// before, fused); then any of: add y to `add_to`, store y in `out` (f32), store y in `cast` (dt).
extern "C" __global__ void rms_norm(float* x, const float* residual, const float* w, float offset, float eps, int d,
                                    float* add_to, float* out, void* cast, int dt) {
    size_t r = blockIdx.x;
    float* xr = x + r * d;
    float ss = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        if (residual) xr[i] += residual[r * d + i];  // each thread rereads only what it wrote
        ss += xr[i] * xr[i];
    }
    float inv = rsqrtf(block_sum(ss) / d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float y = xr[i] * inv * (offset + w[i]);
        if (add_to) add_to[r * d + i] += y;
        if (out) out[r * d + i] = y;
        if (cast) store(cast, r * d + i, dt, y);
    }
}

// y[r][c] += b[c] for `rows` rows of `cols`.
extern "C" __global__ void add_bias(float* y, const float* b, int cols, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) y[i] += b[i % cols];
}

extern "C" __global__ void add(float* x, const float* y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// One token per block: its row of `qkv` ([q heads | k heads | v heads] x head_dim, f32) gets
// Gemma's per-head q/k norms when `q_norm` is set, the rotation of its position on q and k
// ("rotate half": i pairs with i + head_dim/2; cos/sin of pos * inv_freq[i] times `factor`),
// and its k and v are stored in f16 in its sequence's block of `layer`. One warp per head.
extern "C" __global__ void rope_store(float* qkv, const int* pos, const int* seq, const int* tables, int table_stride,
                                      const float* inv_freq, float factor, const float* q_norm, const float* k_norm,
                                      float norm_offset, float eps, int heads, int kv_heads, int hd, u16* cache,
                                      int layers, int layer) {
    int t = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    int p = pos[t], half = hd / 2;
    float* row = qkv + (size_t)t * (heads + 2 * kv_heads) * hd;
    size_t layer_elems = (size_t)kv_heads * BLOCK_TOKENS * hd;
    size_t block = tables[seq[t] * table_stride + p / BLOCK_TOKENS];
    u16* kbase = cache + ((block * layers + layer) * 2) * layer_elems;
    u16* vbase = kbase + layer_elems;
    int slot = p % BLOCK_TOKENS;
    for (int h = warp; h < heads + 2 * kv_heads; h += warps) {
        float* x = row + (size_t)h * hd;
        if (h >= heads + kv_heads) {  // a value head: stored as it is
            int kh = h - heads - kv_heads;
            for (int i = lane; i < hd; i += 32) vbase[((size_t)kh * BLOCK_TOKENS + slot) * hd + i] = f32_to_f16(x[i]);
            continue;
        }
        const float* nw = h < heads ? q_norm : k_norm;
        float inv = 1.f;
        if (nw) {
            float ss = 0.f;
            for (int i = lane; i < hd; i += 32) ss += x[i] * x[i];
            inv = rsqrtf(warp_sum(ss) / hd + eps);
        }
        for (int i = lane; i < half; i += 32) {
            float a = x[i], b = x[i + half];
            if (nw) {
                a = a * inv * (norm_offset + nw[i]);
                b = b * inv * (norm_offset + nw[i + half]);
            }
            float s, c;
            sincosf((float)p * inv_freq[i], &s, &c);
            c *= factor;
            s *= factor;
            float ra = a * c - b * s, rb = b * c + a * s;
            x[i] = ra;
            x[i + half] = rb;
            if (h >= heads) {
                u16* k = kbase + ((size_t)(h - heads) * BLOCK_TOKENS + slot) * hd;
                k[i] = f32_to_f16(ra);
                k[i + half] = f32_to_f16(rb);
            }
        }
    }
}

// Causal attention, one block of ATT_WARPS warps per (token, query head): the token at `pos` of
// sequence `seq` sees positions max(0, pos + 1 - window) ..= pos of its block table (window 0:
// all). Each warp runs an online softmax over every ATT_WARPS-th of those positions (so a long
// context is read in parallel even for one decoding token), then the warps' partial results are
// merged. `sinks` (gpt-oss; may be null) add one logit per head to the denominator. Writes the
// head's output in `dt` for the output projection. head_dim <= 256.
#define ATT_WARPS 4
extern "C" __global__ void attention(const float* qkv, const int* pos, const int* seq, const int* tables,
                                     int table_stride, const u16* cache, int layers, int layer, int heads,
                                     int kv_heads, int hd, float scale, int window, const float* sinks, void* out,
                                     int dt) {
    __shared__ float part_m[ATT_WARPS], part_l[ATT_WARPS], part_acc[ATT_WARPS][256];
    int t = blockIdx.x, h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int p = pos[t], first = window > 0 && p + 1 > window ? p + 1 - window : 0;
    int kh = h / (heads / kv_heads);
    const float* q = qkv + (size_t)t * (heads + 2 * kv_heads) * hd + (size_t)h * hd;
    const int* table = tables + seq[t] * table_stride;
    size_t layer_elems = (size_t)kv_heads * BLOCK_TOKENS * hd;
    float qr[8], acc[8];
    int n = (hd + 31) / 32;
    for (int j = 0; j < 8; j++) {
        int i = lane + 32 * j;
        qr[j] = j < n && i < hd ? q[i] * scale : 0.f;
        acc[j] = 0.f;
    }
    const float neg_inf = __int_as_float(0xff800000);
    float m = neg_inf, l = 0.f;
    for (int j0 = first + warp; j0 <= p; j0 += ATT_WARPS) {
        size_t block = table[j0 / BLOCK_TOKENS];
        const u16* kb = cache + ((block * layers + layer) * 2) * layer_elems +
                        ((size_t)kh * BLOCK_TOKENS + j0 % BLOCK_TOKENS) * hd;
        const u16* vb = kb + layer_elems;
        float dot = 0.f;
        for (int j = 0; j < n; j++) {
            int i = lane + 32 * j;
            if (i < hd) dot += qr[j] * f16_to_f32(kb[i]);
        }
        float s = warp_sum(dot);
        float m2 = fmaxf(m, s), corr = __expf(m - m2), e = __expf(s - m2);
        l = l * corr + e;
        for (int j = 0; j < n; j++) {
            int i = lane + 32 * j;
            acc[j] = acc[j] * corr + (i < hd ? e * f16_to_f32(vb[i]) : 0.f);
        }
        m = m2;
    }
    if (lane == 0) {
        part_m[warp] = m;
        part_l[warp] = l;
    }
    for (int j = 0; j < n; j++) {
        int i = lane + 32 * j;
        if (i < hd) part_acc[warp][i] = acc[j];
    }
    __syncthreads();
    if (warp != 0) return;
    // Merge: rescale each warp's sums to the largest maximum (a warp that saw no position has
    // m = -inf and weighs nothing).
    float mm = sinks ? sinks[h] : neg_inf;
    for (int w = 0; w < ATT_WARPS; w++) mm = fmaxf(mm, part_m[w]);
    float total = sinks ? __expf(sinks[h] - mm) : 0.f;
    float wgt[ATT_WARPS];
    for (int w = 0; w < ATT_WARPS; w++) {
        wgt[w] = part_m[w] == neg_inf ? 0.f : __expf(part_m[w] - mm);
        total += part_l[w] * wgt[w];
    }
    size_t o = ((size_t)t * heads + h) * hd;
    for (int j = 0; j < n; j++) {
        int i = lane + 32 * j;
        if (i >= hd) continue;
        float v = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) v += part_acc[w][i] * wgt[w];
        store(out, o + i, dt, v / total);
    }
}

// The gated MLP's activation over `gu` (per token: [gate | up], `inter` each): silu(gate) * up
// (gelu 0) or gelu_tanh(gate) * up (gelu 1), written in `dt` for the down projection.
extern "C" __global__ void gated(const float* gu, void* out, int dt, int inter, int gelu, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t t = i / inter, c = i % inter;
    float g = gu[t * 2 * inter + c], u = gu[t * 2 * inter + inter + c];
    float a = gelu ? 0.5f * g * (1.f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)))
                   : g / (1.f + __expf(-g));
    store(out, i, dt, a * u);
}

// dst[r] = src[rows[r]], rows of `d`.
extern "C" __global__ void gather(const float* src, const int* rows, float* dst, int d) {
    size_t r = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[r * d + i] = src[(size_t)rows[r] * d + i];
}

// x = cap * tanh(x / cap)
extern "C" __global__ void softcap(float* x, float cap, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

// (v, i) becomes (v2, i2) when that is larger, or as large at a smaller index.
__device__ __forceinline__ void keep_larger(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

// ids[r] = the index of the largest value of row r of `x` (rows of `vocab`), the first where
// several tie, as llmr_sampling::argmax picks it on the host: NaN never wins, and a row with
// nothing above -inf gives 0. One block per row, blockDim.x a multiple of 32.
extern "C" __global__ void argmax_rows(const float* x, int vocab, int* ids) {
    const float* row = x + (size_t)blockIdx.x * vocab;
    const float neg_inf = __int_as_float(0xff800000);
    const int none = 0x7fffffff;
    float v = neg_inf;
    int i = none;
    for (int c = threadIdx.x; c < vocab; c += blockDim.x)
        if (row[c] > v) {
            v = row[c];
            i = c;
        }
    for (int o = 16; o > 0; o >>= 1)
        keep_larger(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
    __shared__ float best[32];
    __shared__ int at[32];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        best[warp] = v;
        at[warp] = i;
    }
    __syncthreads();
    if (warp != 0) return;
    bool held = lane < (int)(blockDim.x / 32);
    v = held ? best[lane] : neg_inf;
    i = held ? at[lane] : none;
    for (int o = 16; o > 0; o >>= 1)
        keep_larger(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
    if (lane == 0) ids[blockIdx.x] = v > neg_inf ? i : 0;
}
