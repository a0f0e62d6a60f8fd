//! Causal attention of a batch's queries over their sequences' block tables, with grouped
//! query heads (`heads / kv_heads` query heads read one key/value head). A task is a tile of up
//! to 16 consecutive queries of one sequence (a prompt chunk; a decode token is a tile alone)
//! and one key/value head: it widens each block's keys or values to f32 once for the whole
//! tile, except that a decoding token's tile reads f16 blocks in place, and int8 and int4
//! blocks are always read in place by the integer kernels. An evicted block's positions weigh
//! nothing, unless it has a key index and a query would weigh it: then it is read back from its
//! f16 copy for the step (`kv_recall.rs`). The task body is compiled a second time for AVX2 +
//! FMA, chosen at run time. In a step whose projections take bf16 products at prompt size
//! (chunks of 64 rows and more, see `kernels/linear.rs`), a tile that sees no evicted block
//! takes its two products in bf16 too, on AMX tiles or, where the CPU has none, on AVX-512
//! BF16 vectors: the keys exact and the values rounded to bf16, int8 and int4 blocks widened
//! from their codes once a layer for all the tiles of their sequence
//! (`kernels/attention_tiles.rs`).

use crate::kernels::panel::Out;
use crate::kernels::{simd, widen_f16, Bf16Unit};
use crate::kv_cache::{BlockId, BlockTable, KvPool, BLOCK_TOKENS};
use crate::kv_levels::{BlockRows, LayerBlock, RowData};
use rayon::prelude::*;

/// Where one query of the batch attends.
pub struct QueryPos<'a> {
    pub table: &'a BlockTable,
    /// The query's position: it sees positions `first..=pos`.
    pub pos: usize,
    /// The first position it sees: 0, or `pos + 1 - window` in a sliding-window layer.
    pub first: usize,
}

pub struct AttentionShape<'a> {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies q·k (1/sqrt(head_dim) unless the architecture says otherwise).
    pub scale: f32,
    /// gpt-oss's learned sinks: one logit per query head that joins the softmax's denominator
    /// and has no value, so a head can attend to nothing.
    pub sinks: Option<&'a [f32]>,
}

/// Consecutive queries of one sequence (a prompt chunk) one task takes together, so that each
/// block of keys and values is widened to f32 once for all of them rather than once per query.
const QUERY_TILE: usize = 16;

/// Per-task buffers: one block of widened keys or values, the scores of the tile's queries,
/// queries or weights with int8 scales folded in, and the recall's probe.
#[derive(Default)]
struct TaskScratch {
    block: Vec<f32>,
    scores: Vec<f32>,
    fold: Vec<f32>,
    /// The scores of a tile with evicted blocks, as weights: what recall reads (`kv_recall.rs`).
    probe: Vec<f32>,
    #[cfg(target_arch = "x86_64")]
    tiles: crate::kernels::attention_tiles::Scratch,
}

