//! `y = x W^T (+ b)` for a weight stored as on disk (bf16, f16 or f32, `[out, in]` row-major,
//! memory-mapped), summed in f32.
//!
//! Where the CPU has AVX-512 BF16, a bf16 weight multiplies the inputs rounded to bf16
//! (`avx512_bf16.rs`) at every batch size, unless the model asks for f32 products; otherwise the
//! products are f32, as below. Where it also has AMX, calls of [`GEMM_MIN_ROWS`] input rows or
//! more (prefill chunks) take bf16 tile products instead (`amx_bf16.rs`), unless the model asks
//! for none: their bits differ from the dot kernels', as the f32 GEMM's do.
//!
//! Work is split over output rows on the model's thread pool. Below [`GEMM_MIN_ROWS`] input rows
//! (decode: one per sequence; a follow-up turn's few new tokens), a task takes a tile of four
//! weight rows as stored, widened in registers, and runs it against three inputs at a time (then
//! a pair or a single for the rest), prefetching the next tile: each weight is read from memory
//! once per step and the reading overlaps the arithmetic. From there on (prefill chunks), a task
//! widens a panel of rows to f32 once and runs
//! a GEMM over it. Several projections of the same input (q/k/v, gate/up) run as one parallel
//! call ([`forward_many`]): fewer thread wake-ups per layer.

#[cfg(target_arch = "x86_64")]
use super::amx_bf16;
#[cfg(target_arch = "x86_64")]
use super::avx2;
#[cfg(target_arch = "x86_64")]
use super::avx512_bf16;
use super::panel::{panel_gemm, Out};
#[cfg(target_arch = "x86_64")]
use super::simd;
use crate::checkpoint::{DType, TensorView};
use half::f16;
use rayon::prelude::*;

/// Weight rows a decode task computes together (the AVX2 kernels take four rows at a time).
const TILE: usize = 4;
/// From this many input rows on, a task widens a panel of `PANEL` weight rows to f32 and runs a
/// GEMM over it (or, for bf16 products on a CPU with AMX, multiplies the weights as stored on
/// tiles); below, the dot-product kernels read the weights as stored. Measured with 2
/// threads on one layer's projections: decode of 8 and 16 sequences was 14-18% faster on the
/// dot kernels than with the threshold at 8 (bench/RESULTS.md, "The native engine"), and from
/// 24 to 48 rows (a follow-up turn's new tokens, a step with drafts) they took 0.56-0.87x the
/// GEMM's time on SmolLM2 and Gemma 3 shapes, 0.86 at 64, 0.96 at 96 and 1.10 at 128 (AMD EPYC;
/// `tests::bench`, "Follow-up turns start where the answer ended"; the GEMM on AVX2 then, before
/// `gemm`'s AVX-512 kernels were on, which may move the crossover down on CPUs that have them).
const GEMM_MIN_ROWS: usize = 64;
const PANEL: usize = 32;
/// Weight rows an AMX task takes: two tiles, each input tile's load serving both.
const AMX_TILE: usize = 32;

pub struct Linear {
    weight: TensorView,
    bias: Option<Vec<f32>>,
    pub rows: usize,
    pub cols: usize,
    /// The weight is bf16, products in bf16 were asked for and the CPU has AVX-512 BF16.
    bf16_products: bool,
    /// With `bf16_products`: tile products were asked for, the CPU has AMX and the rows take
    /// whole tile steps, so calls of [`GEMM_MIN_ROWS`] inputs or more run on tiles.
    amx: bool,
}

/// Whether bf16 weights can multiply in bf16 on this CPU (AVX-512 BF16).
pub fn bf16_products_here() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx512_bf16::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether bf16 products over rows of `cols` values can run on AMX tiles on this CPU.
pub fn amx_here(cols: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return cols.is_multiple_of(amx_bf16::STEP) && amx_bf16::available();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = cols;
        false
    }
}

/// Which kernels a call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernels {
    /// f32 dot products over the weights as stored.
    Dot,
    /// A GEMM over panels widened to f32.
    Gemm,
    /// bf16 dot products of the weights as stored with the inputs rounded to bf16.
    Bf16,
    /// bf16 tile products (AMX) of the weights as stored with the inputs rounded to bf16.
    Amx,
}

