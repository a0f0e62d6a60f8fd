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

// The largest (v, i) over the block by keep_larger, given to every thread.
__device__ void block_argmax(float& v, int& i) {
    __shared__ float best[32];
    __shared__ int at[32];
    for (int o = 16; o > 0; o >>= 1)
        keep_larger(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) {
        best[warp] = v;
        at[warp] = i;
    }
    __syncthreads();
    bool held = lane < (int)(blockDim.x / 32);
    v = held ? best[lane] : __int_as_float(0xff800000);
    i = held ? at[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1)
        keep_larger(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
}

// The largest of `v` over the block (NaN never wins), given to every thread.
__device__ float block_max(float v) {
    __shared__ float partial[32];
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? partial[lane] : __int_as_float(0xff800000);
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

typedef unsigned long long u64;

// The sum of `v` over the block, given to every thread.
__device__ u64 block_sum_u64(u64 v) {
    __shared__ u64 partial[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? partial[lane] : 0ull;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Picking ids on the device: each output row's id, the most likely or the temperature draw
// llmr_sampling makes on the host from the same logits (the same id: its cut, weights and sums
// computed to the bit). A row of logits is read by many blocks at once, in passes launched one
// after the other (pick_max, pick_coarse, pick_fine, pick_low, pick_weights, pick_choose), each
// leaving what the next needs in the row's PickScratch: one block per row read its 262,144
// logits (Gemma 3) on one multiprocessor, latency-bound, a pass at a time.
//
// What is done with a row: the first of its PICK_FLOATS values (llmr_sampling's DevicePick, and
// rows whose logits the host reads itself).
#define PICK_ARGMAX 0
#define PICK_DRAW 1
#define PICK_NONE 2
#define PICK_FLOATS 5
// A draw sums its weights in blocks of DRAW_BLOCK ids, eight lanes each, as the host does
// (llmr_sampling's temperature.rs), for vocabularies of up to DRAW_BLOCKS blocks.
#define DRAW_BLOCK 512
#define DRAW_BLOCKS 1024
// The passes over a row give each block `chunk` ids (grid: rows x chunks), a multiple of
// PICK_CHUNK: the more rows, the larger, so that fewer blocks add into each row's histograms.
#define PICK_CHUNK 4096
#define PICK_CHUNKS (DRAW_BLOCKS * DRAW_BLOCK / PICK_CHUNK)

struct PickScratch {
    // Top-p's histograms (below): by group, then by bucket in the group where top-p is reached.
    u64 coarse[1024];
    u64 fine[1024];
    // Per chunk: the largest logit and its index (the first of ties), and the lowest logit of
    // top-p's last bucket (+inf where the chunk has none).
    float chunk_max[PICK_CHUNKS];
    int chunk_arg[PICK_CHUNKS];
    float chunk_low[PICK_CHUNKS];
    // Per DRAW_BLOCK ids: the sum of their weights, and the last id with weight (-1: none).
    float block_weight[DRAW_BLOCKS];
    int block_last[DRAW_BLOCKS];
};
// model.rs's PICK_SCRATCH_BYTES, given by device.rs.
static_assert(sizeof(PickScratch) == PICK_SCRATCH_BYTES, "PickScratch's size is mirrored in model.rs");

// llmr_sampling's exp_nonpositive, operation for operation and rounded as Rust rounds (no fused
// multiply-adds), so that a draw's weights are the host's to the bit.
__device__ __forceinline__ float exp_nonpositive(float x) {
    const float rounder = 12582912.f;
    float t = __fmul_rn(fmaxf(x, -87.f), 1.44269504088896340736f);
    float big = __fadd_rn(t, rounder);
    float k = __fsub_rn(big, rounder);
    float f = __fsub_rn(t, k);
    int k_bits = __float_as_int(big) - __float_as_int(rounder);
    const float c0 = 0.693147180559945309417f, c1 = 0.2402265f, c2 = 0.05550411f, c3 = 0.009618129f,
                c4 = 0.001333356f, c5 = 0.0001540353f;
    float p = __fadd_rn(c4, __fmul_rn(f, c5));
    p = __fadd_rn(c3, __fmul_rn(f, p));
    p = __fadd_rn(c2, __fmul_rn(f, p));
    p = __fadd_rn(c1, __fmul_rn(f, p));
    p = __fadd_rn(c0, __fmul_rn(f, p));
    p = __fadd_rn(1.f, __fmul_rn(f, p));
    return __fmul_rn(__int_as_float((k_bits + 127) << 23), p);
}

// Top-p as llmr_sampling's top_p_gap finds it, to the bit: probabilities (at temperature 1) in
// fixed point, 2^40 for 1, so that their sums are the same in any order (and over any number of
// blocks), in a histogram by distance below the best logit (1/16384 of a logit a bucket, 1024
// buckets a group, the last catching the rest), by group, then by bucket in the group where the
// mass reaches top-p; the cut is the lowest logit in that bucket.
#define FINE_PER_LOGIT 16384.f
#define FINE_LAST (1024 * 1024 - 1)
__device__ __forceinline__ int fine_bucket(float best, float l) {
    return (int)fminf(__fmul_rn(__fsub_rn(best, l), FINE_PER_LOGIT), (float)FINE_LAST);
}
__device__ __forceinline__ u64 fixed_prob(float l, float best) {
    return l == l ? (u64)__fmul_rn(exp_nonpositive(__fsub_rn(l, best)), 1099511627776.f) : 0ull;
}

// The first bucket of `hist` (1024, the row's, in global memory) where the running sum from
// `before` reaches `wanted` (the last when none does), with `before` advanced to the sum before
// it; every thread gets both. The block copies the histogram to shared memory; then warp 0 does
// it: each lane sums 32 buckets, a scan over the lanes finds the lane where the sum is reached,
// and that lane walks its buckets.
__device__ int crossing(const u64* hist, u64 wanted, u64& before) {
    __shared__ u64 h[1024];
    __shared__ int edge;
    __shared__ u64 mass_before;
    __syncthreads();
    for (int b = threadIdx.x; b < 1024; b += blockDim.x) h[b] = hist[b];
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        const u64* mine = h + lane * 32;
        u64 sum = 0;
        for (int j = 0; j < 32; j++) sum += mine[(j + lane) & 31];  // skewed: fewer bank conflicts
        u64 running = sum;
        for (int o = 1; o < 32; o <<= 1) {
            u64 t = __shfl_up_sync(0xffffffffu, running, o);
            if (lane >= o) running += t;
        }
        const unsigned reached = __ballot_sync(0xffffffffu, before + running >= wanted);
        if (lane == (reached ? __ffs(reached) - 1 : 31)) {
            u64 acc = before + running - sum;
            int e = -1;
            for (int j = 0; j < 32; j++) {
                if (acc + mine[j] >= wanted) {
                    e = lane * 32 + j;
                    break;
                }
                acc += mine[j];
            }
            if (e < 0) {  // reached nowhere: the last bucket, and the sum before it
                e = 1023;
                acc -= mine[31];
            }
            edge = e;
            mass_before = acc;
        }
    }
    __syncthreads();
    before = mass_before;
    return edge;
}

// A row's pick (`p`, PICK_FLOATS values), logits and scratch, as a kernel's block sees them.
#define PICK_ROW                                                      \
    const float* p = picks + (size_t)blockIdx.x * PICK_FLOATS;        \
    const int mode = (int)p[0];                                       \
    const float* row = x + (size_t)blockIdx.x * vocab;                \
    PickScratch* s = (PickScratch*)scratch + blockIdx.x;              \
    const int chunks = (vocab + chunk - 1) / chunk, tid = threadIdx.x;
#define CHUNK_IDS(c)                                                  \
    const int chunk_start = blockIdx.y * chunk, chunk_end = min(chunk_start + chunk, vocab); \
    for (int c = chunk_start + tid; c < chunk_end; c += blockDim.x)

// The row's best logit, from pick_max's chunks; every thread gets it.
__device__ float row_best(const PickScratch* s, int chunks) {
    float m = __int_as_float(0xff800000);
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) m = fmaxf(m, s->chunk_max[c]);
    return block_max(m);
}

// Adds `q` to bucket `b` of a shared histogram through a one-bucket cache per thread: where the
// logits are flat, most of a row lands in a few buckets, whose atomics would queue.
struct CachedAdd {
    u64* hist;
    int bucket = -1;
    u64 run = 0;
    __device__ void add(int b, u64 q) {
        if (b != bucket) {
            if (run) atomicAdd(&hist[bucket], run);
            bucket = b;
            run = 0;
        }
        run += q;
    }
    __device__ void flush() {
        if (run) atomicAdd(&hist[bucket], run);
    }
};

// A shared histogram zeroed (every thread of the block calls it).
__device__ void zero_hist(u64* hist) {
    for (int b = threadIdx.x; b < 1024; b += blockDim.x) hist[b] = 0;
    __syncthreads();
}

// A shared histogram added into the row's `global` one.
__device__ void add_hist(const u64* hist, u64* global) {
    __syncthreads();
    for (int b = threadIdx.x; b < 1024; b += blockDim.x)
        if (hist[b]) atomicAdd(&global[b], hist[b]);
}

// Top-p's mass wanted (of the row's total in the coarse histogram), and the group where it is
// reached, with the mass before that group in `before`.
__device__ int top_p_group(const PickScratch* s, float top_p, u64& wanted, u64& before) {
    u64 mine = 0;
    for (int b = threadIdx.x; b < 1024; b += blockDim.x) mine += s->coarse[b];
    wanted = (u64)((double)block_sum_u64(mine) * (double)top_p);
    before = 0;
    return crossing(s->coarse, wanted, before);
}

// Pass 1, grid rows x chunks: each chunk's largest logit and its index; the row's histograms
// zeroed for the passes after it.
extern "C" __global__ void pick_max(const float* x, int vocab, int chunk, const float* picks, u64* scratch) {
    PICK_ROW
    if (mode == PICK_NONE) return;
    float v = __int_as_float(0xff800000);
    int i = 0x7fffffff;
    CHUNK_IDS(c) if (row[c] > v) {
        v = row[c];
        i = c;
    }
    block_argmax(v, i);
    if (tid == 0) {
        s->chunk_max[blockIdx.y] = v;
        s->chunk_arg[blockIdx.y] = i;
    }
    if (mode == PICK_DRAW && p[4] < 1.f)
        for (int b = blockIdx.y * blockDim.x + tid; b < 1024; b += gridDim.y * blockDim.x)
            s->coarse[b] = s->fine[b] = 0;
    (void)chunks;
}

// Pass 2 (top-p rows), rows x chunks: the coarse histogram, by group below the best logit.
extern "C" __global__ void pick_coarse(const float* x, int vocab, int chunk, const float* picks, u64* scratch) {
    PICK_ROW
    if (mode != PICK_DRAW || !(p[4] < 1.f)) return;
    __shared__ u64 hist[1024];
    const float best = row_best(s, chunks);
    zero_hist(hist);
    CachedAdd h{hist};
    CHUNK_IDS(c) {
        const u64 q = fixed_prob(row[c], best);
        if (q) h.add(fine_bucket(best, row[c]) >> 10, q);
    }
    h.flush();
    add_hist(hist, s->coarse);
}

// Pass 3 (top-p rows), rows x chunks: the fine histogram of the group where top-p is reached.
extern "C" __global__ void pick_fine(const float* x, int vocab, int chunk, const float* picks, u64* scratch) {
    PICK_ROW
    if (mode != PICK_DRAW || !(p[4] < 1.f)) return;
    __shared__ u64 hist[1024];
    const float best = row_best(s, chunks);
    u64 wanted, before;
    const int group = top_p_group(s, p[4], wanted, before);
    zero_hist(hist);
    CachedAdd h{hist};
    CHUNK_IDS(c) {
        const int f = fine_bucket(best, row[c]);
        if ((f >> 10) == group) {
            const u64 q = fixed_prob(row[c], best);
            if (q) h.add(f & 1023, q);
        }
    }
    h.flush();
    add_hist(hist, s->fine);
}

// Pass 4 (top-p rows), rows x chunks: the lowest logit of the bucket where top-p is reached.
extern "C" __global__ void pick_low(const float* x, int vocab, int chunk, const float* picks, u64* scratch) {
    PICK_ROW
    if (mode != PICK_DRAW || !(p[4] < 1.f)) return;
    const float best = row_best(s, chunks);
    u64 wanted, before;
    const int group = top_p_group(s, p[4], wanted, before);
    const int cut = group * 1024 + crossing(s->fine, wanted, before);
    float lowest = __int_as_float(0x7f800000);
    CHUNK_IDS(c) if (fine_bucket(best, row[c]) == cut && fixed_prob(row[c], best) != 0) lowest = fminf(lowest, row[c]);
    lowest = -block_max(-lowest);
    if (tid == 0) s->chunk_low[blockIdx.y] = lowest;
}

// How far below the best logit a draw keeps ids (min-p's gap, and top-p's from pick_low).
__device__ float draw_gap(const PickScratch* s, const float* p, int chunks, float best) {
    const float min_gap = p[3];
    if (!(p[4] < 1.f)) return min_gap;
    float lowest = __int_as_float(0x7f800000);
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) lowest = fminf(lowest, s->chunk_low[c]);
    lowest = -block_max(-lowest);
    const float top_p_gap = lowest < __int_as_float(0x7f800000) ? __fsub_rn(lowest, best) : __int_as_float(0xff800000);
    return fmaxf(min_gap, top_p_gap);
}

#define WEIGHT(l) (__fsub_rn((l), best) >= gap ? exp_nonpositive(__fmul_rn(__fsub_rn((l), best), inv_t)) : 0.f)

// Pass 5 (draws), rows x (blocks of ids / (blockDim / 8)): each DRAW_BLOCK ids' summed weight
// and last id with weight. Groups of eight threads sum one block of ids each, lane j the ids
// j, j + 8, ... of it, then the group's first thread adds the eight lanes in order: the host's
// sums, rounded alike.
extern "C" __global__ void pick_weights(const float* x, int vocab, int chunk, const float* picks, u64* scratch) {
    PICK_ROW
    if (mode != PICK_DRAW) return;
    const float best = row_best(s, chunks), gap = draw_gap(s, p, chunks, best), inv_t = p[2];
    const int blocks = (vocab + DRAW_BLOCK - 1) / DRAW_BLOCK, lane = tid % 8;
    const int b = blockIdx.y * (blockDim.x / 8) + tid / 8;
    float sum = 0.f;
    int last = -1;
    const int start = b * DRAW_BLOCK, end = min(start + DRAW_BLOCK, vocab);
    for (int c = start + lane; c < end; c += 8) {
        float w = WEIGHT(row[c]);
        sum = __fadd_rn(sum, w);
        if (w > 0.f) last = c;
    }
    // Lanes 1..7 of the group to its lane 0, in order (all 32 threads of the warp shuffle).
    float total = sum;
    for (int j = 1; j < 8; j++) {
        float t = __shfl_sync(0xffffffffu, sum, (tid % 32) - lane + j);
        if (lane == 0) total = __fadd_rn(total, t);
    }
    for (int o = 1; o < 8; o <<= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
    if (lane == 0 && b < blocks) {
        s->block_weight[b] = total;
        s->block_last[b] = last;
    }
}

// Pass 6, one block per row: ids[r] = the row's pick. PICK_ARGMAX: the most likely, the first
// where several tie, as llmr_sampling::argmax picks it (NaN never wins; a row with nothing above
// -inf gives 0). PICK_DRAW, with (u, 1/temperature, min-p's logit gap, top-p): the id
// llmr_sampling::Draw::choose draws, by the host's walk: the block of ids, then the id in it.
// PICK_NONE: -1 (the host reads the row).
extern "C" __global__ void pick_choose(const float* x, int vocab, int chunk, const float* picks, u64* scratch,
                                       int* ids) {
    PICK_ROW
    if (mode == PICK_ARGMAX) {
        float v = __int_as_float(0xff800000);
        int i = 0x7fffffff;
        for (int c = tid; c < chunks; c += blockDim.x) keep_larger(v, i, s->chunk_max[c], s->chunk_arg[c]);
        block_argmax(v, i);
        if (tid == 0) ids[blockIdx.x] = v > __int_as_float(0xff800000) ? i : 0;
        return;
    }
    if (mode != PICK_DRAW) {
        if (tid == 0) ids[blockIdx.x] = -1;
        return;
    }
    const float best = row_best(s, chunks), gap = draw_gap(s, p, chunks, best), inv_t = p[2];
    const int blocks = (vocab + DRAW_BLOCK - 1) / DRAW_BLOCK;
    __shared__ float weight[DRAW_BLOCKS];
    __shared__ float block_w[DRAW_BLOCK];
    __shared__ int found, last_kept;
    __shared__ float target;
    for (int b = tid; b < blocks; b += blockDim.x) weight[b] = s->block_weight[b];
    __syncthreads();
    // The walk over blocks; rounding that leaves the sums a hair short of the target gives the
    // last id with weight.
    if (tid == 0) {
        float total = 0.f;
        for (int b = 0; b < blocks; b++) total = __fadd_rn(total, weight[b]);
        float t = __fmul_rn(p[1], total);
        int kept = 0, b = 0;
        for (; b < blocks; b++) {
            const float sum = weight[b];
            if (sum <= 0.f) continue;
            if (!(t >= sum)) break;
            t = __fsub_rn(t, sum);
            kept = s->block_last[b];
        }
        found = b;
        target = t;
        last_kept = kept;
    }
    __syncthreads();
    const int first = found;
    if (first == blocks) {
        if (tid == 0) ids[blockIdx.x] = last_kept;
        return;
    }
    // The block where the target falls: its weights at once, then walked in order.
    const int start = first * DRAW_BLOCK, end = min(start + DRAW_BLOCK, vocab);
    for (int c = start + tid; c < end; c += blockDim.x) block_w[c - start] = WEIGHT(row[c]);
    __syncthreads();
    if (tid != 0) return;
    float t = target;
    int kept = last_kept;
    for (int c = start; c < end; c++) {
        const float w = block_w[c - start];
        if (w > 0.f) {
            kept = c;
            if (t < w) {
                ids[blockIdx.x] = c;
                return;
            }
            t = __fsub_rn(t, w);
        }
    }
    // Rounding carried the target past the block's own weights: on through the blocks after it,
    // as the host walks (rare; one thread suffices).
    for (int b = first + 1; b < blocks; b++) {
        const float sum = weight[b];
        if (sum <= 0.f) continue;
        if (t >= sum) {
            t = __fsub_rn(t, sum);
            kept = s->block_last[b];
            continue;
        }
        const int bs = b * DRAW_BLOCK, be = min(bs + DRAW_BLOCK, vocab);
        for (int c = bs; c < be; c++) {
            const float w = WEIGHT(row[c]);
            if (w > 0.f) {
                kept = c;
                if (t < w) {
                    ids[blockIdx.x] = c;
                    return;
                }
                t = __fsub_rn(t, w);
            }
        }
    }
    ids[blockIdx.x] = kept;
}
#undef WEIGHT