/// `q`: `tokens x heads x head_dim`; writes `out` of the same shape. `prompt`: where the
/// step's projections took bf16 products at prompt size, the unit its query tiles take theirs
/// on ([`crate::kernels::linear::Linear::prompt_products`]); `None`: the f32 kernels.
pub fn attend(
    pool: &KvPool,
    layer: usize,
    shape: &AttentionShape<'_>,
    queries: &[QueryPos<'_>],
    q: &[f32],
    out: &mut [f32],
    prompt: Option<Bf16Unit>,
) {
    assert!(q.len() == queries.len() * shape.heads * shape.head_dim && out.len() == q.len());
    // Tiles: runs of at most QUERY_TILE consecutive queries on the same block table.
    let mut tiles: Vec<(usize, usize)> = Vec::new();
    for t in 0..queries.len() {
        match tiles.last_mut() {
            Some((t0, t1)) if *t1 - *t0 < QUERY_TILE && std::ptr::eq(queries[*t0].table, queries[t].table) => *t1 += 1,
            _ => tiles.push((t, t + 1)),
        }
    }
    let out = Out(out.as_mut_ptr());
    let simd = simd();
    #[cfg(target_arch = "x86_64")]
    let unit = {
        use crate::kernels::amx_bf16::STEP;
        prompt.filter(|unit| simd && shape.head_dim.is_multiple_of(STEP) && unit.available())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = prompt;
    // The keys and values of each run of tiles on one block table, made for the tiles'
    // products once per KV head (the calling thread keeps the buffers from layer to layer).
    #[cfg(target_arch = "x86_64")]
    thread_local!(static PACKED: std::cell::RefCell<Vec<PackedRun>> = std::cell::RefCell::default());
    #[cfg(target_arch = "x86_64")]
    let (packed, run_of) = {
        let mut packed = PACKED.take();
        // On vectors, a sequence's tiles take the products only where it has a prompt chunk's
        // queries in the step (on tiles, the step's projections already did).
        let min_queries = if unit == Some(Bf16Unit::Vectors) { VECTORS_MIN_QUERIES } else { 1 };
        // SAFETY: `unit` is some only where the CPU has it (so AVX-512 BF16) and the head
        // dimension is a multiple of STEP.
        let run_of = if unit.is_some() {
            unsafe { pack_runs(pool, layer, shape, queries, &tiles, min_queries, &mut packed) }
        } else {
            Vec::new()
        };
        (packed, run_of)
    };
    // Each thread's buffers, kept from task to task and call to call.
    thread_local!(static SCRATCH: std::cell::RefCell<TaskScratch> = std::cell::RefCell::default());
    (0..tiles.len() * shape.kv_heads).into_par_iter().for_each(|task| {
        let (t, kv) = (task / shape.kv_heads, task % shape.kv_heads);
        let tile = tiles[t];
        let job = Tile { pool, layer, shape, queries: &queries[tile.0..tile.1], first_token: tile.0, kv, q, out };
        // Taken, not borrowed: a task never waits on others, but if one ever did, a task
        // stolen meanwhile would start with buffers of its own instead of panicking.
        let mut scratch = SCRATCH.take();
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: simd() found AVX2, FMA and F16C on this CPU, and `unit` its unit too
            // (its keys packed for every tile above).
            let run = unit.zip(run_of.get(t).copied().flatten());
            let on_unit =
                |(unit, run)| unsafe { job.run_tiles(unit, &packed[run * shape.kv_heads + kv], &mut scratch) };
            if !run.is_some_and(on_unit) {
                // SAFETY: as above.
                unsafe { job.run_avx2(&mut scratch) };
            }
            return SCRATCH.set(scratch);
        }
        let _ = simd;
        job.run::<false>(&mut scratch);
        SCRATCH.set(scratch);
    });
    // Kept for the next layer up to a bound: a step with many long sequences packs tens of
    // MiB, which should not stay held until the pool's threads exit.
    #[cfg(target_arch = "x86_64")]
    if packed.iter().map(PackedRun::bytes).sum::<usize>() <= KEEP_PACKED_BYTES {
        PACKED.set(packed);
    }
}

/// The queries one sequence has in a step from which its tiles take bf16 products on vectors
/// (`Bf16Unit::Vectors`): a prompt chunk's, as many as the projections' prompt size, so that
/// decoding tokens and drafts keep the f32 kernels' bits whatever else the step holds, as the
/// projections keep each row's bits on those CPUs.
#[cfg(target_arch = "x86_64")]
const VECTORS_MIN_QUERIES: usize = 64;

/// The most packed keys and values `attend` keeps from call to call: a 4,096-position chunk's
/// (8 MiB for Gemma 3's one KV head of 256 channels, 6 MiB for SmolLM2's three of 64).
#[cfg(target_arch = "x86_64")]
const KEEP_PACKED_BYTES: usize = 16 << 20;

/// A sequence's keys and values of one KV head from position `first` (a block's start) on,
/// made for a step's bf16 tile products: the keys packed (`attention_tiles::pack_keys`), the
/// values as bf16 rows. Int8 and int4 blocks are widened from their codes; an evicted block's
/// positions are zeros, which no tile reads (a tile that sees one takes the f32 path and its recall).
#[cfg(target_arch = "x86_64")]
#[derive(Default)]
struct PackedRun {
    first: usize,
    keys: crate::kernels::amx_bf16::Inputs,
    values: Vec<u16>,
}

#[cfg(target_arch = "x86_64")]
impl PackedRun {
    fn bytes(&self) -> usize {
        self.keys.bytes() + self.values.len() * 2
    }
}

/// Makes the keys and values of each run of consecutive tiles on one block table, for each KV
/// head, into `packed[run * kv_heads + kv]`: from the start of the block of the run's first
/// visible position to its last query's, every run in one parallel call (a step may hold a
/// prompt chunk and many decoding sequences), the values in another: the runs of
/// `min_queries` queries or more. Returns each tile's run (`None`: not packed).
///
/// # Safety
/// The CPU must pass `avx512_bf16::available()`; the head dimension is a multiple of
/// `amx_bf16::STEP`.
#[cfg(target_arch = "x86_64")]
unsafe fn pack_runs(
    pool: &KvPool,
    layer: usize,
    shape: &AttentionShape<'_>,
    queries: &[QueryPos<'_>],
    tiles: &[(usize, usize)],
    min_queries: usize,
    packed: &mut Vec<PackedRun>,
) -> Vec<Option<usize>> {
    use crate::kernels::attention_tiles::{self, Key};
    use crate::kernels::{amx_bf16::ROWS, avx512_bf16::narrow};
    // A block is one group of the products' keys, so a tile's keys start a group.
    const _: () = assert!(BLOCK_TOKENS == ROWS);
    let (mut runs, mut run_of) = (Vec::<(usize, usize)>::new(), Vec::with_capacity(tiles.len()));
    for &(t0, t1) in tiles {
        match runs.last_mut() {
            Some(run) if run.1 == t0 && std::ptr::eq(queries[run.0].table, queries[t0].table) => run.1 = t1,
            _ => runs.push((t0, t1)),
        }
        run_of.push(runs.len() - 1);
    }
    // The runs of `min_queries` queries or more, renumbered; the others' tiles take f32.
    let mut kept = 0;
    let renumbered: Vec<Option<usize>> = runs
        .iter()
        .map(|&(t0, t1)| {
            (t1 - t0 >= min_queries).then(|| {
                kept += 1;
                kept - 1
            })
        })
        .collect();
    runs.retain(|&(t0, t1)| t1 - t0 >= min_queries);
    let run_of = run_of.into_iter().map(|run| renumbered[run]).collect();
    let (hd, kv_heads) = (shape.head_dim, shape.kv_heads);
    // Each run's table and its positions first..end.
    let spans: Vec<(&BlockTable, usize, usize)> = runs
        .iter()
        .map(|&(t0, t1)| {
            let run = &queries[t0..t1];
            let first = run.iter().map(|q| q.first).min().unwrap() / BLOCK_TOKENS * BLOCK_TOKENS;
            (run[0].table, first, run.iter().map(|q| q.pos + 1).max().unwrap())
        })
        .collect();
    packed.resize_with(runs.len() * kv_heads, PackedRun::default);
    for (i, pack) in packed.iter_mut().enumerate() {
        pack.first = spans[i / kv_heads].1;
    }
    // Pack `i`: run i / kv_heads, KV head i % kv_heads.
    let key = |i: usize, j: usize, row: &mut [f32]| {
        let ((table, first, _), kv) = (spans[i / kv_heads], i % kv_heads);
        let (p, t) = (first + j, (first + j) % BLOCK_TOKENS);
        match pool.layer(table.blocks[p / BLOCK_TOKENS], layer) {
            LayerBlock::F16 { k, .. } => Key::F16(&k[(kv * BLOCK_TOKENS + t) * hd..][..hd]),
            stored if stored.key_rows(kv, hd, (t, t + 1), row) => Key::Widened,
            _ => Key::Absent,
        }
    };
    let sizes = packed.iter_mut().enumerate().map(|(i, pack)| {
        let (_, first, end) = spans[i / kv_heads];
        (&mut pack.keys, end - first)
    });
    // SAFETY: the caller's.
    unsafe { attention_tiles::pack_keys(sizes, hd, key) };
    // The values, a block of a pack a task: f16 rounded to bf16, codes widened first.
    let mut blocks = Vec::new();
    for (i, pack) in packed.iter_mut().enumerate() {
        let ((table, first, end), kv) = (spans[i / kv_heads], i % kv_heads);
        pack.values.resize((end - first) * hd, 0);
        let ids = &table.blocks[first / BLOCK_TOKENS..];
        blocks.extend(pack.values.chunks_mut(BLOCK_TOKENS * hd).zip(ids).map(|(rows, &id)| (id, kv, rows)));
    }
    thread_local!(static WIDENED: std::cell::RefCell<Vec<f32>> = std::cell::RefCell::default());
    blocks.into_par_iter().for_each(|(id, kv, rows)| {
        let n = rows.len() / hd;
        match pool.layer(id, layer) {
            // SAFETY (both): the caller checked the CPU.
            LayerBlock::F16 { v, .. } => unsafe { narrow(&v[kv * BLOCK_TOKENS * hd..][..n * hd], rows) },
            stored => WIDENED.with_borrow_mut(|wide| {
                wide.resize(n * hd, 0.0);
                if stored.value_rows(kv, hd, (0, n), wide) {
                    unsafe { narrow(&wide[..n * hd], rows) }
                } else {
                    rows.fill(0);
                }
            }),
        }
    });
    run_of
}

/// One task: a tile of queries of one sequence, the query heads of one KV head.
struct Tile<'a, 'b> {
    pool: &'a KvPool,
    layer: usize,
    shape: &'a AttentionShape<'a>,
    queries: &'a [QueryPos<'b>],
    /// Batch index of `queries[0]`.
    first_token: usize,
    kv: usize,
    q: &'a [f32],
    out: Out,
}

impl<'b> Tile<'_, 'b> {
    /// [`Tile::run`] compiled for AVX2 + FMA, with the AVX2 kernels of a block's two loops.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run_avx2(&self, scratch: &mut TaskScratch) {
        self.run::<true>(scratch)
    }

    /// The tile in bf16 products on `unit`, where no block it sees is evicted; `false` (nothing
    /// written) where one is. `packed`: its sequence's keys and values of its KV head.
    ///
    /// # Safety
    /// The CPU must have `unit` (which implies AVX-512 BF16, AVX2, FMA and F16C), and the head
    /// dimension be a multiple of `amx_bf16::STEP`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run_tiles(
        &self,
        unit: Bf16Unit,
        packed: &PackedRun,
        TaskScratch { scores, tiles, .. }: &mut TaskScratch,
    ) -> bool {
        use crate::kernels::{amx_bf16::ROWS, attention_tiles};
        let shape = self.shape;
        let (hd, group, kv) = (shape.head_dim, shape.heads / shape.kv_heads, self.kv);
        // From the start of the first block the tile sees, where a group of the packed keys
        // starts: the positions before its first weigh nothing (below).
        let (span, _) = self.span();
        let span = QueryPos { first: span.first / BLOCK_TOKENS * BLOCK_TOKENS, ..span };
        let len = span.pos + 1 - span.first;
        if visible(&span).any(|(id, ..)| self.pool.layer(id, self.layer).rows(kv, hd, true).is_none()) {
            return false;
        }
        let v0 = span.first - packed.first;
        let values = &packed.values[v0 * hd..(v0 + len) * hd];
        let rows = self.queries.len() * group;
        // The products write every score (no zeroing).
        scores.resize(rows * len, 0.0);
        let scores = &mut scores[..rows * len];
        // Row r: query r / group, head kv * group + r % group.
        let query = |r: usize| {
            let t = self.first_token + r / group;
            &self.q[(t * shape.heads + kv * group + r % group) * hd..][..hd]
        };
        let g0 = (span.first - packed.first) / ROWS;
        let keys = packed.keys.groups(g0..g0 + len.div_ceil(ROWS));
        // SAFETY: the caller checked the CPU and the head dimension.
        unsafe { attention_tiles::scores(unit, tiles, rows, query, keys, len, hd, shape.scale, scores) };
        // Each row's weights over the positions its query sees, zero elsewhere.
        for (r, row) in scores.chunks_exact_mut(len).enumerate() {
            let qp = &self.queries[r / group];
            let (a, b) = (qp.first - span.first, qp.pos + 1 - span.first);
            // SAFETY: both units' CPUs have AVX-512F (the caller checked).
            unsafe { attention_tiles::softmax(&mut row[a..b], shape.sinks.map(|s| s[kv * group + r % group])) };
            row[..a].fill(0.0);
            row[b..].fill(0.0);
        }
        if self.pool.tracks_attention() {
            for (id, start, from, to) in visible(&span) {
                let (mass, rows) = self.mass(scores, span.first, len, (start, from, to));
                if rows > 0 {
                    self.pool.note_attention(id, mass, rows);
                }
            }
        }
        // Row r's output: token first_token + r / group, head kv * group + r % group.
        let out = |r: usize| {
            let t = self.first_token + r / group;
            self.out.0.wrapping_add((t * shape.heads + kv * group + r % group) * hd)
        };
        // SAFETY: as above; this task alone writes the heads kv*group..(kv+1)*group of its
        // tokens, which lie inside `out` (asserted in attend).
        unsafe { attention_tiles::weighted_sums(unit, tiles, rows, scores, values, hd, out) };
        true
    }

    /// Every position some query of the tile sees, as one query that sees them all
    /// (`first..=pos`), and how many there are. Scores are indexed from its `first`.
    fn span(&self) -> (QueryPos<'b>, usize) {
        let lo = self.queries.iter().map(|q| q.first).min().unwrap();
        let hi = self.queries.iter().map(|q| q.pos + 1).max().unwrap();
        (QueryPos { table: self.queries[0].table, pos: hi - 1, first: lo }, hi - lo)
    }

    /// The slots of the block starting at `start` that query `i` sees, of `from..to`.
    fn seen(&self, i: usize, start: usize, from: usize, to: usize) -> (usize, usize) {
        let qp = &self.queries[i];
        (qp.first.max(start + from) - start, (qp.pos + 1).min(start + to).max(start) - start)
    }

    /// The weight the block at `start` (slots `from..to`) received from the tile's rows
    /// (`weights`, rows of `len` from position `lo`), and how many rows saw it: an importance
    /// signal (`kv_levels.rs`).
    fn mass(&self, weights: &[f32], lo: usize, len: usize, (start, from, to): (usize, usize, usize)) -> (f32, usize) {
        let group = self.shape.heads / self.shape.kv_heads;
        let (mut mass, mut rows) = (0f32, 0);
        for i in 0..self.queries.len() {
            let (a, b) = self.seen(i, start, from, to);
            if a < b {
                rows += group;
                let first = (i * group) * len + start + a - lo;
                mass += (0..group).map(|g| weights[first + g * len..][..b - a].iter().sum::<f32>()).sum::<f32>();
            }
        }
        (mass, rows)
    }

    #[inline(always)]
    fn run<const SIMD: bool>(&self, TaskScratch { block, scores, fold, probe, .. }: &mut TaskScratch) {
        let shape = self.shape;
        let hd = shape.head_dim;
        let group = shape.heads / shape.kv_heads;
        let (kv, layer) = (self.kv, self.layer);
        let (span, len) = self.span();
        let lo = span.first;
        let rows = self.queries.len() * group;
        scores.clear();
        scores.resize(rows * len, 0.0);
        block.resize(BLOCK_TOKENS * hd, 0.0);
        let seen = |i: usize, start: usize, from: usize, to: usize| self.seen(i, start, from, to);
        // A decoding token's tile does little arithmetic per block: it asks for the next
        // block's keys or values while it works on this one. A prompt chunk's tile does 16
        // queries' worth of arithmetic per block, enough to hide the reads.
        let prefetch = self.queries.len() == 1;
        // The AVX2 kernels read blocks as `BlockRows`: a decoding token's tile in place,
        // widening in registers; a prompt chunk's tile widened to f32 once for its queries.
        // The portable path widens to f32 values.
        let kernels = SIMD && hd.is_multiple_of(8);
        let in_place = kernels && prefetch;
        // The queries of the tile's query `i`, the group's heads one after the other.
        let heads_of = |i: usize| {
            let t = self.first_token + i;
            &self.q[(t * shape.heads + kv * group) * hd..][..group * hd]
        };
        // The scores of one block's keys, `None` (an evicted block) weighing nothing.
        let score = |keys: Option<&BlockRows<'_>>, scores: &mut [f32], (start, from, to), fold: &mut Vec<f32>| {
            for i in 0..self.queries.len() {
                let (a, b) = seen(i, start, from, to);
                if a >= b {
                    continue; // a sliding window that starts past this block
                }
                let first = (i * group) * len + start + a - lo;
                match keys {
                    Some(rows) => {
                        dots::<SIMD>(rows, (a, b), hd, heads_of(i), group, shape.scale, &mut scores[first..], len, fold)
                    }
                    None => (0..group).for_each(|g| scores[first + g * len..][..b - a].fill(f32::NEG_INFINITY)),
                }
            }
        };
        // Scores, one block of keys at a time; an evicted block with a key index is scored
        // against it and set aside.
        let mut indexed = Vec::new();
        let mut blocks = visible(&span).peekable();
        let mut ahead = visible(&span).skip(2);
        while let Some((id, start, from, to)) = blocks.next() {
            if prefetch {
                self.prefetch(blocks.peek(), ahead.next(), true);
            }
            let stored = self.pool.layer(id, layer);
            let keys = match stored {
                LayerBlock::Evicted(Some(index)) if self.pool.recall_share().is_some() => {
                    indexed.push((id, start, from, to));
                    Some(if kernels {
                        index.rows(kv, hd)
                    } else {
                        index.keys_into(kv, hd, (from, to), block);
                        BlockRows { data: RowData::F32(block), scale: None, min: None, group: hd }
                    })
                }
                _ => block_rows(stored, kv, hd, true, (from, to), (kernels, in_place), block),
            };
            score(keys.as_ref(), scores, (start, from, to), fold);
        }
        // An indexed block some query would weigh is read back and scored exactly; the others
        // weigh nothing (`kv_recall.rs`).
        let mut recalled: Vec<(BlockId, LayerBlock)> = Vec::new();
        if let (false, Some(share)) = (indexed.is_empty(), self.pool.recall_share()) {
            // The weights the rows would give, evicted positions scored by their index.
            probe.clear();
            probe.extend_from_slice(scores);
            for r in 0..rows {
                let qp = &self.queries[r / group];
                softmax::<SIMD>(
                    &mut probe[r * len..][qp.first - lo..qp.pos + 1 - lo],
                    shape.sinks.map(|s| s[kv * group + r % group]),
                );
            }
            for (id, start, from, to) in indexed {
                let wanted = (0..self.queries.len()).any(|i| {
                    let (a, b) = seen(i, start, from, to);
                    let at = |g: usize| (i * group + g) * len + start + a - lo;
                    a < b && (0..group).any(|g| probe[at(g)..][..b - a].iter().sum::<f32>() >= share)
                });
                let back = if wanted { self.pool.recall(id, layer, kv) } else { None };
                let keys = back
                    .as_ref()
                    .and_then(|back| block_rows(back, 0, hd, true, (from, to), (kernels, in_place), block));
                score(keys.as_ref(), scores, (start, from, to), fold);
                recalled.extend(back.map(|back| (id, back)));
            }
        }
        for i in 0..self.queries.len() {
            let qp = &self.queries[i];
            for g in 0..group {
                let sink = shape.sinks.map(|s| s[kv * group + g]);
                softmax::<SIMD>(&mut scores[(i * group + g) * len..][qp.first - lo..qp.pos + 1 - lo], sink);
            }
        }
        // SAFETY: this task alone writes the heads kv*group..(kv+1)*group of its tokens, which
        // lie inside `out` (asserted in attend).
        let out_heads = |i: usize| unsafe {
            let t = self.first_token + i;
            std::slice::from_raw_parts_mut(self.out.0.add((t * shape.heads + kv * group) * hd), group * hd)
        };
        for i in 0..self.queries.len() {
            out_heads(i).fill(0.0);
        }
        let track = self.pool.tracks_attention();
        let mut blocks = visible(&span).peekable();
        let mut ahead = visible(&span).skip(2);
        while let Some((id, start, from, to)) = blocks.next() {
            if prefetch {
                self.prefetch(blocks.peek(), ahead.next(), false);
            }
            // A block recalled this step is its copy's one head.
            let (stored, head) = match recalled.iter().find(|(r, _)| *r == id) {
                Some((_, back)) => (back, 0),
                None => (self.pool.layer(id, layer), kv),
            };
            let Some(values) = block_rows(stored, head, hd, false, (from, to), (kernels, in_place), block) else {
                continue;
            };
            for i in 0..self.queries.len() {
                let (a, b) = seen(i, start, from, to);
                if a < b {
                    let first = (i * group) * len + start + a - lo;
                    weighted_sum::<SIMD>(&values, (a, b), hd, &scores[first..], len, group, out_heads(i), fold);
                }
            }
            if track {
                // The weight this block received from the tile's rows (an importance signal).
                let (mass, rows) = self.mass(scores, lo, len, (start, from, to));
                if rows > 0 {
                    self.pool.note_attention(id, mass, rows);
                }
            }
        }
    }
}

