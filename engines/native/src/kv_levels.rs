//! The storage levels of one (block, layer) of the KV cache (spec 002): L0 f16, L1 int8, L2
//! int4, L3 evicted. Keys are quantized per channel over the block's 16 positions and values
//! per position (the KIVI layout: key outliers sit in fixed channels, value outliers in
//! tokens), with f16 scales. Bits per element, scales included, at head_dim 64: f16 16, int8
//! 8.625 (keys 9, values 8.25), int4 5.5 (keys 6, values 5: groups of 32 channels). Codes are
//! laid out in pairs for the integer kernels (`kernels/attention_integer.rs`): keys as channel
//! pairs over the rows, values as row pairs over the channels; an int4 byte holds two codes
//! that lie sixteen bytes apart in the int8 layout.
//!
//! Every array lives in the KV arena (`KvBuf`, `kv_arena.rs`), on huge pages where the kernel
//! gives them, not on the heap.
//!
//! A level change rewrites one block from its f16 form; going back up is not exact (the
//! values were rounded), so promotion needs the block's f16 copy or a recomputation, which
//! the caller owns.

use crate::kernels::widen_f16;
use crate::kv_arena::KvBuf;
use crate::kv_cache::BLOCK_TOKENS;
use crate::kv_recall::KeyIndex;
use half::f16;
use half::slice::HalfFloatSliceExt;

pub use llmr_kv_policy::Level;

/// Int4 value groups: this many channels of one position share a scale and minimum.
const V_GROUP: usize = 32;
// The int4 values' reader walks 16 channels of one group at a time.
const _: () = assert!(V_GROUP.is_multiple_of(16));

/// One layer's keys and values for one block; each array is laid out
/// `[kv_heads][BLOCK_TOKENS][head_dim]` (int8 codes: their pairs within a head), scales as
/// their comments say.
pub enum LayerBlock {
    F16 {
        k: KvBuf<f16>,
        v: KvBuf<f16>,
    },
    Int8 {
        /// `[kv_heads][head_dim / 2][BLOCK_TOKENS][2]`: channel pairs ([`key8_at`]).
        k: KvBuf<i8>,
        /// Per channel: `[kv_heads][head_dim]`; a key is `k * scale`.
        k_scale: KvBuf<f16>,
        /// `[kv_heads][BLOCK_TOKENS / 2][head_dim][2]`: row pairs ([`value8_at`]).
        v: KvBuf<i8>,
        /// Per position: `[kv_heads][BLOCK_TOKENS]`.
        v_scale: KvBuf<f16>,
    },
    Int4 {
        /// `[kv_heads][BLOCK_TOKENS * head_dim / 2]`, two codes a byte ([`key4_at`]).
        k: KvBuf<u8>,
        /// Per channel, `[kv_heads][head_dim]` each; a key is `min + code * scale`.
        k_scale: KvBuf<f16>,
        k_min: KvBuf<f16>,
        /// As `k`, [`value4_at`].
        v: KvBuf<u8>,
        /// Per group of `V_GROUP` channels and position: `[kv_heads][groups][BLOCK_TOKENS]`.
        v_scale: KvBuf<f16>,
        v_min: KvBuf<f16>,
    },
    /// No keys or values; with recall on, its keys at int4 as an index (`kv_recall.rs`).
    Evicted(Option<KeyIndex>),
    /// A sliding-window layer's block that no query of its sequence sees any more (it lies
    /// wholly before every window still to come): no storage. Not a level: it lowers nothing,
    /// and the block's other layers keep theirs (`KvPool::drop_out_of_window`).
    OutOfWindow,
}

impl LayerBlock {
    /// An f16 block of `kv_heads x head_dim`, zeroed.
    pub fn zeroed(kv_heads: usize, head_dim: usize) -> Self {
        let n = kv_heads * BLOCK_TOKENS * head_dim;
        LayerBlock::F16 { k: KvBuf::zeroed(n), v: KvBuf::zeroed(n) }
    }

    pub fn level(&self) -> Level {
        match self {
            LayerBlock::F16 { .. } => Level::F16,
            LayerBlock::Int8 { .. } => Level::Int8,
            LayerBlock::Int4 { .. } => Level::Int4,
            LayerBlock::Evicted(_) => Level::Evicted,
            LayerBlock::OutOfWindow => Level::F16,
        }
    }

    /// Bytes it holds (what the cache measures, not computes from a formula).
    pub fn bytes(&self) -> usize {
        match self {
            LayerBlock::F16 { k, v } => (k.len() + v.len()) * 2,
            LayerBlock::Int8 { k, k_scale, v, v_scale } => k.len() + v.len() + (k_scale.len() + v_scale.len()) * 2,
            LayerBlock::Int4 { k, k_scale, k_min, v, v_scale, v_min } => {
                k.len() + v.len() + (k_scale.len() + k_min.len() + v_scale.len() + v_min.len()) * 2
            }
            LayerBlock::Evicted(index) => index.as_ref().map_or(0, KeyIndex::bytes),
            LayerBlock::OutOfWindow => 0,
        }
    }