impl Linear {
    /// `weight` must be `[rows, cols]`, naturally aligned for its type (safetensors writers
    /// align every tensor); `bias` `[rows]`. With `bf16_products`, a bf16 weight multiplies
    /// inputs rounded to bf16 where the CPU has AVX-512 BF16 (as llama.cpp multiplies bf16
    /// weights), and with `amx_products` too, on AMX tiles from [`GEMM_MIN_ROWS`] inputs on
    /// where the CPU has them; otherwise every product is in f32.
    pub fn new(weight: TensorView, bias: Option<Vec<f32>>, bf16_products: bool, amx_products: bool) -> Self {
        let (rows, cols) = (weight.shape[0], weight.shape[1]);
        debug_assert!(bias.as_ref().is_none_or(|b| b.len() == rows));
        let bf16_products = bf16_products && weight.dtype == DType::BF16 && bf16_products_here();
        let amx = bf16_products && amx_products && amx_here(cols);
        Linear { weight, bias, rows, cols, bf16_products, amx }
    }

    /// Whether a call of `n` input rows takes AMX tiles: prompt chunks, where the CPU has AMX
    /// and the model allows it. Below that, every output keeps the bits it has at any batch.
    pub fn on_tiles(&self, n: usize) -> bool {
        self.amx && n >= GEMM_MIN_ROWS
    }

    /// Where the attention of a step of `n` input rows takes bf16 products, following this
    /// projection's (`attention.rs`): on AMX tiles where it takes them, on AVX-512 BF16
    /// vectors where it multiplies in bf16 at prompt size without them; `None` (f32) below
    /// [`GEMM_MIN_ROWS`], so decoding tokens keep the f32 kernels' bits.
    pub fn prompt_products(&self, n: usize) -> Option<super::Bf16Unit> {
        if self.on_tiles(n) {
            Some(super::Bf16Unit::Tiles)
        } else if self.bf16_products && n >= GEMM_MIN_ROWS {
            Some(super::Bf16Unit::Vectors)
        } else {
            None
        }
    }

    /// How the weight is stored.
    pub fn dtype(&self) -> DType {
        self.weight.dtype
    }

    /// `x`: `n x cols`; returns `y`: `n x rows`.
    pub fn forward(&self, x: &[f32], n: usize, y: &mut Vec<f32>) {
        forward_many(&mut [(self, y)], x, n);
    }

    /// Weight rows `r0..r1` as f32 into `dst`.
    fn widen(&self, r0: usize, r1: usize, dst: &mut [f32]) {
        let cols = self.cols;
        let size = self.weight.dtype.size();
        let bytes = &self.weight.bytes()[r0 * cols * size..r1 * cols * size];
        let dst = &mut dst[..(r1 - r0) * cols];
        match self.weight.dtype {
            DType::BF16 => widen_bf16(bytemuck::cast_slice(bytes), dst),
            DType::F16 => super::widen_f16(bytemuck::cast_slice(bytes), dst),
            DType::F32 => dst.copy_from_slice(bytemuck::cast_slice(bytes)),
        }
    }

    /// Output rows `r0..r1` for every input row: AVX2 kernels reading the weights as stored
    /// where the CPU has them (converting in registers and prefetching the next tile, so reading
    /// memory overlaps the arithmetic), else a portable loop over a widened copy.
    fn rows_into(&self, r0: usize, r1: usize, x: &[f32], n: usize, out: Out, scratch: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if simd() {
            let (size, cols) = (self.weight.dtype.size(), self.cols);
            let bytes = &self.weight.bytes()[r0 * cols * size..r1 * cols * size];
            // SAFETY: simd() checked AVX2, FMA and F16C; the slices hold (r1 - r0) rows.
            unsafe {
                match self.weight.dtype {
                    DType::BF16 => {
                        rows_simd::<half::bf16>(bytemuck::cast_slice(bytes), r1 - r0, cols, x, n, self.rows, r0, out)
                    }
                    DType::F16 => {
                        rows_simd::<f16>(bytemuck::cast_slice(bytes), r1 - r0, cols, x, n, self.rows, r0, out)
                    }
                    DType::F32 => {
                        rows_simd::<f32>(bytemuck::cast_slice(bytes), r1 - r0, cols, x, n, self.rows, r0, out)
                    }
                }
            }
            return;
        }
        self.widen(r0, r1, scratch);
        tile(scratch, r1 - r0, self.cols, x, n, self.rows, r0, out);
    }

    /// The weight row `r` as f32 (embedding lookups).
    pub fn row(&self, r: usize, dst: &mut [f32]) {
        self.widen(r, r + 1, dst);
    }
}

/// bf16 is the top half of an f32: widening is a shift, which vectorises.
fn widen_bf16(src: &[u16], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32::from_bits((s as u32) << 16);
    }
}