impl Tile<'_, '_> {
    /// While a decoding token works on one block: the next block's keys or values, and the
    /// entry of the block after it, whose storage the next call prefetches in turn.
    #[inline(always)]
    fn prefetch(
        &self,
        next: Option<&(BlockId, usize, usize, usize)>,
        after: Option<(BlockId, usize, usize, usize)>,
        keys: bool,
    ) {
        if let Some(&(next, ..)) = next {
            self.pool.layer(next, self.layer).prefetch(self.kv, self.shape.head_dim, keys);
        }
        if let Some((after, ..)) = after {
            self.pool.prefetch_layer(after, self.layer);
        }
    }
}

/// The blocks a query sees, in order: (block, its first position, the first and one past the
/// last slot of it the query sees).
fn visible<'a>(query: &'a QueryPos<'_>) -> impl Iterator<Item = (BlockId, usize, usize, usize)> + 'a {
    let (first, seen) = (query.first, query.pos + 1);
    query
        .table
        .blocks
        .iter()
        .enumerate()
        .map(|(b, &id)| (id, b * BLOCK_TOKENS))
        .take_while(move |&(_, start)| start < seen)
        .filter(move |&(_, start)| start + BLOCK_TOKENS > first)
        .map(move |(id, start)| (id, start, first.saturating_sub(start), (seen - start).min(BLOCK_TOKENS)))
}

