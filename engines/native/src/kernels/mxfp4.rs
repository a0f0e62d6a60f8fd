//! `y = x W^T` for a weight stored in OpenAI's MXFP4 layout (gpt-oss expert weights as shipped
//! in safetensors), computed in f32 straight from the mapped bytes.
//!
//! A matrix `W` of `rows x cols` (`cols` a multiple of 32) is two byte arrays: `blocks`
//! `[rows, cols / 32, 16]` and `scales` `[rows, cols / 32]`. Group `g` of row `r` holds the 32
//! weights `W[r, 32g..32g + 32]`: byte `j` of the group carries `W[r, 32g + 2j]` in its low nibble
//! and `W[r, 32g + 2j + 1]` in its high nibble, each an FP4 (e2m1) code: a sign bit and one of
//! the magnitudes `0, .5, 1, 1.5, 2, 3, 4, 6`. The group's scale byte `s` is an e8m0 exponent:
//! the weights are `FP4 * 2^(s - 127)`. `s = 0` is the subnormal `2^-127`; `s = 255` is NaN, as
//! the OCP MX specification defines it (the real checkpoints use `s` in about `100..=135`). Every
//! product `FP4 * 2^(s - 127)` is exact in f32 (or overflows to infinity, for `s >= 253`), so all
//! paths dequantize to the same values.
//!
//! Work is split over output rows on the caller's rayon pool, and each call reads every weight
//! byte from memory once, whatever the number of inputs `n`:
//! - on AVX2 + FMA CPUs (module `avx2`), for `n < 40` (decode), a task decodes its weight rows in
//!   registers and uses each decoded weight for up to eight inputs at once (more inputs decode the
//!   row again, from cache), a block of columns at a time so that the inputs stay in L1;
//! - for `n >= 40` (prefill), and for every `n` on other CPUs (the portable path), a task
//!   dequantizes a panel of rows to f32 and runs a GEMM over it (the `gemm` crate's).

use super::panel::{panel_gemm, Out};
use rayon::prelude::*;

/// The FP4 (e2m1) values by code: bit 3 is the sign.
const FP4: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// `2^(s - 127)` for each e8m0 byte `s`: the f32 whose exponent field is `s`, except `s = 0`
/// (`2^-127`, a subnormal: only the mantissa's top bit) and `s = 255` (NaN).
static SCALE: [f32; 256] = scale_table();

const fn scale_table() -> [f32; 256] {
    let mut t = [0f32; 256];
    t[0] = f32::from_bits(0x0040_0000);
    let mut s = 1;
    while s < 255 {
        t[s] = f32::from_bits((s as u32) << 23);
        s += 1;
    }
    t[255] = f32::NAN;
    t
}

/// Weight rows a task dequantizes to f32 for a GEMM.
const PANEL: usize = 32;

/// One MXFP4 matrix `[rows, cols]` borrowed from the mapped checkpoint.
#[derive(Clone, Copy)]
pub struct Mxfp4<'a> {
    pub blocks: &'a [u8],
    pub scales: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

/// Which kernels run: [`Mxfp4::matmul`] picks the fastest the CPU has; tests pick each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Kernel {
    fn best() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            return Kernel::Avx2;
        }
        Kernel::Portable
    }
}

impl<'a> Mxfp4<'a> {
    /// Checks the byte lengths against `rows`/`cols` (`cols % 32 == 0`); `Err` names what is
    /// wrong.
    pub fn new(blocks: &'a [u8], scales: &'a [u8], rows: usize, cols: usize) -> Result<Self, String> {
        if !cols.is_multiple_of(32) {
            return Err(format!("MXFP4: {cols} columns is not a multiple of 32"));
        }
        let groups = rows.checked_mul(cols / 32).ok_or_else(|| format!("MXFP4: {rows} x {cols} overflows"))?;
        let want_blocks = groups.checked_mul(16).ok_or_else(|| format!("MXFP4: {rows} x {cols} overflows"))?;
        if blocks.len() != want_blocks {
            return Err(format!(
                "MXFP4 blocks: {} bytes, expected {want_blocks} ([{rows}, {}, 16] for {rows} x {cols})",
                blocks.len(),
                cols / 32
            ));
        }
        if scales.len() != groups {
            return Err(format!(
                "MXFP4 scales: {} bytes, expected {groups} ([{rows}, {}] for {rows} x {cols})",
                scales.len(),
                cols / 32
            ));
        }
        Ok(Mxfp4 { blocks, scales, rows, cols })
    }