/// Runs several projections of the same input `x` (`n x cols`, equal `cols`) in one parallel
/// call, each into its own output (`n x rows`).
pub fn forward_many(jobs: &mut [(&Linear, &mut Vec<f32>)], x: &[f32], n: usize) {
    let kernels = if jobs.iter().all(|(l, _)| l.on_tiles(n)) {
        Kernels::Amx
    } else if jobs.iter().all(|(l, _)| l.bf16_products) {
        Kernels::Bf16
    } else if n >= GEMM_MIN_ROWS {
        Kernels::Gemm
    } else {
        Kernels::Dot
    };
    forward_many_on(jobs, x, n, kernels);
}

/// [`forward_many`] on the given kernels.
fn forward_many_on(jobs: &mut [(&Linear, &mut Vec<f32>)], x: &[f32], n: usize, kernels: Kernels) {
    let cols = jobs[0].0.cols;
    debug_assert!(jobs.iter().all(|(l, _)| l.cols == cols) && x.len() == n * cols);
    // Every job's first tile, its weight and its output.
    let tile_rows = match kernels {
        Kernels::Gemm => PANEL,
        Kernels::Amx => AMX_TILE,
        Kernels::Dot | Kernels::Bf16 => TILE,
    };
    let (mut starts, mut linears, mut outs) = (Vec::new(), Vec::new(), Vec::new());
    let mut tiles = 0;
    for (l, y) in jobs.iter_mut() {
        // Every output is written below (no zeroing): resizing keeps the buffer from before.
        y.resize(n * l.rows, 0.0);
        starts.push(tiles);
        linears.push(*l);
        outs.push(Out(y.as_mut_ptr()));
        tiles += l.rows.div_ceil(tile_rows);
    }
    // The inputs rounded to bf16 once, for every task: for the dot kernels as rows, for the
    // tiles straight into the tiles' layout (the calling thread's buffer, kept from call to
    // call: a prompt chunk's is a few hundred KiB).
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut narrow = Vec::new();
    #[cfg(target_arch = "x86_64")]
    thread_local!(static PACKED: std::cell::RefCell<amx_bf16::Inputs> = std::cell::RefCell::default());
    #[cfg(target_arch = "x86_64")]
    let packed = (kernels == Kernels::Amx).then(|| {
        let mut packed = PACKED.take();
        // SAFETY: the weights have `amx`, which Linear::new grants only where the CPU passes
        // amx_bf16::available().
        unsafe { packed.pack_on_pool(x, n, cols) };
        packed
    });
    #[cfg(target_arch = "x86_64")]
    if kernels == Kernels::Bf16 {
        debug_assert!(jobs.iter().all(|(l, _)| l.bf16_products));
        narrow.resize(x.len(), 0);
        // SAFETY: the weights have bf16_products, which Linear::new grants only where the CPU
        // passes avx512_bf16::available().
        unsafe { avx512_bf16::narrow(x, &mut narrow) };
    }
    // Enough tasks to balance, few enough that each amortises its scheduling.
    let per_task = (tiles / (rayon::current_num_threads() * 4)).max(1);
    (0..tiles).into_par_iter().with_min_len(per_task).for_each_init(
        || {
            vec![
                0f32;
                match kernels {
                    Kernels::Bf16 | Kernels::Amx => 0,
                    Kernels::Dot | Kernels::Gemm => tile_rows * cols,
                }
            ]
        },
        |scratch, tile| {
            let j = starts.partition_point(|&s| s <= tile) - 1;
            let (l, out) = (linears[j], outs[j]);
            let r0 = (tile - starts[j]) * tile_rows;
            let r1 = (r0 + tile_rows).min(l.rows);
            match kernels {
                Kernels::Gemm => {
                    l.widen(r0, r1, scratch);
                    panel_gemm(&scratch[..(r1 - r0) * cols], r1 - r0, cols, x, n, l.rows, r0, out);
                }
                Kernels::Dot => l.rows_into(r0, r1, x, n, out, scratch),
                Kernels::Bf16 => {
                    #[cfg(target_arch = "x86_64")]
                    {
                        let bytes = &l.weight.bytes()[r0 * cols * 2..r1 * cols * 2];
                        // SAFETY: as for `narrow` above; the slice holds the tile's rows.
                        unsafe { rows_bf16(bytemuck::cast_slice(bytes), r1 - r0, cols, &narrow, n, l.rows, r0, out) };
                    }
                }
                Kernels::Amx => {
                    #[cfg(target_arch = "x86_64")]
                    {
                        let bytes = |r0: usize, r1: usize| {
                            bytemuck::cast_slice(&l.weight.bytes()[r0 * cols * 2..r1 * cols * 2])
                        };
                        // A thread takes its tiles in order: the next is likely the rows below.
                        let ahead = bytes(r1, (r1 + tile_rows).min(l.rows));
                        let packed = packed.as_ref().expect("packed for the tiles");
                        // SAFETY: the weights have `amx`, which Linear::new grants only where
                        // the CPU passes amx_bf16::available() and cols takes whole steps; the
                        // slices hold whole rows and `packed` every input.
                        unsafe { rows_amx(bytes(r0, r1), ahead, cols, packed, n, l.rows, r0, out) };
                    }
                }
            }
            if let Some(b) = &l.bias {
                for t in 0..n {
                    for (r, bias) in b.iter().enumerate().take(r1).skip(r0) {
                        // SAFETY: r is one of this task's rows and t < n: inside the output.
                        unsafe { *out.0.add(t * l.rows + r) += bias };
                    }
                }
            }
        },
    );
    #[cfg(target_arch = "x86_64")]
    if let Some(packed) = packed {
        PACKED.set(packed);
    }
}