    /// Asks the CPU to bring the keys (or values) of KV head `kv`, codes and scales, into its
    /// cache: attention calls it for the next block while it works on this one. Codes and
    /// scales are separate chunks of the arena (`kv_arena.rs`), so the hardware prefetcher,
    /// which follows one address stream, would otherwise stall at the first lines of each.
    #[inline(always)]
    pub fn prefetch(&self, kv: usize, hd: usize, keys: bool) {
        use crate::kernels::prefetch;
        let head = BLOCK_TOKENS * hd; // codes of one KV head
        let span = |xs: *const u8, bits: usize| prefetch(xs.wrapping_add(kv * head * bits / 8), head * bits / 8);
        // Scales: keys have one per channel, values one per position (per group at int4).
        let scales = |xs: &[f16], per_head: usize| prefetch(xs[kv * per_head..].as_ptr().cast(), per_head * 2);
        match (self, keys) {
            (LayerBlock::F16 { k, .. }, true) => span(k.as_ptr().cast(), 16),
            (LayerBlock::F16 { v, .. }, false) => span(v.as_ptr().cast(), 16),
            (LayerBlock::Int8 { k, k_scale, .. }, true) => {
                span(k.as_ptr().cast(), 8);
                scales(k_scale, hd);
            }
            (LayerBlock::Int8 { v, v_scale, .. }, false) => {
                span(v.as_ptr().cast(), 8);
                scales(v_scale, BLOCK_TOKENS);
            }
            (LayerBlock::Int4 { k, k_scale, k_min, .. }, true) => {
                span(k.as_ptr(), 4);
                scales(k_scale, hd);
                scales(k_min, hd);
            }
            (LayerBlock::Int4 { v, v_scale, v_min, .. }, false) => {
                span(v.as_ptr(), 4);
                scales(v_scale, BLOCK_TOKENS * hd.div_ceil(V_GROUP));
                scales(v_min, BLOCK_TOKENS * hd.div_ceil(V_GROUP));
            }
            (LayerBlock::Evicted(_) | LayerBlock::OutOfWindow, _) => {}
        }
    }

    /// This block stored at `level`, a lower one than its own (`None` otherwise). From f16 the
    /// values are rounded once; from int8 to int4 they are rounded again from the int8 ones.
    pub fn quantized(&self, level: Level, kv_heads: usize, hd: usize) -> Option<LayerBlock> {
        if level <= self.level() {
            return None;
        }
        let (k, v) = match self {
            LayerBlock::F16 { k, v } => (k.to_f32_vec(), v.to_f32_vec()),
            LayerBlock::Evicted(_) | LayerBlock::OutOfWindow => return None,
            _ => {
                let n = kv_heads * BLOCK_TOKENS * hd;
                let (mut k, mut v) = (vec![0f32; n], vec![0f32; n]);
                for h in 0..kv_heads {
                    let at = h * BLOCK_TOKENS * hd;
                    self.keys_into(h, hd, (0, BLOCK_TOKENS), &mut k[at..at + BLOCK_TOKENS * hd]);
                    self.values_into(h, hd, (0, BLOCK_TOKENS), &mut v[at..at + BLOCK_TOKENS * hd]);
                }
                (k, v)
            }
        };
        match level {
            Level::F16 => None,
            Level::Evicted => Some(LayerBlock::Evicted(None)),
            Level::Int8 => {
                assert!(hd.is_multiple_of(2), "int8 codes are stored in pairs of channels");
                let (mut kq, mut k_scale) = (KvBuf::<i8>::zeroed(k.len()), KvBuf::<f16>::zeroed(kv_heads * hd));
                let (mut vq, mut v_scale) =
                    (KvBuf::<i8>::zeroed(v.len()), KvBuf::<f16>::zeroed(kv_heads * BLOCK_TOKENS));
                for h in 0..kv_heads {
                    let base = h * BLOCK_TOKENS * hd;
                    for c in 0..hd {
                        let max = (0..BLOCK_TOKENS).map(|t| k[base + t * hd + c].abs()).fold(0f32, f32::max);
                        let s = f16::from_f32(max / 127.0);
                        k_scale[h * hd + c] = s;
                        for t in 0..BLOCK_TOKENS {
                            kq[base + key8_at(t, c)] = q8(k[base + t * hd + c], s.to_f32());
                        }
                    }
                    for t in 0..BLOCK_TOKENS {
                        let row = &v[base + t * hd..][..hd];
                        let s = f16::from_f32(row.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0);
                        v_scale[h * BLOCK_TOKENS + t] = s;
                        for (c, x) in row.iter().enumerate() {
                            vq[base + value8_at(t, c, hd)] = q8(*x, s.to_f32());
                        }
                    }
                }
                Some(LayerBlock::Int8 { k: kq, k_scale, v: vq, v_scale })
            }
            Level::Int4 => {
                assert!(hd.is_multiple_of(2), "int4 codes are stored in pairs of channels");
                let groups = hd.div_ceil(V_GROUP);
                let mut kq = KvBuf::<u8>::zeroed(k.len() / 2);
                let (mut k_scale, mut k_min) =
                    (KvBuf::<f16>::zeroed(kv_heads * hd), KvBuf::<f16>::zeroed(kv_heads * hd));
                let mut vq = KvBuf::<u8>::zeroed(v.len() / 2);
                let gs = kv_heads * BLOCK_TOKENS * groups;
                let (mut v_scale, mut v_min) = (KvBuf::<f16>::zeroed(gs), KvBuf::<f16>::zeroed(gs));
                // A head's codes are made as rows (`codes[t * hd + c]`), in loops over contiguous
                // channels that vectorize, then packed into the layouts whole bytes at a time.
                let mut codes = vec![0u8; BLOCK_TOKENS * hd];
                let (mut lo, mut hi) = (vec![0f32; hd], vec![0f32; hd]);
                let (mut scale, mut min) = (vec![0f32; hd], vec![0f32; hd]);
                for h in 0..kv_heads {
                    let base = h * BLOCK_TOKENS * hd;
                    let head = base / 2..(base + BLOCK_TOKENS * hd) / 2;
                    let (keys, values) = (&k[base..][..BLOCK_TOKENS * hd], &v[base..][..BLOCK_TOKENS * hd]);
                    // Keys: a scale and minimum per channel, over the block's rows.
                    lo.fill(f32::MAX);
                    hi.fill(f32::MIN);
                    for row in keys.chunks_exact(hd) {
                        for ((l, u), &x) in lo.iter_mut().zip(&mut hi).zip(row) {
                            (*l, *u) = (l.min(x), u.max(x));
                        }
                    }
                    for c in 0..hd {
                        let (s, m) = scale_min4(lo[c], hi[c]);
                        (k_scale[h * hd + c], k_min[h * hd + c]) = (s, m);
                        (scale[c], min[c]) = (s.to_f32(), m.to_f32());
                    }
                    for (row, out) in keys.chunks_exact(hd).zip(codes.chunks_exact_mut(hd)) {
                        for (((o, &x), &s), &m) in out.iter_mut().zip(row).zip(&scale).zip(&min) {
                            *o = q4(x, s, m);
                        }
                    }
                    pack_keys4(&codes, hd, &mut kq[head.clone()]);
                    // Values: a scale and minimum per row and group of channels.
                    for (t, (row, out)) in values.chunks_exact(hd).zip(codes.chunks_exact_mut(hd)).enumerate() {
                        for (g, (row, out)) in row.chunks(V_GROUP).zip(out.chunks_mut(V_GROUP)).enumerate() {
                            let (s, m) = range4(row.iter().copied());
                            let at = (h * groups + g) * BLOCK_TOKENS + t;
                            (v_scale[at], v_min[at]) = (s, m);
                            let (s, m) = (s.to_f32(), m.to_f32());
                            for (o, &x) in out.iter_mut().zip(row) {
                                *o = q4(x, s, m);
                            }
                        }
                    }
                    pack_values4(&codes, hd, &mut vq[head]);
                }
                Some(LayerBlock::Int4 { k: kq, k_scale, k_min, v: vq, v_scale, v_min })
            }
        }
    }