    fn groups(&self) -> usize {
        self.cols / 32
    }

    /// Row `r` as f32 into `out` (len `cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "MXFP4 row {r} of {}", self.rows);
        assert_eq!(out.len(), self.cols);
        self.dequantize_rows(r, r + 1, out);
    }

    /// Rows `r0..r1` as f32 into `dst[..(r1 - r0) * cols]`.
    fn dequantize_rows(&self, r0: usize, r1: usize, dst: &mut [f32]) {
        let g = self.groups();
        let blocks = &self.blocks[r0 * g * 16..r1 * g * 16];
        let scales = &self.scales[r0 * g..r1 * g];
        dequantize_portable(blocks, scales, &mut dst[..(r1 - r0) * self.cols]);
    }

    /// `x`: `n x cols` (row-major f32); writes `y`: `n x rows` (row-major, overwritten,
    /// `y.len() == n * rows`).
    ///
    /// Parallel over output rows with rayon (run it inside the model's pool); each weight byte is
    /// read from memory once per call and serves all `n` inputs. The fastest kernels the CPU has
    /// run (checked once, cached).
    pub fn matmul(&self, x: &[f32], n: usize, y: &mut [f32]) {
        self.matmul_with(Kernel::best(), x, n, y);
    }

    fn matmul_with(&self, kernel: Kernel, x: &[f32], n: usize, y: &mut [f32]) {
        let (rows, cols) = (self.rows, self.cols);
        assert_eq!(x.len(), n * cols, "MXFP4 matmul: x is not {n} x {cols}");
        assert_eq!(y.len(), n * rows, "MXFP4 matmul: y is not {n} x {rows}");
        if y.is_empty() {
            return;
        }
        if cols == 0 {
            y.fill(0.0);
            return;
        }
        match kernel {
            Kernel::Portable => self.matmul_portable(x, n, y),
            // SAFETY: Kernel::Avx2 is only chosen where avx2::available() said yes.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::matmul(self, x, n, y) },
        }
    }

    /// The portable path: each task dequantizes a panel of weight rows to f32 and runs a GEMM
    /// (the `gemm` crate's, vectorised for the CPU) over it with all `n` inputs. Measured on one
    /// Zen 3 core, 2880 x 2880, this beat dot products over an L1-sized tile of rows even for one
    /// input (2.8 ms against 3.3; 5.2 against 10.0 for eight).
    fn matmul_portable(&self, x: &[f32], n: usize, y: &mut [f32]) {
        let (rows, cols) = (self.rows, self.cols);
        let out = Out(y.as_mut_ptr());
        let panels = rows.div_ceil(PANEL);
        // Enough tasks to balance, few enough that each amortises its scheduling.
        let per_task = (panels / (rayon::current_num_threads() * 4)).max(1);
        (0..panels).into_par_iter().with_min_len(per_task).for_each_init(Vec::new, |scratch: &mut Vec<f32>, panel| {
            let r0 = panel * PANEL;
            let r1 = (r0 + PANEL).min(rows);
            scratch.resize(PANEL * cols, 0.0);
            self.dequantize_rows(r0, r1, scratch);
            panel_gemm(&scratch[..(r1 - r0) * cols], r1 - r0, cols, x, n, rows, r0, out);
        });
    }
}

/// `dst` = the weights of the groups `blocks` (16 bytes each) with their `scales`.
fn dequantize_portable(blocks: &[u8], scales: &[u8], dst: &mut [f32]) {
    for ((b, &s), o) in blocks.chunks_exact(16).zip(scales).zip(dst.chunks_exact_mut(32)) {
        let s = SCALE[s as usize];
        for (&b, o) in b.iter().zip(o.chunks_exact_mut(2)) {
            o[0] = FP4[(b & 15) as usize] * s;
            o[1] = FP4[(b >> 4) as usize] * s;
        }
    }
}