/// A block's keys (or values) of KV head `kv` as the kernels read them, `None` where evicted.
/// With the AVX2 kernels (`kernels`), a block is read in place (`in_place`: a decoding token;
/// int8 and int4 codes always) or its f16 slots `from..to` widened into `block` once for a
/// prompt tile; the portable path gets f32 values.
#[inline(always)]
fn block_rows<'s>(
    stored: &'s LayerBlock,
    kv: usize,
    hd: usize,
    keys: bool,
    (from, to): (usize, usize),
    (kernels, in_place): (bool, bool),
    block: &'s mut [f32],
) -> Option<BlockRows<'s>> {
    if !kernels {
        let written = if keys {
            stored.keys_into(kv, hd, (from, to), block)
        } else {
            stored.values_into(kv, hd, (from, to), block)
        };
        return written.then_some(BlockRows { data: RowData::F32(block), scale: None, min: None, group: hd });
    }
    let rows = stored.rows(kv, hd, keys)?;
    // Codes are always read in place: the integer kernels make the other side of each product
    // integer instead of the codes f32.
    let RowData::F16(x) = rows.data else { return Some(rows) };
    if in_place {
        return Some(rows);
    }
    widen_f16(&x[from * hd..to * hd], &mut block[from * hd..to * hd]);
    Some(BlockRows { data: RowData::F32(block), ..rows })
}