    /// The keys (or values) of KV head `kv` where attention's kernels read them in place:
    /// f16 rows, or int8 or int4 codes with their scales; `None` for an evicted block.
    pub fn rows(&self, kv: usize, hd: usize, keys: bool) -> Option<BlockRows<'_>> {
        let head = kv * BLOCK_TOKENS * hd..(kv + 1) * BLOCK_TOKENS * hd;
        let nibbles = head.start / 2..head.end / 2;
        let channels = kv * hd..(kv + 1) * hd;
        let plain = |data| BlockRows { data, scale: None, min: None, group: hd };
        Some(match (self, keys) {
            (LayerBlock::F16 { k, .. }, true) => plain(RowData::F16(&k[head])),
            (LayerBlock::F16 { v, .. }, false) => plain(RowData::F16(&v[head])),
            (LayerBlock::Int8 { k, k_scale, .. }, true) => {
                BlockRows { data: RowData::I8(&k[head]), scale: Some(&k_scale[channels]), min: None, group: hd }
            }
            (LayerBlock::Int8 { v, v_scale, .. }, false) => BlockRows {
                data: RowData::I8(&v[head]),
                scale: Some(&v_scale[kv * BLOCK_TOKENS..][..BLOCK_TOKENS]),
                min: None,
                group: hd,
            },
            (LayerBlock::Int4 { k, k_scale, k_min, .. }, true) => BlockRows {
                data: RowData::U4(&k[nibbles]),
                scale: Some(&k_scale[channels.clone()]),
                min: Some(&k_min[channels]),
                group: hd,
            },
            (LayerBlock::Int4 { v, v_scale, v_min, .. }, false) => {
                let n = BLOCK_TOKENS * hd.div_ceil(V_GROUP);
                BlockRows {
                    data: RowData::U4(&v[nibbles]),
                    scale: Some(&v_scale[kv * n..][..n]),
                    min: Some(&v_min[kv * n..][..n]),
                    group: V_GROUP,
                }
            }
            (LayerBlock::Evicted(_) | LayerBlock::OutOfWindow, _) => return None,
        })
    }

    /// The keys of KV head `kv`, positions `from..to` of the block, into `out[from*hd..to*hd]`
    /// as f32; false when the block is evicted (nothing written).
    pub fn keys_into(&self, kv: usize, hd: usize, (from, to): (usize, usize), out: &mut [f32]) -> bool {
        self.key_rows(kv, hd, (from, to), &mut out[from * hd..to * hd])
    }

    /// As [`LayerBlock::keys_into`], into `out`'s first `(to - from) * hd` values.
    pub fn key_rows(&self, kv: usize, hd: usize, (from, to): (usize, usize), out: &mut [f32]) -> bool {
        let base = kv * BLOCK_TOKENS * hd;
        let out = &mut out[..(to - from) * hd];
        let range = base + from * hd..base + to * hd;
        match self {
            LayerBlock::F16 { k, .. } => widen_f16(&k[range], out),
            LayerBlock::Int8 { k, k_scale, .. } => {
                // The per-channel scales widened once for the block's rows.
                let mut scale = [0f32; MAX_HEAD_DIM];
                let scale = widen(&k_scale[kv * hd..][..hd], &mut scale);
                let codes = &k[base..][..BLOCK_TOKENS * hd];
                for (t, row) in (from..to).zip(out.chunks_exact_mut(hd)) {
                    for (c, (o, s)) in row.iter_mut().zip(scale).enumerate() {
                        *o = codes[key8_at(t, c)] as f32 * s;
                    }
                }
            }
            LayerBlock::Int4 { k, k_scale, k_min, .. } => int4_keys_into(k, k_scale, k_min, kv, hd, (from, to), out),
            LayerBlock::Evicted(_) | LayerBlock::OutOfWindow => return false,
        }
        true
    }

    /// As [`LayerBlock::keys_into`], for the values.
    pub fn values_into(&self, kv: usize, hd: usize, (from, to): (usize, usize), out: &mut [f32]) -> bool {
        self.value_rows(kv, hd, (from, to), &mut out[from * hd..to * hd])
    }

    /// As [`LayerBlock::key_rows`], for the values.
    pub fn value_rows(&self, kv: usize, hd: usize, (from, to): (usize, usize), out: &mut [f32]) -> bool {
        let base = kv * BLOCK_TOKENS * hd;
        let out = &mut out[..(to - from) * hd];
        let range = base + from * hd..base + to * hd;
        match self {
            LayerBlock::F16 { v, .. } => widen_f16(&v[range], out),
            LayerBlock::Int8 { v, v_scale, .. } => {
                let codes = &v[base..][..BLOCK_TOKENS * hd];
                for (t, row) in (from..to).zip(out.chunks_exact_mut(hd)) {
                    let s = v_scale[kv * BLOCK_TOKENS + t].to_f32();
                    for (c, o) in row.iter_mut().enumerate() {
                        *o = codes[value8_at(t, c, hd)] as f32 * s;
                    }
                }
            }
            LayerBlock::Int4 { v, v_scale, v_min, .. } => {
                let groups = hd.div_ceil(V_GROUP);
                let codes = &v[base / 2..][..BLOCK_TOKENS * hd / 2];
                // value4_at's layout walked a chunk of 16 channels at a time (one group's): a
                // byte every four holds channel i of the chunk's first half and channel i of
                // its second.
                for (t, row) in (from..to).zip(out.chunks_exact_mut(hd)) {
                    for (c0, o) in (0..).step_by(16).zip(row.chunks_mut(16)) {
                        let at = (kv * groups + c0 / V_GROUP) * BLOCK_TOKENS + t;
                        let (s, m) = (v_scale[at].to_f32(), v_min[at].to_f32());
                        let (lo, hi) = o.split_at_mut(o.len() / 2);
                        let first = (t / 4) * 2 * hd + c0 * 2 + t % 4;
                        debug_assert_eq!(value4_at(t, c0, hd), (first, false));
                        let bytes = codes[first..].iter().step_by(4);
                        for ((lo, hi), b) in lo.iter_mut().zip(hi).zip(bytes) {
                            *lo = m + (b & 0x0f) as f32 * s;
                            *hi = m + (b >> 4) as f32 * s;
                        }
                    }
                }
            }
            LayerBlock::Evicted(_) | LayerBlock::OutOfWindow => return false,
        }
        true
    }
}