/// [`tile`] with the AVX2 kernels, reading `nr` weight rows `w` as stored.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `w` holds `nr x cols` values.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_simd<W: avx2::Weight>(
    w: &[W],
    nr: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    rows: usize,
    r0: usize,
    out: Out,
) {
    let input = |t: usize| &x[t * cols..(t + 1) * cols];
    // SAFETY (every write below): row r0 + i belongs to this task and t < n.
    let put = |t: usize, i: usize, v: f32| unsafe { *out.0.add(t * rows + r0 + i) = v };
    if nr < TILE {
        for t in 0..n {
            for i in 0..nr {
                // SAFETY: the caller checked the CPU; w holds nr rows.
                put(t, i, unsafe { avx2::dot(input(t), &w[i * cols..(i + 1) * cols]) });
            }
        }
        return;
    }
    // Threes, then a two or a one. (Ending 16 inputs on two twos rather than five threes and a
    // one measured slower: the pair kernel's eight chains do not hide the FMA latency.) The
    // first call prefetches the next tile.
    let mut t = 0;
    while t + 3 <= n {
        // SAFETY: as above; w holds TILE rows.
        let d = unsafe { avx2::dot4x3([input(t), input(t + 1), input(t + 2)], w, t == 0) };
        for (j, row) in d.into_iter().enumerate() {
            for (i, v) in row.into_iter().enumerate() {
                put(t + j, i, v);
            }
        }
        t += 3;
    }
    while t + 2 <= n {
        // SAFETY: as above; w holds TILE rows.
        let d = unsafe { avx2::dot4x2(input(t), input(t + 1), w, t == 0) };
        for (j, row) in d.into_iter().enumerate() {
            for (i, v) in row.into_iter().enumerate() {
                put(t + j, i, v);
            }
        }
        t += 2;
    }
    if t < n {
        // SAFETY: as above. One input alone streams its weights; a batch's last one finds
        // them in the cache.
        let d = unsafe {
            if t == 0 {
                avx2::dot4(input(t), w)
            } else {
                avx2::dot4_side_by_side(input(t), w)
            }
        };
        for (i, v) in d.into_iter().enumerate() {
            put(t, i, v);
        }
    }
}

/// [`tile`] with the AVX-512 BF16 kernels: `nr` bf16 weight rows `w` as stored against the
/// inputs rounded to bf16 (`x`), six inputs at a time (24 sums and the four weight vectors in
/// the 32 registers), then the rest together.
///
/// # Safety
/// The CPU must pass [`avx512_bf16::available`]; `w` holds `nr x cols` values.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_bf16(w: &[u16], nr: usize, cols: usize, x: &[u16], n: usize, rows: usize, r0: usize, out: Out) {
    use avx512_bf16::dots;
    let input = |t: usize| x[t * cols..].as_ptr();
    // SAFETY (every write below): row r0 + i belongs to this task and t < n.
    let put = |t: usize, i: usize, v: f32| unsafe { *out.0.add(t * rows + r0 + i) = v };
    if nr < TILE || n == 1 {
        // One input alone reads the rows one after the other: one stream in address order,
        // which the hardware prefetcher follows without help (single-sequence decode reads
        // memory; over a 65536 x 640 weight, `tests::bench`, four rows side by side read 22
        // GB/s, one after the other 36-45, as the f32 kernel's 40, and 31-35 with a software
        // prefetch four or eight rows ahead). The other rows' sums run in the same order.
        for i in 0..nr {
            for t in 0..n {
                // SAFETY: the caller checked the CPU; w holds nr rows of cols values.
                put(t, i, unsafe { dots::<1, 1>([input(t)], w[i * cols..].as_ptr(), cols, None) }[0][0]);
            }
        }
        return;
    }
    /// Inputs `t..t + G` against the tile's four rows.
    #[inline(always)]
    unsafe fn group<const G: usize>(
        t: usize,
        input: impl Fn(usize) -> *const u16,
        w: &[u16],
        cols: usize,
        put: impl Fn(usize, usize, f32),
    ) {
        // SAFETY: the caller checked the CPU; w holds four rows, the inputs t..t+G exist.
        let d = unsafe {
            dots::<TILE, G>(std::array::from_fn(|j| input(t + j)), w.as_ptr(), cols, (t == 0).then_some(TILE))
        };
        for (j, row) in d.into_iter().enumerate() {
            for (i, v) in row.into_iter().enumerate() {
                put(t + j, i, v);
            }
        }
    }
    let mut t = 0;
    // SAFETY (each group): as above.
    unsafe {
        while t + 6 <= n {
            group::<6>(t, input, w, cols, put);
            t += 6;
        }
        match n - t {
            5 => group::<5>(t, input, w, cols, put),
            4 => group::<4>(t, input, w, cols, put),
            3 => group::<3>(t, input, w, cols, put),
            2 => group::<2>(t, input, w, cols, put),
            1 => group::<1>(t, input, w, cols, put),
            _ => {}
        }
    }
}