/// For each of `heads` query heads `h` (rows of `hd` in `q`) and each row `s` of `rows` in
/// `a..b`: `out[h * stride + s - a] = scale * q[h] . row s`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dots<const SIMD: bool>(
    rows: &BlockRows<'_>,
    (a, b): (usize, usize),
    hd: usize,
    q: &[f32],
    heads: usize,
    scale: f32,
    out: &mut [f32],
    stride: usize,
    fold: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    if SIMD && hd.is_multiple_of(8) {
        // SAFETY: SIMD is true only in `Tile::run_avx2` and `Tile::run_tiles`, which run where
        // simd() found AVX2, FMA and F16C.
        return unsafe {
            crate::kernels::attention_avx2::attention_dots(rows, (a, b), hd, q, heads, scale, out, stride, fold)
        };
    }
    let _ = fold;
    let (RowData::F32(keys), None) = (rows.data, rows.scale) else { unreachable!("only the AVX2 kernels get these") };
    for h in 0..heads {
        for s in a..b {
            out[h * stride + s - a] = dot(&q[h * hd..][..hd], &keys[s * hd..][..hd]) * scale;
        }
    }
}

/// For each of `heads` query heads `h`: `out[h] += sum over rows s in a..b of
/// weights[h * stride + s - a] * row s` (`out` rows of `hd`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn weighted_sum<const SIMD: bool>(
    rows: &BlockRows<'_>,
    (a, b): (usize, usize),
    hd: usize,
    weights: &[f32],
    stride: usize,
    heads: usize,
    out: &mut [f32],
    fold: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    if SIMD && hd.is_multiple_of(8) {
        // SAFETY: as in `dots`.
        return unsafe {
            crate::kernels::attention_avx2::attention_weighted_sum(rows, (a, b), hd, weights, stride, heads, out, fold)
        };
    }
    let _ = fold;
    let (RowData::F32(values), None) = (rows.data, rows.scale) else { unreachable!("only the AVX2 kernels get these") };
    for h in 0..heads {
        for s in a..b {
            let w = weights[h * stride + s - a];
            for (o, x) in out[h * hd..][..hd].iter_mut().zip(&values[s * hd..][..hd]) {
                *o += w * x;
            }
        }
    }
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let main = a.len() / 8 * 8;
    for (x, y) in a[..main].chunks_exact(8).zip(b[..main].chunks_exact(8)) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    acc.iter().sum::<f32>() + a[main..].iter().zip(&b[main..]).map(|(x, y)| x * y).sum::<f32>()
}