/// One KV head's keys or values of a block as attention's kernels read them: rows of
/// `head_dim` codes or values, one per slot, and the scales (and minimums) that make codes
/// values. A key is `min[c] + code * scale[c]` per channel `c` (`head_dim` of each); a value is
/// `min + code * scale` with one pair per row and group of `group` channels (`[rows][groups]`;
/// int8 has one group of `head_dim` and no minimum). The kernels fold the scales into the
/// queries or the softmax weights, and the minimums into one term per head (or per group),
/// so that codes cost the arithmetic of f16 values and read fewer bytes.
#[derive(Clone, Copy)]
pub struct BlockRows<'a> {
    pub data: RowData<'a>,
    pub scale: Option<&'a [f16]>,
    pub min: Option<&'a [f16]>,
    /// Channels that share a value's scale and minimum.
    pub group: usize,
}

#[derive(Clone, Copy)]
pub enum RowData<'a> {
    /// A block widened to f32 (codes stay unscaled: exact).
    F32(&'a [f32]),
    F16(&'a [f16]),
    /// Int8 codes, in place, in pairs: keys' channel pairs ([`key8_at`]) or values' row pairs
    /// ([`value8_at`]); read only by the integer kernels.
    I8(&'a [i8]),
    /// Int4 codes, in place, two a byte ([`key4_at`], [`value4_at`]); read only by the integer
    /// kernels.
    U4(&'a [u8]),
}

impl BlockRows<'_> {
    /// The rows of `hd` values it holds.
    pub fn rows(&self, hd: usize) -> usize {
        match self.data {
            RowData::F32(x) => x.len() / hd,
            RowData::F16(x) => x.len() / hd,
            RowData::I8(x) => x.len() / hd,
            RowData::U4(x) => x.len() * 2 / hd,
        }
    }
}

/// Int4 keys (`k`, `k_scale`, `k_min` as in [`LayerBlock::Int4`]) of KV head `kv`, positions
/// `from..to`, widened into `out` (their rows only).
pub(crate) fn int4_keys_into(
    k: &[u8],
    k_scale: &[f16],
    k_min: &[f16],
    kv: usize,
    hd: usize,
    (from, to): (usize, usize),
    out: &mut [f32],
) {
    let (mut scale, mut min) = ([0f32; MAX_HEAD_DIM], [0f32; MAX_HEAD_DIM]);
    let scale = widen(&k_scale[kv * hd..][..hd], &mut scale);
    let min = widen(&k_min[kv * hd..][..hd], &mut min);
    let codes = &k[kv * BLOCK_TOKENS * hd / 2..][..BLOCK_TOKENS * hd / 2];
    // key4_at's layout walked a channel quad at a time: the row's bytes of a quad lie side by
    // side, its rows 8..16 in the high nibbles.
    let half = BLOCK_TOKENS / 2;
    for (t, row) in (from..to).zip(out.chunks_exact_mut(hd)) {
        let shift = if t >= half { 4 } else { 0 };
        for (quad, ((o, s), m)) in (0..).step_by(4).zip(row.chunks_mut(4).zip(scale.chunks(4)).zip(min.chunks(4))) {
            debug_assert_eq!(key4_at(t, quad, hd), (quad * half + (t % half) * o.len(), t >= half));
            let bytes = &codes[quad * half + (t % half) * o.len()..][..o.len()];
            for (((o, s), m), b) in o.iter_mut().zip(s).zip(m).zip(bytes) {
                *o = m + ((b >> shift) & 0x0f) as f32 * s;
            }
        }
    }
}

/// The largest head_dim the quantized readers take (Gemma 3's is 256).
const MAX_HEAD_DIM: usize = 512;

/// Where int8 key code (row `t`, channel `c`) lies in its KV head's block: channel pairs over
/// the rows, `[head_dim / 2][BLOCK_TOKENS][2]`, so that one pair multiply-add sums two channels
/// of one row and a register's lanes are eight rows.
pub(crate) fn key8_at(t: usize, c: usize) -> usize {
    ((c / 2) * BLOCK_TOKENS + t) * 2 + c % 2
}

/// Where int8 value code (row `t`, channel `c`) lies: row pairs over the channels,
/// `[BLOCK_TOKENS / 2][head_dim][2]`, so that one pair multiply-add sums two rows of one
/// channel and a register's lanes are eight channels.
pub(crate) fn value8_at(t: usize, c: usize, hd: usize) -> usize {
    ((t / 2) * hd + c) * 2 + t % 2
}

/// Where int4 key code (row `t`, channel `c`) lies in its KV head's block, as (byte, in the
/// high nibble): channel quads over the rows, 32 bytes a quad, row `t % 8`'s four channels in
/// bytes `(t % 8) * 4..+4`, rows 0..8 in the low nibbles and rows 8..16 in the high ones. One
/// 32-byte load, a mask and a shift then give two registers whose 32-bit lanes are one row's
/// four channels each: what a byte multiply-add sums (`kernels/attention_int4.rs`). A
/// head_dim that is not a multiple of 4 ends with a quad of two channels, two bytes a row.
pub(crate) fn key4_at(t: usize, c: usize, hd: usize) -> (usize, bool) {
    let (half, quad) = (BLOCK_TOKENS / 2, c - c % 4);
    let width = (hd - quad).min(4);
    (quad * half + (t % half) * width + c % 4, t >= half)
}

/// Where int4 value code (row `t`, channel `c`) lies: row quads over the channels, `2 *
/// head_dim` bytes a quad, in chunks of 16 channels (fewer at the end of a head_dim that is
/// not a multiple of 16) whose channels' four rows take four bytes each: the chunk's first
/// half of channels in the low nibbles, its second half in the high ones. A 32-bit lane of
/// the unpacked codes is then one channel's four rows.
pub(crate) fn value4_at(t: usize, c: usize, hd: usize) -> (usize, bool) {
    let c0 = c - c % 16;
    let half = (hd - c0).min(16) / 2;
    ((t / 4) * 2 * hd + c0 * 2 + (c - c0) % half * 4 + t % 4, c - c0 >= half)
}

/// `xs` as f32 in the front of `buf`.
fn widen<'a>(xs: &[f16], buf: &'a mut [f32; MAX_HEAD_DIM]) -> &'a [f32] {
    let out = &mut buf[..xs.len()];
    widen_f16(xs, out);
    out
}