/// [`tile`] on AMX tiles: the weight rows `w` (up to two tiles of 16), copied onto cache lines
/// (a thread's copy is reused from call to call), against every input of `inputs`; `ahead`,
/// the rows the thread's next task likely copies, is fetched into L2 meanwhile.
///
/// # Safety
/// The CPU must pass [`amx_bf16::available`]; `cols` is a multiple of [`amx_bf16::STEP`], `w`
/// holds whole rows and `inputs` holds `n` inputs of `cols` values.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_amx(
    w: &[u16],
    ahead: &[u16],
    cols: usize,
    inputs: &amx_bf16::Inputs,
    n: usize,
    rows: usize,
    r0: usize,
    out: Out,
) {
    use amx_bf16::{products, Weights, ROWS};
    thread_local!(static WEIGHTS: std::cell::RefCell<Weights> = std::cell::RefCell::default());
    let nr = w.len() / cols;
    // Tile `tile`'s sums for input group `g`.
    let put = |g: usize, tile: usize, sums: &amx_bf16::Sums| {
        let (count, first) = ((n - g * ROWS).min(ROWS), tile * ROWS);
        let at = |j: usize| out.0.wrapping_add((g * ROWS + j) * rows + r0 + first);
        // SAFETY: AMX CPUs have AVX-512F (available() asks for AVX-512 BF16 too); the rows
        // stored are this task's (those left from `first`), and g * 16 + j < n.
        unsafe { sums.store((nr - first).min(ROWS), count, at) };
    };
    WEIGHTS.with_borrow_mut(|weights| {
        // SAFETY: the caller checked the CPU; both operands hold rows of `cols` values.
        unsafe {
            weights.copy(w, cols);
            products(weights, inputs.columns(), ahead, put)
        }
    });
}

/// Dot products of `nr` widened weight rows with every input row, written to the output
/// (the portable path).
#[allow(clippy::too_many_arguments)]
fn tile(w: &[f32], nr: usize, cols: usize, x: &[f32], n: usize, rows: usize, r0: usize, out: Out) {
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        for i in 0..nr {
            let v = dot(xt, &w[i * cols..(i + 1) * cols]);
            // SAFETY: row r0 + i belongs to this task; t < n.
            unsafe { *out.0.add(t * rows + r0 + i) = v };
        }
    }
}