/// Softmax of `x` in place; a `sink` logit counts in the denominator only.
#[inline(always)]
fn softmax<const SIMD: bool>(x: &mut [f32], sink: Option<f32>) {
    #[cfg(target_arch = "x86_64")]
    if SIMD {
        // SAFETY: as in `dots`.
        return unsafe { crate::kernels::attention_avx2::softmax(x, sink) };
    }
    let max = x.iter().copied().fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
    let mut sum = sink.map_or(0.0, |s| (s - max).exp());
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::Shape;

    /// Attention computed directly from the f32 keys and values, for comparison.
    fn reference(q: &[f32], keys: &[Vec<f32>], values: &[Vec<f32>], scale: f32, sink: Option<f32>) -> Vec<f32> {
        let scores: Vec<f32> = keys.iter().map(|k| dot(q, k) * scale).collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f32 = e.iter().sum::<f32>() + sink.map_or(0.0, |s| (s - max).exp());
        let mut out = vec![0.0; q.len()];
        for (w, v) in e.iter().zip(values) {
            for (o, x) in out.iter_mut().zip(v) {
                *o += w / sum * x;
            }
        }
        out
    }

    #[test]
    fn grouped_heads_over_several_blocks_match_a_direct_computation() {
        let (kv_heads, heads, hd) = (2, 4, 8);
        let mut pool = KvPool::new(Shape { layers: 1, kv_heads, head_dim: hd }, 8);
        let mut table = BlockTable::default();
        let len = 37; // three blocks, the last partial
        pool.reserve(&mut table, len).unwrap();
        table.len = len;
        let val = |p: usize, h: usize, d: usize, salt: f32| ((p * 31 + h * 7 + d) as f32 * salt).sin();
        let mut keys = vec![vec![]; kv_heads];
        let mut values = vec![vec![]; kv_heads];
        for p in 0..len {
            let k: Vec<f32> = (0..kv_heads * hd).map(|i| val(p, i / hd, i % hd, 0.37)).collect();
            let v: Vec<f32> = (0..kv_heads * hd).map(|i| val(p, i / hd, i % hd, 0.91)).collect();
            pool.write(&table, 0, p, &k, &v);
            for h in 0..kv_heads {
                // What the cache holds: f16-rounded values.
                let r = |x: &[f32]| x.iter().map(|&a| half::f16::from_f32(a).to_f32()).collect::<Vec<_>>();
                keys[h].push(r(&k[h * hd..(h + 1) * hd]));
                values[h].push(r(&v[h * hd..(h + 1) * hd]));
            }
        }
        let sinks = [0.5, -1.0, 2.0, 0.0];
        for sinks in [None, Some(&sinks[..])] {
            let shape = AttentionShape { heads, kv_heads, head_dim: hd, scale: 1.0 / (hd as f32).sqrt(), sinks };
            // (first, pos): one query at the end, one in the middle of the second block, and two
            // sliding-window queries (from the middle of a block, and from a block's start).
            let positions = [(0, len - 1), (0, 20), (13, 36), (16, 30)];
            let queries: Vec<QueryPos<'_>> =
                positions.iter().map(|&(first, pos)| QueryPos { table: &table, pos, first }).collect();
            let q: Vec<f32> = (0..positions.len() * heads * hd).map(|i| ((i * 13) as f32 * 0.11).cos()).collect();
            let mut out = vec![0.0; q.len()];
            attend(&pool, 0, &shape, &queries, &q, &mut out, None);
            for (t, &(first, pos)) in positions.iter().enumerate() {
                for h in 0..heads {
                    let kv = h / (heads / kv_heads);
                    let qh = &q[(t * heads + h) * hd..][..hd];
                    let sink = sinks.map(|s| s[h]);
                    let want = reference(qh, &keys[kv][first..=pos], &values[kv][first..=pos], shape.scale, sink);
                    let got = &out[(t * heads + h) * hd..][..hd];
                    for (a, b) in got.iter().zip(&want) {
                        assert!((a - b).abs() < 1e-5, "token {t} head {h} sink {sink:?}: {got:?} vs {want:?}");
                    }
                }
            }
        }
    }

    /// A prompt step in bf16 products, on each unit the CPU has: exact keys, values rounded to
    /// bf16, within that rounding of the f32 kernels' outputs, with the same weight noted per
    /// block; int8 and int4 blocks read in products too, widened, as close to the f32 kernels
    /// (which read their codes in integer arithmetic); a tile that sees an evicted block takes
    /// the f32 kernels and gets their bits.
    #[test]
    fn a_prompt_step_in_bf16_products_stays_within_the_values_bf16_rounding_of_the_f32_kernels() {
        let units: Vec<_> = [Bf16Unit::Tiles, Bf16Unit::Vectors].into_iter().filter(|u| u.available()).collect();
        if !simd() || units.is_empty() {
            eprintln!("no AVX-512 BF16 on this CPU");
        }
        for unit in units.into_iter().filter(|_| simd()) {
            prompt_step_in_bf16_products(unit);
        }
    }

    fn prompt_step_in_bf16_products(unit: Bf16Unit) {
        use crate::kv_levels::Level;
        // Three query heads per KV head (rows of 48 and then 32 + 16 in a product), a prompt
        // of 70 positions over five blocks: five query tiles, the last one short.
        let (kv_heads, heads, hd, len) = (2, 6, 64, 70);
        // Pools built alike hold the same blocks under the same ids: one table serves all.
        let build = || {
            let mut pool = KvPool::new(Shape { layers: 1, kv_heads, head_dim: hd }, 8);
            let mut table = BlockTable::default();
            pool.reserve(&mut table, len).unwrap();
            table.len = len;
            for p in 0..len {
                // Four channels of every key carry a large bias, as Qwen2.5's keys do: one
                // bf16 step of such a key (0.25) outweighs the score differences.
                let bias = |i: usize| if i % hd < 4 { 40.0 } else { 0.0 };
                let k: Vec<f32> =
                    (0..kv_heads * hd).map(|i| ((p * 7 + i) as f32 * 0.31).sin() * 2.0 + bias(i)).collect();
                let v: Vec<f32> = (0..kv_heads * hd).map(|i| ((p * 11 + i) as f32 * 0.17).cos()).collect();
                pool.write(&table, 0, p, &k, &v);
            }
            pool.track_attention(true);
            (pool, table)
        };
        let (mut pool, table) = build();
        let sinks = [0.5, -1.0, 2.0, 0.0, 1.0, -0.5];
        let q: Vec<f32> = (0..len * heads * hd).map(|i| ((i * 13) as f32 * 0.11).cos()).collect();
        for (window, sinks) in [(usize::MAX, None), (24, Some(&sinks[..]))] {
            let shape = AttentionShape { heads, kv_heads, head_dim: hd, scale: 0.125, sinks };
            let queries: Vec<QueryPos<'_>> =
                (0..len).map(|pos| QueryPos { table: &table, pos, first: (pos + 1).saturating_sub(window) }).collect();
            let run = |pool: &KvPool, prompt: Option<Bf16Unit>| {
                let mut out = vec![f32::NAN; q.len()];
                attend(pool, 0, &shape, &queries, &q, &mut out, prompt);
                out
            };
            // The weight each block received, from a fresh count.
            let received =
                |pool: &KvPool| table.blocks.iter().map(|&id| pool.attention_received(id)).collect::<Vec<_>>();
            let ((f32_pool, t1), (bf16_pool, t2)) = (build(), build());
            assert!(t1.blocks == table.blocks && t2.blocks == table.blocks);
            let (f32_out, bf16_out) = (run(&f32_pool, None), run(&bf16_pool, Some(unit)));
            assert_ne!(f32_out, bf16_out, "{unit:?}: the step took the products");
            let worst = f32_out.iter().zip(&bf16_out).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            // Values rounded to bf16 (a step of 2^-8 at 1) move outputs by up to 3.3e-3; keys
            // rounded to bf16 too moved them by 1.1e-2.
            assert!(worst < 6e-3, "{unit:?}, window {window}: outputs {worst} apart");
            for (a, b) in received(&f32_pool).iter().zip(received(&bf16_pool)) {
                let (a, b) = (a.unwrap(), b.unwrap());
                assert!((a - b).abs() < 1e-3 * a.max(1e-3), "{unit:?}, window {window}: weight received {a} vs {b}");
            }
        }
        // Block 2 at int8 and block 3 at int4: the tiles that see them stay in products.
        assert!(pool.set_level(&table, 2, None, Level::Int8));
        assert!(pool.set_level(&table, 3, None, Level::Int4));
        let shape = AttentionShape { heads, kv_heads, head_dim: hd, scale: 0.125, sinks: None };
        let queries: Vec<QueryPos<'_>> = (0..len).map(|pos| QueryPos { table: &table, pos, first: 0 }).collect();
        let run = |pool: &KvPool, prompt: Option<Bf16Unit>| {
            let mut out = vec![f32::NAN; q.len()];
            attend(pool, 0, &shape, &queries, &q, &mut out, prompt);
            out
        };
        let (plain, tiles) = (run(&pool, None), run(&pool, Some(unit)));
        let tile = |t: usize| t * BLOCK_TOKENS * heads * hd..((t + 1) * BLOCK_TOKENS).min(len) * heads * hd;
        for t in 2..5 {
            assert_ne!(plain[tile(t)], tiles[tile(t)], "{unit:?}: tile {t} took the products");
            let worst = plain[tile(t)].iter().zip(&tiles[tile(t)]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            // As above; the integer kernels' own rounding of the queries and weights (up to
            // 1.8e-3 at int4, `a_decoding_token_reading_blocks_in_place_...`) comes on top.
            assert!(worst < 6e-3, "{unit:?}, tile {t}: outputs {worst} apart");
        }
        // Block 1 evicted: the tiles that see it take the f32 kernels, at their bits; the
        // first stays in products.
        assert!(pool.set_level(&table, 1, None, Level::Evicted));
        let (plain, tiles) = (run(&pool, None), run(&pool, Some(unit)));
        assert_eq!(plain[tile(1).start..], tiles[tile(1).start..]);
        assert_ne!(plain[tile(0)], tiles[tile(0)]);
    }

    #[test]
    fn a_decoding_token_reading_blocks_in_place_gets_the_bits_of_a_prompt_tile_that_widens_them() {
        use crate::kv_levels::Level;
        // Five query heads per KV head (a group of 4 and one of 1 in the kernels) and a head_dim
        // of 72 (four 16-channel steps and an 8-channel one).
        let (kv_heads, heads, hd, len) = (2, 10, 72, 45);
        let mut pool = KvPool::new(Shape { layers: 1, kv_heads, head_dim: hd }, 4);
        let mut table = BlockTable::default();
        pool.reserve(&mut table, len).unwrap();
        table.len = len;
        for p in 0..len {
            let k: Vec<f32> = (0..kv_heads * hd).map(|i| ((p * 7 + i) as f32 * 0.31).sin() * 3.0).collect();
            let v: Vec<f32> = (0..kv_heads * hd).map(|i| ((p * 11 + i) as f32 * 0.17).cos()).collect();
            pool.write(&table, 0, p, &k, &v);
        }
        // Block 0 at int8 and block 1 at int4 (read in place by both, in integer arithmetic),
        // block 2 at f16.
        assert!(pool.set_level(&table, 0, None, Level::Int8));
        assert!(pool.set_level(&table, 1, None, Level::Int4));
        let shape = AttentionShape { heads, kv_heads, head_dim: hd, scale: 0.12, sinks: None };
        let q: Vec<f32> = (0..2 * heads * hd).map(|i| (i as f32 * 0.23).cos()).collect();
        // Two queries of one tile: the f16 block is widened to f32 first.
        let tile =
            [QueryPos { table: &table, pos: len - 2, first: 0 }, QueryPos { table: &table, pos: len - 1, first: 0 }];
        let mut widened = vec![0.0; q.len()];
        attend(&pool, 0, &shape, &tile, &q, &mut widened, None);
        // The second query alone, as a decoding token: every block read in place.
        let mut alone = vec![0.0; heads * hd];
        attend(&pool, 0, &shape, &tile[1..], &q[heads * hd..], &mut alone, None);
        assert!(alone.iter().any(|&x| x != 0.0));
        assert_eq!(alone, widened[heads * hd..], "the same sums in the same order give the same bits");
        // And both are attention over the values the levels stand for (their codes times their
        // scales plus their minimums), with the scales folded in elsewhere: only rounding apart.
        // The int4 block's byte multipliers (7 and 8 bits, `kernels/attention_int4.rs`) move an
        // output by up to 1.8e-3 here, a few percent of what rounding to int4 moved the values
        // by (up to a 30th of a row's range); with i16 multipliers everywhere it stayed < 1e-4.
        let stored = |kv: usize, keys: bool| {
            let mut rows = vec![0f32; len.next_multiple_of(BLOCK_TOKENS) * hd];
            for (b, &id) in table.blocks.iter().enumerate() {
                let out = &mut rows[b * BLOCK_TOKENS * hd..][..BLOCK_TOKENS * hd];
                let layer = pool.layer(id, 0);
                assert!(if keys {
                    layer.keys_into(kv, hd, (0, BLOCK_TOKENS), out)
                } else {
                    layer.values_into(kv, hd, (0, BLOCK_TOKENS), out)
                });
            }
            rows.chunks_exact(hd).take(len).map(<[f32]>::to_vec).collect::<Vec<_>>()
        };
        for (t, pos) in [(0, len - 2), (1, len - 1)] {
            for h in 0..heads {
                let kv = h / (heads / kv_heads);
                let qh = &q[(t * heads + h) * hd..][..hd];
                let want = reference(qh, &stored(kv, true)[..=pos], &stored(kv, false)[..=pos], shape.scale, None);
                let got = &widened[(t * heads + h) * hd..][..hd];
                for (a, b) in got.iter().zip(&want) {
                    assert!((a - b).abs() < 4e-3, "query {t} head {h}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn an_evicted_block_a_query_needs_is_read_back_exactly_and_one_it_does_not_stays_out() {
        use crate::kv_recall::RECALL_SHARE;
        let (heads, hd, len) = (2, 64, 64);
        let shape = AttentionShape { heads, kv_heads: 1, head_dim: hd, scale: 0.125, sinks: None };
        let q: Vec<f32> = (0..heads * hd).map(|i| (i as f32 * 0.7).cos()).collect();
        let key = |p: usize| -> Vec<f32> {
            if (16..32).contains(&p) {
                // Block 1 holds the needle: keys along head 0's query, scoring far above the rest.
                q[..hd].iter().map(|x| x * 1.5).collect()
            } else {
                (0..hd).map(|d| ((p * 5 + d) as f32 * 0.29).sin() * 0.5).collect()
            }
        };
        let value = |p: usize| -> Vec<f32> { (0..hd).map(|d| ((p * 3 + d) as f32 * 0.47).cos()).collect() };
        let rounded = |x: Vec<f32>| x.iter().map(|&a| half::f16::from_f32(a).to_f32()).collect::<Vec<_>>();
        let setup = |recall: bool| {
            let mut pool = KvPool::new(Shape { layers: 1, kv_heads: 1, head_dim: hd }, 4);
            pool.enable_spill().unwrap();
            assert!(!recall || pool.enable_recall(RECALL_SHARE));
            let mut table = BlockTable::default();
            pool.reserve(&mut table, len).unwrap();
            table.len = len;
            for p in 0..len {
                pool.write(&table, 0, p, &key(p), &value(p));
            }
            let before = pool.held_bytes();
            assert!(pool.evict(&table, 1) && pool.evict(&table, 2));
            let freed = before - pool.held_bytes();
            (pool, table, freed)
        };
        let run = |pool: &KvPool, table: &BlockTable| {
            let mut out = vec![0.0; q.len()];
            attend(pool, 0, &shape, &[QueryPos { table, pos: len - 1, first: 0 }], &q, &mut out, None);
            out
        };
        let want = |kept: &[usize]| -> Vec<f32> {
            let ks: Vec<Vec<f32>> = kept.iter().map(|&p| rounded(key(p))).collect();
            let vs: Vec<Vec<f32>> = kept.iter().map(|&p| rounded(value(p))).collect();
            (0..heads).flat_map(|h| reference(&q[h * hd..(h + 1) * hd], &ks, &vs, shape.scale, None)).collect()
        };
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 2e-3);
        let with_needle = want(&(0..32).chain(48..len).collect::<Vec<_>>());
        let without = want(&(0..16).chain(48..len).collect::<Vec<_>>());
        assert!(!close(&with_needle, &without), "the needle block matters to this query");

        let (pool, table, freed_recall) = setup(true);
        let out = run(&pool, &table);
        assert!(close(&out, &with_needle), "recalled: {:?} vs {:?}", &out[..4], &with_needle[..4]);
        assert_eq!(pool.recalls(), 1, "block 1 read back once; block 2 weighs too little");

        let (pool, table, freed_plain) = setup(false);
        assert!(close(&run(&pool, &table), &without), "without recall evicted blocks weigh nothing");
        assert_eq!(pool.recalls(), 0);
        // The index of the keys at int4 stays: 3/16 of the two blocks' f16 bytes.
        assert_eq!(freed_plain - freed_recall, 2 * 2 * (16 * hd * 2) * 3 / 16);
    }

    #[test]
    fn evicted_blocks_weigh_nothing_and_quantized_ones_stay_close() {
        use crate::kv_levels::Level;
        let (heads, hd, len) = (2, 8, 40);
        let mut pool = KvPool::new(Shape { layers: 1, kv_heads: 1, head_dim: hd }, 4);
        let mut table = BlockTable::default();
        pool.reserve(&mut table, len).unwrap();
        table.len = len;
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for p in 0..len {
            let k: Vec<f32> = (0..hd).map(|d| ((p * 5 + d) as f32 * 0.29).sin()).collect();
            let v: Vec<f32> = (0..hd).map(|d| ((p * 3 + d) as f32 * 0.47).cos()).collect();
            pool.write(&table, 0, p, &k, &v);
            keys.push(k.iter().map(|&a| half::f16::from_f32(a).to_f32()).collect::<Vec<_>>());
            values.push(v.iter().map(|&a| half::f16::from_f32(a).to_f32()).collect::<Vec<_>>());
        }
        let shape = AttentionShape { heads, kv_heads: 1, head_dim: hd, scale: 0.35, sinks: None };
        let q: Vec<f32> = (0..heads * hd).map(|i| (i as f32 * 0.7).cos()).collect();
        let run = |pool: &KvPool| {
            let mut out = vec![0.0; q.len()];
            attend(pool, 0, &shape, &[QueryPos { table: &table, pos: len - 1, first: 0 }], &q, &mut out, None);
            out
        };
        pool.track_attention(true);
        let full = run(&pool);
        pool.track_attention(false);
        // Each (query, head) row's weights sum to 1 over the blocks it saw (every row saw all
        // three): the mean weights received, times the rows, add up to the rows.
        let mass: f64 = table.blocks.iter().map(|&id| pool.attention_received(id).unwrap_or(0.0) * heads as f64).sum();
        assert!((mass - heads as f64).abs() < 1e-3, "attention mass over the blocks: {mass}, rows: {heads}");
        assert!(pool.set_level(&table, 0, None, Level::Int8));
        let int8 = run(&pool);
        assert!(int8.iter().zip(&full).all(|(a, b)| (a - b).abs() < 1e-2), "{int8:?} vs {full:?}");
        assert_ne!(int8, full, "block 0 is read at int8");
        assert!(pool.set_level(&table, 1, None, Level::Evicted));
        let evicted = run(&pool);
        // Positions 16..32 no longer count: attention over block 0 (at int8) and block 2.
        for h in 0..heads {
            let qh = &q[h * hd..(h + 1) * hd];
            let kept: Vec<usize> = (0..16).chain(32..len).collect();
            let ks: Vec<Vec<f32>> = kept.iter().map(|&p| keys[p].clone()).collect();
            let vs: Vec<Vec<f32>> = kept.iter().map(|&p| values[p].clone()).collect();
            let want = reference(qh, &ks, &vs, shape.scale, None);
            for (a, b) in evicted[h * hd..(h + 1) * hd].iter().zip(&want) {
                assert!((a - b).abs() < 1e-2, "head {h}: {a} vs {b} without the evicted block");
            }
        }
    }
}