fn q8(x: f32, scale: f32) -> i8 {
    if scale == 0.0 {
        0
    } else {
        round_half_away(x / scale).clamp(-127.0, 127.0) as i8
    }
}

/// `x.round()` (halves away from zero) without a call: the baseline x86-64 target has no
/// rounding instruction, and `roundf` calls were 15% of the samples of quantizing blocks in a
/// profile of prompts over an int4 cache. Exact: `x - trunc(x)` is exact in f32, and beyond
/// `i32`'s range (or for NaN) the clamps that follow give what `round` would have given them.
#[inline(always)]
fn round_half_away(x: f32) -> f32 {
    let t = x as i32 as f32;
    if (x - t).abs() >= 0.5 {
        t + x.signum()
    } else {
        t
    }
}

/// Scale and minimum (as stored, f16) of 4-bit codes covering `xs`.
fn range4(xs: impl Iterator<Item = f32>) -> (f16, f16) {
    let (lo, hi) = xs.fold((f32::MAX, f32::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    scale_min4(lo, hi)
}

/// Scale and minimum (as stored, f16) of 4-bit codes covering `lo..=hi`.
fn scale_min4(lo: f32, hi: f32) -> (f16, f16) {
    (f16::from_f32((hi - lo) / 15.0), f16::from_f32(lo))
}

/// One head's int4 key codes (`codes[t * hd + c]`, each 0..15) into [`key4_at`]'s layout: the
/// bytes of a channel quad and row `r` hold rows `r` and `r + 8`.
fn pack_keys4(codes: &[u8], hd: usize, out: &mut [u8]) {
    let half = BLOCK_TOKENS / 2;
    for quad in (0..hd).step_by(4) {
        let width = (hd - quad).min(4);
        for r in 0..half {
            debug_assert_eq!(key4_at(r, quad, hd), (quad * half + r * width, false));
            let (low, high) = (&codes[r * hd + quad..][..width], &codes[(r + half) * hd + quad..][..width]);
            for ((o, l), h) in out[quad * half + r * width..][..width].iter_mut().zip(low).zip(high) {
                *o = l | h << 4;
            }
        }
    }
}

/// One head's int4 value codes (as [`pack_keys4`]'s) into [`value4_at`]'s layout: a byte holds
/// channel `i` of a 16-channel chunk's first half and channel `i` of its second.
fn pack_values4(codes: &[u8], hd: usize, out: &mut [u8]) {
    for (t, row) in codes.chunks_exact(hd).enumerate() {
        for (c0, chunk) in (0..).step_by(16).zip(row.chunks(16)) {
            let (low, high) = chunk.split_at(chunk.len() / 2);
            let at = (t / 4) * 2 * hd + c0 * 2 + t % 4;
            debug_assert_eq!(value4_at(t, c0, hd), (at, false));
            for (i, (l, h)) in low.iter().zip(high).enumerate() {
                out[at + i * 4] = l | h << 4;
            }
        }
    }
}

/// The 4-bit code of `x` under a scale and minimum (as stored, widened once by the caller):
/// `round((x - min) / scale)` within 0..=15, 0 for a zero scale or NaN. Without branches or
/// saturating casts, so that a row of them vectorizes: the quotient is first held to -1..=16
/// (NaN to -1), which rounds to what the clamp after rounding would give.
#[inline(always)]
fn q4(x: f32, scale: f32, min: f32) -> u8 {
    #[allow(clippy::manual_clamp)] // clamp would keep NaN
    let y = ((x - min) / scale).max(-1.0).min(16.0);
    // SAFETY: y is a number within -1..=16 (max replaces NaN).
    let t = unsafe { y.to_int_unchecked::<i32>() };
    let r = t + (((y - t as f32).abs() >= 0.5) as i32) * if y < 0.0 { -1 } else { 1 };
    if scale == 0.0 {
        0
    } else {
        r.clamp(0, 15) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `code` put at a layout's place.
    fn put4(packed: &mut [u8], (byte, high): (usize, bool), code: u8) {
        let b = &mut packed[byte];
        *b = if high { (*b & 0x0f) | (code << 4) } else { (*b & 0xf0) | code };
    }

    /// The 4-bit code as `f32::round` and a clamp make it (q4 without branches is checked
    /// against it).
    fn rounded4(x: f32, scale: f32, min: f32) -> u8 {
        if scale == 0.0 {
            0
        } else {
            ((x - min) / scale).round().clamp(0.0, 15.0) as u8
        }
    }

    /// The code at a layout's place (`key4_at`, `value4_at`).
    fn get4(packed: &[u8], (byte, high): (usize, bool)) -> u8 {
        if high {
            packed[byte] >> 4
        } else {
            packed[byte] & 0x0f
        }
    }

    /// A block whose channel 3 of every key is an outlier (as real keys have).
    fn block(kv_heads: usize, hd: usize) -> (LayerBlock, Vec<f32>, Vec<f32>) {
        let n = kv_heads * BLOCK_TOKENS * hd;
        let k: Vec<f32> =
            (0..n).map(|i| ((i * 7) as f32 * 0.37).sin() * if i % hd == 3 { 20.0 } else { 1.0 }).collect();
        let v: Vec<f32> = (0..n).map(|i| ((i * 11) as f32 * 0.13).cos()).collect();
        let b = LayerBlock::F16 {
            k: k.iter().map(|&x| f16::from_f32(x)).collect(),
            v: v.iter().map(|&x| f16::from_f32(x)).collect(),
        };
        (b, k, v)
    }

    fn worst(a: &[f32], b: &[f32], skip_channel: Option<(usize, usize)>) -> f32 {
        a.iter()
            .zip(b)
            .enumerate()
            .filter(|(i, _)| skip_channel.is_none_or(|(c, hd)| i % hd != c))
            .fold(0f32, |m, (_, (x, y))| m.max((x - y).abs()))
    }

    #[test]
    fn each_level_reads_back_within_its_step_and_takes_fewer_bytes() {
        let (kv_heads, hd) = (2, 64);
        let (f16b, k, v) = block(kv_heads, hd);
        let mut last_bytes = f16b.bytes();
        // Worst error on the ordinary channels (|x| <= 1): half a step of each level's scale.
        for (level, tolerance) in [(Level::Int8, 1.0 / 127.0), (Level::Int4, 2.0 / 15.0)] {
            let q = f16b.quantized(level, kv_heads, hd).unwrap();
            assert_eq!(q.level(), level);
            assert!(q.bytes() < last_bytes, "{level:?}: {} bytes", q.bytes());
            last_bytes = q.bytes();
            for h in 0..kv_heads {
                let (mut kb, mut vb) = (vec![0f32; BLOCK_TOKENS * hd], vec![0f32; BLOCK_TOKENS * hd]);
                assert!(q.keys_into(h, hd, (0, BLOCK_TOKENS), &mut kb));
                assert!(q.values_into(h, hd, (0, BLOCK_TOKENS), &mut vb));
                let base = h * BLOCK_TOKENS * hd;
                let (kw, vw) = (&k[base..base + BLOCK_TOKENS * hd], &v[base..base + BLOCK_TOKENS * hd]);
                // Per-channel key scales: the outlier channel does not widen the others' steps.
                assert!(worst(&kb, kw, Some((3, hd))) <= tolerance * 1.1, "{level:?} keys");
                assert!(worst(&vb, vw, None) <= tolerance * 1.1, "{level:?} values");
                // A sub-range reads the same values as the whole block.
                let mut part = vec![0f32; BLOCK_TOKENS * hd];
                q.keys_into(h, hd, (5, 9), &mut part);
                assert_eq!(&part[5 * hd..9 * hd], &kb[5 * hd..9 * hd]);
            }
        }
        let bytes = |l| {
            f16b.quantized(l, kv_heads, hd).unwrap().bytes() as f64 * 8.0 / (2 * kv_heads * BLOCK_TOKENS * hd) as f64
        };
        assert_eq!((bytes(Level::Int8), bytes(Level::Int4)), (8.625, 5.5));
        let evicted = f16b.quantized(Level::Evicted, kv_heads, hd).unwrap();
        assert_eq!(evicted.bytes(), 0);
        assert!(!evicted.keys_into(0, hd, (0, 16), &mut vec![0f32; BLOCK_TOKENS * hd]));
        // Levels only go down.
        assert!(evicted.quantized(Level::Int8, kv_heads, hd).is_none());
        assert!(f16b.quantized(Level::F16, kv_heads, hd).is_none());
        let int4 = f16b.quantized(Level::Int4, kv_heads, hd).unwrap();
        assert!(int4.quantized(Level::Int8, kv_heads, hd).is_none());
        // int8 to int4 rounds the int8 values again: within one int4 step plus one int8 step.
        let twice = f16b.quantized(Level::Int8, kv_heads, hd).unwrap().quantized(Level::Int4, kv_heads, hd).unwrap();
        assert_eq!((twice.level(), twice.bytes()), (Level::Int4, int4.bytes()));
        let (mut a, mut b) = (vec![0f32; BLOCK_TOKENS * hd], vec![0f32; BLOCK_TOKENS * hd]);
        twice.values_into(1, hd, (0, BLOCK_TOKENS), &mut a);
        int4.values_into(1, hd, (0, BLOCK_TOKENS), &mut b);
        assert!(worst(&a, &b, None) <= 2.0 / 15.0 + 1.0 / 127.0);
    }

    /// The codes' rounding is `f32::round`'s: halves, values a step either side of them,
    /// signs, zeros, values past `i32`, infinities and NaN, as the clamps and casts see them.
    #[test]
    fn quantizing_rounds_as_f32_round_does() {
        let mut xs =
            vec![0.0f32, -0.0, 1e10, -1e10, 3e9, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MIN_POSITIVE];
        for i in -300..300 {
            let half = i as f32 + 0.5;
            xs.extend([half, half.next_up(), half.next_down(), i as f32, i as f32 * 0.37]);
        }
        for x in xs {
            let (got, want) = (round_half_away(x), x.round());
            assert!(got == want || (got.is_finite() && !want.is_finite()) || x.is_nan() || x.abs() > 2e9, "{x}");
            for bound in [(-127.0, 127.0), (0.0, 15.0)] {
                let cast = |r: f32| r.clamp(bound.0, bound.1) as i8;
                assert_eq!(cast(got), cast(want), "{x} within {bound:?}");
            }
            // int4's codes, as quotients of a scale and minimum, zero and infinite scales too.
            for (scale, min) in [(1.0, 0.0), (0.37, -2.5), (0.0, 0.0), (f32::INFINITY, 0.0), (1e-30, 1.0)] {
                assert_eq!(q4(x, scale, min), rounded4(x, scale, min), "{x} at scale {scale}, minimum {min}");
            }
        }
    }

    /// The int4 readers, which walk the layouts a quad or a chunk at a time, read every code
    /// where `key4_at` and `value4_at` put it, to the bit, for head sizes that end in partial
    /// quads and chunks, and for any range of rows.
    #[test]
    fn int4_readers_read_each_code_where_the_layout_puts_it() {
        for hd in [2, 6, 10, 24, 64, 72, 256] {
            let kv_heads = 2;
            let n = kv_heads * BLOCK_TOKENS * hd;
            let x = |i: usize, f: f32| f16::from_f32(((i * 13) as f32 * f).sin() * (1.0 + (i % 5) as f32));
            let b =
                LayerBlock::F16 { k: (0..n).map(|i| x(i, 0.31)).collect(), v: (0..n).map(|i| x(i, 0.17)).collect() };
            let q = b.quantized(Level::Int4, kv_heads, hd).unwrap();
            let LayerBlock::Int4 { k, k_scale, k_min, v, v_scale, v_min } = &q else { unreachable!() };
            let groups = hd.div_ceil(V_GROUP);
            for kv in 0..kv_heads {
                let (kc, vc) = (&k[kv * BLOCK_TOKENS * hd / 2..], &v[kv * BLOCK_TOKENS * hd / 2..]);
                for (from, to) in [(0, BLOCK_TOKENS), (3, 4), (7, 9), (15, 16)] {
                    let (mut keys, mut values) = (vec![0f32; (to - from) * hd], vec![0f32; (to - from) * hd]);
                    assert!(q.key_rows(kv, hd, (from, to), &mut keys) && q.value_rows(kv, hd, (from, to), &mut values));
                    for (t, c) in (from..to).flat_map(|t| (0..hd).map(move |c| (t, c))) {
                        let (s, m) = (k_scale[kv * hd + c].to_f32(), k_min[kv * hd + c].to_f32());
                        let want = m + get4(kc, key4_at(t, c, hd)) as f32 * s;
                        assert_eq!(keys[(t - from) * hd + c].to_bits(), want.to_bits(), "hd {hd} key ({t}, {c})");
                        let at = (kv * groups + c / V_GROUP) * BLOCK_TOKENS + t;
                        let (s, m) = (v_scale[at].to_f32(), v_min[at].to_f32());
                        let want = m + get4(vc, value4_at(t, c, hd)) as f32 * s;
                        assert_eq!(values[(t - from) * hd + c].to_bits(), want.to_bits(), "hd {hd} value ({t}, {c})");
                    }
                }
            }
        }
    }

    /// Quantizing to int4, which makes each head's codes as rows and packs them whole bytes at
    /// a time, gives the block a code at a time through the layouts would: the same codes,
    /// scales and minimums, bit for bit.
    #[test]
    fn int4_blocks_hold_the_codes_the_layouts_place_one_at_a_time() {
        for hd in [2, 6, 10, 24, 64, 72, 256] {
            let kv_heads = 2;
            let n = kv_heads * BLOCK_TOKENS * hd;
            let x = |i: usize, f: f32| ((i * 13) as f32 * f).sin() * (1.0 + (i % 7) as f32);
            let (k, v): (Vec<f32>, Vec<f32>) =
                ((0..n).map(|i| x(i, 0.29)).collect(), (0..n).map(|i| x(i, 0.11)).collect());
            let b = LayerBlock::F16 {
                k: k.iter().map(|&x| f16::from_f32(x)).collect(),
                v: v.iter().map(|&x| f16::from_f32(x)).collect(),
            };
            let LayerBlock::F16 { k: k16, v: v16 } = &b else { unreachable!() };
            let (k, v) = (k16.to_f32_vec(), v16.to_f32_vec());
            let Some(LayerBlock::Int4 { k: kq, k_scale, k_min, v: vq, v_scale, v_min }) =
                b.quantized(Level::Int4, kv_heads, hd)
            else {
                unreachable!()
            };
            let groups = hd.div_ceil(V_GROUP);
            let (mut want_k, mut want_v) = (vec![0u8; n / 2], vec![0u8; n / 2]);
            for h in 0..kv_heads {
                let base = h * BLOCK_TOKENS * hd;
                let (kh, vh) = (
                    &mut want_k[base / 2..][..BLOCK_TOKENS * hd / 2],
                    &mut want_v[base / 2..][..BLOCK_TOKENS * hd / 2],
                );
                for c in 0..hd {
                    let (s, m) = range4((0..BLOCK_TOKENS).map(|t| k[base + t * hd + c]));
                    assert_eq!((k_scale[h * hd + c], k_min[h * hd + c]), (s, m), "hd {hd}: key scale of channel {c}");
                    for t in 0..BLOCK_TOKENS {
                        put4(kh, key4_at(t, c, hd), rounded4(k[base + t * hd + c], s.to_f32(), m.to_f32()));
                    }
                }
                for t in 0..BLOCK_TOKENS {
                    for g in 0..groups {
                        let (c0, c1) = (g * V_GROUP, ((g + 1) * V_GROUP).min(hd));
                        let (s, m) = range4(v[base + t * hd + c0..base + t * hd + c1].iter().copied());
                        let at = (h * groups + g) * BLOCK_TOKENS + t;
                        assert_eq!((v_scale[at], v_min[at]), (s, m), "hd {hd}: value scale of row {t}, group {g}");
                        for c in c0..c1 {
                            put4(vh, value4_at(t, c, hd), rounded4(v[base + t * hd + c], s.to_f32(), m.to_f32()));
                        }
                    }
                }
            }
            assert!(kq[..] == want_k[..], "hd {hd}: key codes");
            assert!(vq[..] == want_v[..], "hd {hd}: value codes");
        }
    }

    #[test]
    fn int4_layouts_give_every_code_its_own_nibble_of_its_head() {
        for hd in [2, 6, 8, 10, 24, 64, 72, 256] {
            for (name, at) in [
                ("keys", &(|t, c| key4_at(t, c, hd)) as &dyn Fn(usize, usize) -> (usize, bool)),
                ("values", &|t, c| value4_at(t, c, hd)),
            ] {
                let mut seen = vec![[false; 2]; BLOCK_TOKENS * hd / 2];
                for t in 0..BLOCK_TOKENS {
                    for c in 0..hd {
                        let (byte, high) = at(t, c);
                        assert!(!std::mem::replace(&mut seen[byte][high as usize], true), "{name} hd {hd}: ({t}, {c})");
                    }
                }
            }
        }
    }
}