/// The AVX2 + FMA kernels.
///
/// A group's 16 bytes become its 32 FP4 codes in one register (the bytes in both halves, the
/// upper half shifted right by four, masked to a nibble), and two byte lookups (`vpshufb`) give
/// the low and high byte of each weight as bf16: every FP4 value is exact in bf16. Interleaving
/// the two (`vpunpck*bw`) makes 32 bf16 values, and an f32 is a bf16 in the upper half of a 32-bit
/// lane: a shift left by 16 for the even halves, a mask for the odd ones. No conversion
/// instruction is needed, but the weights come out of a group in a fixed shuffled order
/// ([`ORDER`]), so the inputs are permuted the same way once per call.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{panel_gemm, Mxfp4, Out, FP4, PANEL, SCALE};
    use crate::kernels::avx2::hsum;
    use rayon::prelude::*;
    use std::arch::x86_64::*;

    /// Whether these kernels can run (the answer is cached by the standard library).
    pub fn available() -> bool {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }

    /// Slot `i` of a decoded group (register `i / 8`, lane `i % 8`) holds the group's weight
    /// `ORDER[i]`.
    pub const ORDER: [usize; 32] = order();

    const fn order() -> [usize; 32] {
        let mut o = [0; 32];
        let mut i = 0;
        while i < 32 {
            // Register q: the bf16 pairs of unpack-low (q < 2) or unpack-high (q >= 2), their low
            // (q even) or high (q odd) halves; lanes 0..4 from the low nibbles, 4..8 the high.
            let (q, j) = (i / 8, i % 8);
            o[i] = 16 * (q / 2) + 2 * (q % 2) + 4 * (j % 4) + j / 4;
            i += 1;
        }
        o
    }

    /// The low (`high == false`) or high byte of each FP4 code's bf16, twice (one per 128-bit
    /// lane, as `vpshufb` looks up within lanes).
    const fn bf16_bytes(high: bool) -> [u8; 32] {
        let mut t = [0u8; 32];
        let mut i = 0;
        while i < 32 {
            let bits = FP4[i % 16].to_bits() >> 16;
            t[i] = if high { (bits >> 8) as u8 } else { bits as u8 };
            i += 1;
        }
        t
    }
    static BF16_LOW: [u8; 32] = bf16_bytes(false);
    static BF16_HIGH: [u8; 32] = bf16_bytes(true);

    /// Registers every group needs.
    #[derive(Clone, Copy)]
    struct Consts {
        low: __m256i,
        high: __m256i,
        /// Per 64-bit lane: 0 in the lower 128 bits (low nibbles), 4 in the upper (high ones).
        shifts: __m256i,
        nibble: __m256i,
        upper16: __m256i,
    }

    #[inline(always)]
    unsafe fn consts() -> Consts {
        // SAFETY: the tables hold 32 bytes each; the caller runs with AVX2.
        unsafe {
            Consts {
                low: _mm256_loadu_si256(BF16_LOW.as_ptr() as *const __m256i),
                high: _mm256_loadu_si256(BF16_HIGH.as_ptr() as *const __m256i),
                shifts: _mm256_setr_epi64x(0, 0, 4, 4),
                nibble: _mm256_set1_epi8(0x0f),
                upper16: _mm256_set1_epi32(0xffff_0000u32 as i32),
            }
        }
    }

    /// The 32 weights (unscaled FP4 values) of the group at `p`, in [`ORDER`].
    ///
    /// # Safety
    /// `p..p + 16` must be readable; the CPU must have AVX2.
    #[inline(always)]
    unsafe fn decode(c: Consts, p: *const u8) -> [__m256; 4] {
        // SAFETY: the caller guarantees sixteen readable bytes and AVX2.
        unsafe {
            let bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
            let codes = _mm256_and_si256(_mm256_srlv_epi64(bytes, c.shifts), c.nibble);
            let (lo, hi) = (_mm256_shuffle_epi8(c.low, codes), _mm256_shuffle_epi8(c.high, codes));
            let (a, b) = (_mm256_unpacklo_epi8(lo, hi), _mm256_unpackhi_epi8(lo, hi));
            [
                _mm256_castsi256_ps(_mm256_slli_epi32(a, 16)),
                _mm256_castsi256_ps(_mm256_and_si256(a, c.upper16)),
                _mm256_castsi256_ps(_mm256_slli_epi32(b, 16)),
                _mm256_castsi256_ps(_mm256_and_si256(b, c.upper16)),
            ]
        }
    }

    /// `x` (`n` rows of `cols`) with each group of 32 in [`ORDER`], into `buf`, returned at its
    /// first 64-byte boundary: the kernels' loads then never straddle cache lines (with the
    /// allocator's 16-byte alignment, half of them did, and decode with 8 inputs ran 40% slower).
    pub fn permute_inputs<'b>(x: &[f32], buf: &'b mut Vec<f32>) -> &'b [f32] {
        buf.clear();
        buf.resize(x.len() + 16, 0.0);
        let start = buf.as_ptr().align_offset(64).min(16);
        let xp = &mut buf[start..start + x.len()];
        for (d, s) in xp.chunks_exact_mut(32).zip(x.chunks_exact(32)) {
            for (d, &k) in d.iter_mut().zip(&ORDER) {
                *d = s[k];
            }
        }
        xp
    }

    /// Dequantizes whole groups, `blocks` (16 bytes each) with their `scales`, into `dst`
    /// (32 values each, in [`ORDER`]).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dequantize_ordered(blocks: &[u8], scales: &[u8], dst: &mut [f32]) {
        let groups = scales.len();
        assert!(blocks.len() >= groups * 16 && dst.len() >= groups * 32);
        // SAFETY: register-only and the tables.
        let c = unsafe { consts() };
        for (g, &s) in scales.iter().enumerate() {
            // SAFETY: group g < groups: its 16 bytes and 32 outputs are inside the slices
            // (asserted above).
            unsafe {
                let w = decode(c, blocks.as_ptr().add(16 * g));
                let s = _mm256_set1_ps(SCALE[s as usize]);
                let o = dst.as_mut_ptr().add(32 * g);
                for (q, w) in w.into_iter().enumerate() {
                    _mm256_storeu_ps(o.add(8 * q), _mm256_mul_ps(w, s));
                }
            }
        }
    }

    /// `y = x W^T`, as [`Mxfp4::matmul`] (whose checks it relies on).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    pub unsafe fn matmul(m: &Mxfp4, x: &[f32], n: usize, y: &mut [f32]) {
        let (rows, cols) = (m.rows, m.cols);
        assert!(x.len() == n * cols && y.len() == n * rows);
        let mut buf = Vec::new();
        let xp = permute_inputs(x, &mut buf);
        let out = Out(y.as_mut_ptr());
        let g = m.groups();
        let task_rows = if n >= GEMM_MIN_ROWS { PANEL } else { TASK_ROWS };
        let tasks = rows.div_ceil(task_rows);
        let per_task = (tasks / (rayon::current_num_threads() * 4)).max(1);
        (0..tasks).into_par_iter().with_min_len(per_task).for_each_init(Vec::new, |scratch: &mut Vec<f32>, task| {
            let r0 = task * task_rows;
            let r1 = (r0 + task_rows).min(rows);
            if n >= GEMM_MIN_ROWS {
                scratch.resize(PANEL * cols, 0.0);
                // SAFETY: the caller checked the CPU.
                unsafe { dequantize_ordered(&m.blocks[r0 * g * 16..r1 * g * 16], &m.scales[r0 * g..r1 * g], scratch) };
                // Same permutation on both sides: the products are unchanged.
                panel_gemm(&scratch[..(r1 - r0) * cols], r1 - r0, cols, xp, n, rows, r0, out);
            } else {
                // SAFETY: the caller checked the CPU; rows r0..r1 are this task's, r1 <= rows.
                unsafe { rows_into(m, r0, r1, xp, n, out, scratch) };
            }
        });
    }

    /// From this many inputs on, a task dequantizes a panel of weight rows and runs a GEMM over
    /// it. Measured on one Zen 3 core, 2880 x 2880: the direct kernels took 0.64x the GEMM's time
    /// at 16 inputs, 0.88x at 24, 0.93x at 32, 1.31x at 48.
    const GEMM_MIN_ROWS: usize = 40;
    /// Weight rows per decode task: the inputs' column block is reused across them.
    const TASK_ROWS: usize = 16;
    /// The bytes of inputs a column block spans (all `n` inputs): they stay in L1 while a task
    /// runs every row's block over them.
    const BLOCK_BYTES: usize = 24 * 1024;
    /// How many rows ahead the blocked loop prefetches (measured: 2 was best, cold caches).
    const PREFETCH_ROWS: usize = 2;

    /// Output rows `r0..r1` for all `n` inputs `xp` (permuted): each weight row is decoded once
    /// per block of columns and at most eight inputs; every decoded weight serves all of them.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `r1 <= m.rows`, `xp` is `n x cols`, `out` is `n x rows`
    /// and its rows `r0..r1` belong to the caller.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_into(m: &Mxfp4, r0: usize, r1: usize, xp: &[f32], n: usize, out: Out, acc: &mut Vec<f32>) {
        let (g, cols) = (m.groups(), m.cols);
        assert!(r1 <= m.rows && xp.len() == n * cols && m.blocks.len() >= r1 * g * 16 && m.scales.len() >= r1 * g);
        // One 8-lane partial sum per (row, input), carried across the column blocks.
        acc.clear();
        acc.resize((r1 - r0) * n * 8, 0.0);
        let blocks = g.div_ceil((BLOCK_BYTES / (n * 128)).max(1));
        let per_block = g.div_ceil(blocks);
        let mut g0 = 0;
        while g0 < g {
            let g1 = (g0 + per_block).min(g);
            for r in r0..r1 {
                if blocks > 1 {
                    // Blocks of columns read the weights in short strided pieces, which the
                    // hardware prefetchers follow less well than a stream: ask for a later row's
                    // piece (prefetching past the matrix is harmless: it never faults).
                    let ahead = (r + PREFETCH_ROWS) * g * 16;
                    let mut b = ahead + g0 * 16;
                    while b < ahead + g1 * 16 {
                        _mm_prefetch(m.blocks.as_ptr().wrapping_add(b) as *const i8, _MM_HINT_T0);
                        b += 64;
                    }
                    _mm_prefetch(
                        m.scales.as_ptr().wrapping_add((r + PREFETCH_ROWS) * g + g0) as *const i8,
                        _MM_HINT_T0,
                    );
                }
                let mut t = 0;
                while t < n {
                    // SAFETY: the CPU was checked; row r < r1 <= rows (asserted: its groups are
                    // inside blocks and scales); span_any takes min(n - t, 8) inputs from t,
                    // inside xp (n x cols), and as many accumulators from (r, t), inside acc.
                    t += unsafe {
                        span_any(
                            m.blocks.as_ptr().add(r * g * 16),
                            m.scales.as_ptr().add(r * g),
                            g0,
                            g1,
                            xp.as_ptr().add(t * cols),
                            cols,
                            acc.as_mut_ptr().add(((r - r0) * n + t) * 8),
                            n - t,
                        )
                    };
                }
            }
            g0 = g1;
        }
        for r in r0..r1 {
            for t in 0..n {
                // SAFETY: the accumulator lies inside acc; row r belongs to this task, t < n.
                unsafe {
                    let v = hsum(_mm256_loadu_ps(acc.as_ptr().add(((r - r0) * n + t) * 8)));
                    *out.0.add(t * m.rows + r) = v;
                }
            }
        }
    }

    /// [`span`] over the next `min(left, 8)` inputs; returns how many it took.
    ///
    /// # Safety
    /// As [`span`], for that many inputs.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn span_any(
        blocks: *const u8,
        scales: *const u8,
        g0: usize,
        g1: usize,
        x: *const f32,
        cols: usize,
        acc: *mut f32,
        left: usize,
    ) -> usize {
        // SAFETY: the caller's contract, for the chunk taken.
        unsafe {
            match left {
                1 => span::<1, 1>(blocks, scales, g0, g1, x, cols, acc),
                2 => span::<2, 2>(blocks, scales, g0, g1, x, cols, acc),
                3 => span::<3, 2>(blocks, scales, g0, g1, x, cols, acc),
                4 => span::<4, 2>(blocks, scales, g0, g1, x, cols, acc),
                5 => span::<5, 2>(blocks, scales, g0, g1, x, cols, acc),
                6 => span::<6, 1>(blocks, scales, g0, g1, x, cols, acc),
                7 => span::<7, 1>(blocks, scales, g0, g1, x, cols, acc),
                _ => span::<8, 1>(blocks, scales, g0, g1, x, cols, acc),
            }
        }
    }

    /// Adds to the `N` accumulators at `acc` (8 lanes each) the products of one weight row's
    /// groups `g0..g1` (`blocks`, `scales` at the row's start) with the `N` inputs at `x`
    /// (`cols` apart, permuted), `A` independent sums per input to hide the FMA latency.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; the row's groups `..g1`, the inputs' `32 * g1` values and
    /// `8 * N` accumulators must be readable (and those writable).
    #[inline(always)]
    unsafe fn span<const N: usize, const A: usize>(
        blocks: *const u8,
        scales: *const u8,
        g0: usize,
        g1: usize,
        x: *const f32,
        cols: usize,
        acc: *mut f32,
    ) -> usize {
        // SAFETY: every access is inside the ranges the caller guarantees.
        unsafe {
            let c = consts();
            let mut sums = [[_mm256_setzero_ps(); A]; N];
            for (t, s) in sums.iter_mut().enumerate() {
                s[0] = _mm256_loadu_ps(acc.add(8 * t));
            }
            for g in g0..g1 {
                let w = decode(c, blocks.add(16 * g));
                let s = _mm256_set1_ps(SCALE[*scales.add(g) as usize]);
                let xg = x.add(32 * g);
                if N == 1 {
                    // One input: scale the group's partial sum (one multiply instead of four).
                    let mut p = _mm256_mul_ps(w[0], _mm256_loadu_ps(xg));
                    for (q, &w) in w.iter().enumerate().skip(1) {
                        p = _mm256_fmadd_ps(w, _mm256_loadu_ps(xg.add(8 * q)), p);
                    }
                    sums[0][0] = _mm256_fmadd_ps(p, s, sums[0][0]);
                } else {
                    let w = [
                        _mm256_mul_ps(w[0], s),
                        _mm256_mul_ps(w[1], s),
                        _mm256_mul_ps(w[2], s),
                        _mm256_mul_ps(w[3], s),
                    ];
                    for (t, sum) in sums.iter_mut().enumerate() {
                        for (q, &w) in w.iter().enumerate() {
                            sum[q % A] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xg.add(t * cols + 8 * q)), sum[q % A]);
                        }
                    }
                }
            }
            for (t, s) in sums.iter().enumerate() {
                let mut v = s[0];
                for &s in &s[1..] {
                    v = _mm256_add_ps(v, s);
                }
                _mm256_storeu_ps(acc.add(8 * t), v);
            }
        }
        N
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn byte(&mut self) -> u8 {
            (self.next() >> 56) as u8
        }
        fn unit(&mut self) -> f32 {
            ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    /// The rule, read literally: `W[r, 32g + 2j]` is the low nibble of `blocks[r, g, j]`,
    /// `W[r, 32g + 2j + 1]` the high one, times `2^(scales[r, g] - 127)`.
    fn rule(blocks: &[u8], scales: &[u8], cols: usize, r: usize, c: usize) -> f64 {
        let (g, j) = (c / 32, (c % 32) / 2);
        let groups = cols / 32;
        let b = blocks[(r * groups + g) * 16 + j];
        let nibble = if c.is_multiple_of(2) { b & 15 } else { b >> 4 };
        let magnitude = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][(nibble & 7) as usize];
        let sign = if nibble & 8 != 0 { -1.0 } else { 1.0 };
        sign * magnitude * 2f64.powi(scales[r * groups + g] as i32 - 127)
    }

    fn random_matrix(rng: &mut Rng, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
        let blocks = (0..rows * cols / 2).map(|_| rng.byte()).collect();
        // The range the checkpoints use, around 1.0.
        let scales = (0..rows * cols / 32).map(|_| 117 + rng.byte() % 20).collect();
        (blocks, scales)
    }

    fn kernels() -> Vec<Kernel> {
        let mut k = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            k.push(Kernel::Avx2);
        }
        k
    }

    #[test]
    fn dequantize_row_follows_the_rule() {
        // Two rows of 64: every code in both nibbles, and scales 127 (1.0), 128, 120, 135, 0.
        let mut blocks = vec![0u8; 2 * 2 * 16];
        for (i, b) in blocks.iter_mut().enumerate() {
            *b = ((i % 16) as u8) | ((15 - (i * 7) % 16) as u8) << 4;
        }
        // Row 0, group 0: byte 0 = 0x_5 low, 0x_A high by hand: W[0,0] = 3.0, W[0,1] = -1.0.
        blocks[0] = 0xA5;
        // The sign nibble alone: -0.
        blocks[1] = 0x08;
        let scales = [127u8, 128, 120, 0];
        let m = Mxfp4::new(&blocks, &scales, 2, 64).unwrap();
        let mut row = vec![f32::NAN; 64];
        m.dequantize_row(0, &mut row);
        assert_eq!(row[0], 3.0);
        assert_eq!(row[1], -1.0);
        assert_eq!(row[2], 0.0);
        assert!(row[2].is_sign_negative() && row[3] == 0.0 && row[3].is_sign_positive());
        // Group 1 has scale 128: byte 16 (i = 16: low 0, high 15 - 112 % 16 = 15) -> 0, -12.
        assert_eq!(row[32], 0.0);
        assert_eq!(row[33], -12.0);
        for r in 0..2 {
            m.dequantize_row(r, &mut row);
            for (c, &v) in row.iter().enumerate() {
                assert_eq!(v as f64, rule(&blocks, &scales, 64, r, c), "row {r} col {c}");
            }
        }
        // s = 0: 2^-127, a subnormal (6 * 2^-127 = 1.5 * 2^-125).
        m.dequantize_row(1, &mut row);
        assert_eq!(row[32..].iter().map(|v| v.abs()).fold(0.0, f32::max), 6.0 * 2f32.powi(-127));
        // s = 255 is NaN.
        let nan = [255u8];
        let m = Mxfp4::new(&blocks[..16], &nan, 1, 32).unwrap();
        let mut row = vec![0f32; 32];
        m.dequantize_row(0, &mut row);
        assert!(row.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn every_dequantizer_follows_the_rule() {
        let mut rng = Rng(7);
        let (rows, cols) = (5, 96);
        let (blocks, mut scales) = random_matrix(&mut rng, rows, cols);
        // The extremes: 2^-127 (subnormal), 2^-126, 2^127 (where |FP4| >= 2 overflows).
        scales[0] = 0;
        scales[1] = 1;
        scales[2] = 254;
        let m = Mxfp4::new(&blocks, &scales, rows, cols).unwrap();
        // Rounded to f32: the overflows become infinities.
        let want = |r: usize, c: usize| rule(&blocks, &scales, cols, r, c) as f32;
        let mut all = vec![f32::NAN; rows * cols];
        m.dequantize_rows(0, rows, &mut all);
        for r in 0..rows {
            for c in 0..cols {
                assert_eq!(all[r * cols + c], want(r, c), "portable {r} {c}");
            }
        }
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            let mut all = vec![f32::NAN; rows * cols];
            // SAFETY: available() checked the CPU.
            unsafe { avx2::dequantize_ordered(&blocks, &scales, &mut all) };
            for r in 0..rows {
                for c in 0..cols {
                    let (g, i) = (c / 32, c % 32);
                    let got = all[r * cols + 32 * g + i];
                    let want = want(r, 32 * g + avx2::ORDER[i]);
                    assert!(got == want || got.is_nan() && want.is_nan(), "avx2 {r} {c}: {got} vs {want}");
                    assert_eq!(got.is_sign_negative(), want.is_sign_negative(), "avx2 {r} {c}");
                }
            }
            let mut order = avx2::ORDER;
            order.sort();
            assert!(order.iter().enumerate().all(|(i, &k)| i == k), "ORDER is a permutation");
        }
    }

    #[test]
    fn matmul_matches_an_f64_reference_on_every_path() {
        let mut rng = Rng(0x1234_5678);
        for k in [1, 3, 90] {
            let cols = 32 * k;
            // Row counts around and past the tasks' 16 (AVX2 decode) and 32 (GEMM panels) rows.
            for rows in [1, 3, 7, 37] {
                let (blocks, scales) = random_matrix(&mut rng, rows, cols);
                let m = Mxfp4::new(&blocks, &scales, rows, cols).unwrap();
                let w: Vec<f64> = (0..rows * cols).map(|i| rule(&blocks, &scales, cols, i / cols, i % cols)).collect();
                // Every input chunk of the AVX2 decode (1..=8, then 8s and a rest) and the GEMM
                // path (from 40).
                for n in [1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 23, 39, 40] {
                    let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
                    // y[t, r] and the sum of the magnitudes of its terms (the scale of its error).
                    let want: Vec<(f64, f64)> = (0..n * rows)
                        .map(|i| {
                            let (t, r) = (i / rows, i % rows);
                            let terms = (0..cols).map(|c| w[r * cols + c] * x[t * cols + c] as f64);
                            terms.fold((0.0, 0.0), |(s, a), p| (s + p, a + p.abs()))
                        })
                        .collect();
                    for kernel in kernels() {
                        let mut y = vec![f32::NAN; n * rows];
                        m.matmul_with(kernel, &x, n, &mut y);
                        for (i, (&got, &(want, size))) in y.iter().zip(&want).enumerate() {
                            assert!(
                                (got as f64 - want).abs() <= 1e-5 * size,
                                "{kernel:?} rows {rows} cols {cols} n {n}: y[{}, {}] = {got}, want {want}",
                                i / rows,
                                i % rows
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn matmul_overwrites_and_handles_empty_shapes() {
        // The public entry (the best kernel) overwrites y.
        let mut rng = Rng(3);
        let (blocks, scales) = random_matrix(&mut rng, 5, 64);
        let m = Mxfp4::new(&blocks, &scales, 5, 64).unwrap();
        let x: Vec<f32> = (0..2 * 64).map(|_| rng.unit()).collect();
        let (mut y, mut z) = (vec![f32::NAN; 10], vec![0f32; 10]);
        m.matmul(&x, 2, &mut y);
        m.matmul_with(Kernel::Portable, &x, 2, &mut z);
        assert!(y.iter().zip(&z).all(|(a, b)| (a - b).abs() <= 1e-5 * (1.0 + b.abs())), "{y:?} vs {z:?}");
        let m = Mxfp4::new(&[], &[], 3, 0).unwrap();
        let mut y = vec![f32::NAN; 6];
        m.matmul(&[], 2, &mut y);
        assert_eq!(y, [0.0; 6]);
        let m = Mxfp4::new(&[], &[], 0, 64).unwrap();
        m.matmul(&[0.0; 128], 2, &mut []);
    }

    #[test]
    fn new_refuses_wrong_shapes() {
        let (blocks, scales) = (vec![0u8; 2 * 3 * 16], vec![0u8; 2 * 3]);
        assert!(Mxfp4::new(&blocks, &scales, 2, 96).is_ok());
        let e = Mxfp4::new(&blocks, &scales, 2, 95).err().unwrap();
        assert!(e.contains("multiple of 32"), "{e}");
        let e = Mxfp4::new(&blocks[1..], &scales, 2, 96).err().unwrap();
        assert!(e.contains("blocks"), "{e}");
        let e = Mxfp4::new(&blocks, &scales[1..], 2, 96).err().unwrap();
        assert!(e.contains("scales"), "{e}");
        let e = Mxfp4::new(&blocks, &scales, 3, 96).err().unwrap();
        assert!(e.contains("blocks"), "{e}");
        assert!(Mxfp4::new(&blocks, &scales, 1, 192).is_ok_and(|m| m.rows == 1 && m.cols == 192));
        assert!(Mxfp4::new(&[], &[], usize::MAX, 64).is_err());
    }

    /// `cargo test --release -p llmr-native-engine --lib kernels::mxfp4::tests::bench -- --ignored
    /// --nocapture`: a gpt-oss-20b expert projection (2880 x 2880), the best of five rounds.
    /// "hot" reuses one matrix (4.4 MB, cache-resident on most CPUs), "cold" cycles through 16.
    /// `MXFP4_BENCH_N=1,8` picks the input counts.
    #[test]
    #[ignore]
    fn bench() {
        use std::time::Instant;
        let (rows, cols) = (2880, 2880);
        let mut rng = Rng(42);
        let mats: Vec<(Vec<u8>, Vec<u8>)> = (0..16).map(|_| random_matrix(&mut rng, rows, cols)).collect();
        let bytes = (mats[0].0.len() + mats[0].1.len()) as f64;
        let ns: Vec<usize> = std::env::var("MXFP4_BENCH_N")
            .map(|v| v.split(',').map(|n| n.trim().parse().unwrap()).collect())
            .unwrap_or_else(|_| vec![1, 2, 4, 8, 16, 32]);
        let mut pools = vec![1, rayon::current_num_threads()];
        pools.dedup();
        for threads in pools {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            for kernel in kernels() {
                for &n in &ns {
                    let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
                    let mut y = vec![0f32; n * rows];
                    for cold in [false, true] {
                        let iters = if kernel == Kernel::Portable { 4 } else { 16 };
                        let mut run = |i: usize| {
                            let (b, s) = &mats[if cold { i % mats.len() } else { 0 }];
                            Mxfp4::new(b, s, rows, cols).unwrap().matmul_with(kernel, &x, n, &mut y);
                        };
                        pool.install(|| run(0));
                        let best = (0..5)
                            .map(|round| {
                                let start = Instant::now();
                                pool.install(|| (0..iters).for_each(|i| run(round * iters + i)));
                                start.elapsed().as_secs_f64() / iters as f64
                            })
                            .fold(f64::INFINITY, f64::min);
                        println!(
                            "{kernel:?} threads {threads} n {n:2} {}: {:7.3} ms, {:6.2} GB/s of weights, {:6.1} GFLOP/s",
                            if cold { "cold" } else { "hot " },
                            best * 1e3,
                            bytes / best / 1e9,
                            2.0 * (rows * cols * n) as f64 / best / 1e9
                        );
                    }
                }
            }
        }
    }
}