const LANES: usize = 8;

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let main = a.len() / LANES * LANES;
    for (x, y) in a[..main].chunks_exact(LANES).zip(b[..main].chunks_exact(LANES)) {
        for j in 0..LANES {
            acc[j] += x[j] * y[j];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in a[main..].iter().zip(&b[main..]) {
        s += x * y;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vector_kernels_match_a_plain_dot_product_for_every_type() {
        let cols = 37; // not a multiple of the lanes
        let w: Vec<f32> = (0..TILE * cols).map(|i| ((i * 7) as f32 * 0.13).sin()).collect();
        let x: Vec<f32> = (0..2 * cols).map(|i| ((i * 3) as f32 * 0.29).cos()).collect();
        let want =
            |t: usize, r: usize, w: &[f32]| -> f32 { (0..cols).map(|k| x[t * cols + k] * w[r * cols + k]).sum() };
        for nr in [TILE, 3] {
            let mut y = vec![0f32; 2 * 8];
            tile(&w, nr, cols, &x, 2, 8, 4, Out(y.as_mut_ptr()));
            // Three inputs on the vector path: a pair and a single.
            #[cfg(target_arch = "x86_64")]
            if simd() {
                let x3: Vec<f32> = (0..3 * cols).map(|i| ((i * 3) as f32 * 0.29).cos()).collect();
                let mut y3 = vec![0f32; 3 * 8];
                // SAFETY: simd() checked the CPU.
                unsafe { rows_simd(&w, nr, cols, &x3, 3, 8, 4, Out(y3.as_mut_ptr())) };
                for t in 0..3 {
                    for r in 0..nr {
                        let want: f32 = (0..cols).map(|k| x3[t * cols + k] * w[r * cols + k]).sum();
                        assert!((y3[t * 8 + 4 + r] - want).abs() < 1e-4, "t {t} r {r}");
                    }
                }
            }
            for t in 0..2 {
                for r in 0..nr {
                    assert!((y[t * 8 + 4 + r] - want(t, r, &w)).abs() < 1e-4);
                }
            }
            #[cfg(target_arch = "x86_64")]
            if simd() {
                let bf: Vec<half::bf16> = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
                let wb: Vec<f32> = bf.iter().map(|v| v.to_f32()).collect();
                let hf: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
                let wh: Vec<f32> = hf.iter().map(|v| v.to_f32()).collect();
                let mut y = vec![0f32; 2 * 8];
                // SAFETY: simd() checked the CPU.
                unsafe { rows_simd(&bf, nr, cols, &x, 2, 8, 4, Out(y.as_mut_ptr())) };
                let mut z = vec![0f32; 2 * 8];
                // SAFETY: as above.
                unsafe { rows_simd(&hf, nr, cols, &x, 2, 8, 4, Out(z.as_mut_ptr())) };
                let mut f = vec![0f32; 2 * 8];
                // SAFETY: as above.
                unsafe { rows_simd(&w, nr, cols, &x, 2, 8, 4, Out(f.as_mut_ptr())) };
                for t in 0..2 {
                    for r in 0..nr {
                        assert!((y[t * 8 + 4 + r] - want(t, r, &wb)).abs() < 1e-4, "bf16");
                        assert!((z[t * 8 + 4 + r] - want(t, r, &wh)).abs() < 1e-4, "f16");
                        assert!((f[t * 8 + 4 + r] - want(t, r, &w)).abs() < 1e-4, "f32");
                    }
                }
            }
        }
    }

    #[test]
    fn the_prefill_gemm_writes_each_task_its_own_rows() {
        let (cols, nr, n, rows, r0) = (37, 5, 11, 12, 6);
        let w: Vec<f32> = (0..nr * cols).map(|i| ((i * 5) as f32 * 0.17).sin()).collect();
        let x: Vec<f32> = (0..n * cols).map(|i| ((i * 11) as f32 * 0.07).cos()).collect();
        let mut y = vec![f32::NAN; n * rows];
        panel_gemm(&w, nr, cols, &x, n, rows, r0, Out(y.as_mut_ptr()));
        for t in 0..n {
            for r in 0..rows {
                let got = y[t * rows + r];
                if (r0..r0 + nr).contains(&r) {
                    let want: f32 = (0..cols).map(|k| x[t * cols + k] * w[(r - r0) * cols + k]).sum();
                    assert!((got - want).abs() < 1e-4, "t {t} r {r}: {got} vs {want}");
                } else {
                    assert!(got.is_nan(), "row {r} belongs to another task");
                }
            }
        }
    }

    /// A bf16 `[rows, cols]` weight in a safetensors file under the temp dir, multiplying in bf16
    /// where the CPU can when `bf16_products` (on AMX tiles too, from `GEMM_MIN_ROWS` inputs, where
    /// it has them and `cols` allows).
    fn bf16_linear(rows: usize, cols: usize, bias: bool, bf16_products: bool) -> Linear {
        let values: Vec<half::bf16> =
            (0..rows * cols).map(|i| half::bf16::from_f32(((i * 7) as f32 * 0.013).sin())).collect();
        let bytes: Vec<u8> = bytemuck::cast_slice(&values).to_vec();
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![rows, cols], &bytes).unwrap();
        // A file of its own: tests running at once may ask for the same shape.
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), safetensors::tensor::serialize([("w", view)], None).unwrap()).unwrap();
        let ck = crate::checkpoint::Checkpoint::open(file.path()).unwrap();
        let b = bias.then(|| (0..rows).map(|r| r as f32 * 0.5).collect());
        Linear::new(ck.get("w", &[rows, cols]).unwrap(), b, bf16_products, true)
    }

    /// `x W^T + b` in f64 over the weight as stored, with the inputs rounded to bf16 when `narrow`.
    fn reference(l: &Linear, x: &[f32], n: usize, narrow: bool) -> Vec<f64> {
        let (rows, cols) = (l.rows, l.cols);
        let mut w = vec![0f32; rows * cols];
        l.widen(0, rows, &mut w);
        let input = |i: usize| if narrow { half::bf16::from_f32(x[i]).to_f32() } else { x[i] } as f64;
        let mut y = vec![0f64; n * rows];
        for t in 0..n {
            for r in 0..rows {
                let dot: f64 = (0..cols).map(|k| input(t * cols + k) * w[r * cols + k] as f64).sum();
                y[t * rows + r] = dot + l.bias.as_ref().map_or(0.0, |b| b[r] as f64);
            }
        }
        y
    }

    /// Every path (dot kernels on the stored weights one, two or three inputs at a time, and the
    /// panel GEMM) computes `x W^T + b`; the dot kernels give the same bits, so a sequence's
    /// logits do not depend on how many others share its decode step.
    #[test]
    fn every_batch_size_computes_the_same_projection() {
        let (rows, cols) = (70, 300); // not multiples of the tile or the panel
        let l = bf16_linear(rows, cols, true, false);
        let x: Vec<f32> = (0..(GEMM_MIN_ROWS + 8) * cols).map(|i| ((i * 3) as f32 * 0.029).cos()).collect();
        let mut alone = Vec::new();
        l.forward(&x[..cols], 1, &mut alone);
        for n in [1, 2, 3, 4, 5, 7, 8, 16, 17, 40, GEMM_MIN_ROWS - 1, GEMM_MIN_ROWS, GEMM_MIN_ROWS + 5] {
            let mut y = Vec::new();
            l.forward(&x[..n * cols], n, &mut y);
            let want = reference(&l, &x[..n * cols], n, false);
            for (i, (got, want)) in y.iter().zip(&want).enumerate() {
                assert!((*got as f64 - want).abs() < 1e-3, "n {n} output {i}: {got} vs {want}");
            }
            if n < GEMM_MIN_ROWS {
                assert_eq!(y[..rows], alone[..], "n {n}: the first input's outputs moved with the batch size");
                // Every input, whichever kernel takes it (the last of a batch among them).
                for t in 1..n {
                    let mut one = Vec::new();
                    l.forward(&x[t * cols..(t + 1) * cols], 1, &mut one);
                    assert_eq!(y[t * rows..(t + 1) * rows], one[..], "n {n} t {t}: not the bits it gets alone");
                }
            }
        }
    }

    /// With bf16 products (where the CPU has AVX-512 BF16), each output is the exact sum of the
    /// products of the weights and the inputs rounded to bf16, to f32 rounding, and its bits are
    /// the same at every batch size: six, the rest, or one at a time, and prefill chunks too
    /// where the CPU has no AMX. With AMX (and rows of whole tile steps), chunks of
    /// `GEMM_MIN_ROWS` inputs or more run on tiles: the same sums to f32 rounding, summed in
    /// another order.
    #[test]
    fn bf16_products_sum_the_rounded_inputs_and_give_the_same_bits_at_every_batch_size() {
        // Rows not a multiple of the tile; columns not a multiple of 32 lanes, then a multiple
        // (AMX's tile steps).
        for cols in [300, 320] {
            let rows = 70;
            let l = bf16_linear(rows, cols, true, true);
            assert_eq!(l.bf16_products, bf16_products_here());
            if !l.bf16_products {
                eprintln!("no AVX-512 BF16 on this CPU: its projections multiply in f32");
                return;
            }
            assert_eq!(l.amx, amx_here(cols));
            let x: Vec<f32> = (0..100 * cols).map(|i| ((i * 3) as f32 * 0.029).cos() * 3.7).collect();
            let mut alone: Vec<Vec<f32>> = Vec::new();
            for t in 0..100 {
                let mut y = Vec::new();
                l.forward(&x[t * cols..(t + 1) * cols], 1, &mut y);
                alone.push(y);
            }
            for n in [1, 2, 5, 6, 7, 13, GEMM_MIN_ROWS - 1, GEMM_MIN_ROWS, 100] {
                let mut y = Vec::new();
                l.forward(&x[..n * cols], n, &mut y);
                let (narrowed, plain) =
                    (reference(&l, &x[..n * cols], n, true), reference(&l, &x[..n * cols], n, false));
                let (mut off_narrowed, mut off_plain) = (0f64, 0f64);
                for i in 0..n * rows {
                    off_narrowed = off_narrowed.max((y[i] as f64 - narrowed[i]).abs());
                    off_plain = off_plain.max((y[i] as f64 - plain[i]).abs());
                }
                assert!(off_narrowed < 1e-3, "cols {cols} n {n}: {off_narrowed} from the rounded inputs' products");
                // The rounding itself is visible: these are not the f32 products.
                assert!(off_plain > 10.0 * off_narrowed, "cols {cols} n {n}: {off_plain} vs {off_narrowed}");
                let tiles = l.amx && n >= GEMM_MIN_ROWS;
                let same = (0..n).filter(|&t| y[t * rows..(t + 1) * rows] == alone[t][..]).count();
                if tiles {
                    // Another order: some outputs' last bits differ from the dot kernels'.
                    assert!(same < n, "cols {cols} n {n}: tile products gave the dot kernels' bits");
                } else {
                    assert_eq!(same, n, "cols {cols} n {n}: not the bits each input gets alone");
                }
            }
        }
    }

    /// `cargo test --release -p llmr-native-engine --lib kernels::linear::tests::bench --
    /// --ignored --nocapture`: one layer's projections of SmolLM2 and Gemma 3 (bf16) on each
    /// kernel family for growing input counts, the best of 20 rounds, to place `GEMM_MIN_ROWS`
    /// and to see what bf16 products gain on a CPU.
    #[test]
    #[ignore]
    fn bench() {
        let layers = [
            ("SmolLM2", [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]),
            ("Gemma 3", [(1024, 640), (256, 640), (256, 640), (640, 1024), (2048, 640), (2048, 640), (640, 2048)]),
        ];
        for (model, shapes) in layers {
            let linears: Vec<Linear> = shapes.iter().map(|&(r, c)| bf16_linear(r, c, false, true)).collect();
            let bf16 = linears.iter().all(|l| l.bf16_products);
            let amx = linears.iter().all(|l| l.amx);
            for n in [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256] {
                let x: Vec<f32> = (0..n * 2048).map(|i| ((i * 3) as f32 * 0.029).cos()).collect();
                let time = |kernels: Kernels| {
                    let mut y = Vec::new();
                    let mut round = || {
                        let start = std::time::Instant::now();
                        for l in &linears {
                            forward_many_on(&mut [(l, &mut y)], &x[..n * l.cols], n, kernels);
                        }
                        start.elapsed().as_secs_f64()
                    };
                    (0..20).map(|_| round()).fold(f64::INFINITY, f64::min) * 1e3
                };
                let (dot, gemm) = (time(Kernels::Dot), time(Kernels::Gemm));
                let bf = if bf16 { time(Kernels::Bf16) } else { f64::NAN };
                let amx = if amx { time(Kernels::Amx) } else { f64::NAN };
                println!(
                    "{model} n {n:3}: dot {dot:7.3} ms, GEMM {gemm:7.3} ms, bf16 {bf:7.3} ms, AMX {amx:7.3} ms a \
                     layer; dot / GEMM {:.2}, bf16 / min {:.2}, AMX / bf16 {:.2}",
                    dot / gemm,
                    bf / dot.min(gemm),
                    amx / bf
                );
            }
        }
        // One input over a weight far larger than the caches (a quarter of Gemma 3's output
        // head): single-sequence decode, where reading memory is the cost.
        let head = bf16_linear(65536, 640, false, true);
        let x: Vec<f32> = (0..640).map(|i| (i as f32 * 0.07).cos()).collect();
        for kernels in [Kernels::Dot, Kernels::Bf16, Kernels::Amx] {
            if (kernels == Kernels::Bf16 && !head.bf16_products) || (kernels == Kernels::Amx && !head.amx) {
                continue;
            }
            let mut y = Vec::new();
            let best = (0..20)
                .map(|_| {
                    let start = std::time::Instant::now();
                    forward_many_on(&mut [(&head, &mut y)], &x, 1, kernels);
                    start.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min);
            println!(
                "65536 x 640, one input, {kernels:?}: {:.3} ms, {:.1} GB/s",
                best * 1e3,
                65536.0 * 1280.0 / best / 1e9
            );
        }
    }

    #[test]
    fn bf16_widening_is_exact() {
        let values = [1.0f32, -2.5, 3.140625, 0.0, -0.0078125];
        let bits: Vec<u16> = values.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
        let mut out = vec![0f32; values.len()];
        widen_bf16(&bits, &mut out);
        assert_eq!(out, values);
    }
}
