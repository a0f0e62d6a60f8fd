//! AMX bf16 tile products of bf16 weight rows, as stored, with inputs rounded to bf16 (Intel
//! Sapphire Rapids and later): one `tdpbf16ps` multiplies a tile of 16 weight rows x 32 values
//! by 32 values of 16 inputs into 16 x 16 f32 sums, 8192 products where `vdpbf16ps` makes 32.
//!
//! Both operands are copied onto cache lines first ([`Line`]): a task's weight rows, tile by
//! tile ([`Weights`], read from the mapping once and then from the cache for every input
//! group), and the inputs as the instruction wants its second operand, each input's pairs of
//! values in a column ([`Inputs`], once per call for every task). Each sum runs over its row's values
//! in 32-value steps in the same order whatever the batch, its tile neighbours or the blocking,
//! so an output does not depend on the inputs it was computed beside; the order differs from
//! `avx512_bf16.rs` (one chain per output here, 16 lanes there), so the bits do too. Callers
//! check the CPU ([`available`]) and the row length ([`STEP`]) first. Attention
//! (`attention_tiles.rs`) takes the same products with query or weight rows in the first
//! operand and the cache's keys (packed as inputs) or values ([`Inputs::interleave`]) in the
//! second.
//!
//! The instructions are written in `asm!` (Rust's AMX intrinsics are not stable); the tile
//! registers are not the compiler's, so they keep their contents between statements. Tiles:
//! `tmm0`-`tmm3` sums (two weight tiles x two input tiles), `tmm4`-`tmm5` weights,
//! `tmm6`-`tmm7` inputs, every one 16 rows of 64 bytes.
//!
//! The operands' layouts need only AVX-512 BF16 to make, and `avx512_bf16_tiles.rs` takes
//! the same products on vectors where the CPU has no AMX ([`products_on`]).

use super::Bf16Unit;
use std::arch::asm;
use std::sync::OnceLock;

/// Weight rows a tile takes, and inputs.
pub const ROWS: usize = 16;
/// Values of a row one step takes: 16 pairs, 64 bytes.
pub const STEP: usize = 32;

/// Whether the CPU has AMX with bf16 and the kernel lets this process use its tile registers
/// (Linux asks each process to request them: `ARCH_REQ_XCOMP_PERM`). Asked once.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        use std::arch::x86_64::{__cpuid, __cpuid_count, _xgetbv};
        let (max, leaf1) = (__cpuid(0).eax, __cpuid(1));
        if max < 7 || leaf1.ecx & (1 << 27) == 0 {
            return false; // no leaf 7, or no XGETBV (OSXSAVE)
        }
        // Leaf 7 only where leaf 0 lists it.
        let leaf7 = __cpuid_count(7, 0);
        let (amx_bf16, amx_tile) = (leaf7.edx & (1 << 22) != 0, leaf7.edx & (1 << 24) != 0);
        // SAFETY: OSXSAVE is set, so XGETBV runs; XCR0 bits 17-18 are the tile config and data.
        let xcr0 = unsafe { _xgetbv(0) };
        if !(amx_bf16 && amx_tile && xcr0 & (3 << 17) == 3 << 17) {
            return false;
        }
        // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: granted for the whole process.
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: arch_prctl with these arguments only changes this process's permissions.
        let granted = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) } == 0;
        granted && super::avx512_bf16::available()
    })
}

/// The tile configuration: palette 1, all eight tiles 16 rows of 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

const CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64; // bytes a row (u16, little endian)
        c[48 + t] = ROWS as u8; // rows
        t += 1;
    }
    Config(c)
};

/// A tile row: 64 bytes on a cache line of their own. A tile load whose rows straddle lines
/// took 4-5x as long (22 against 4.8 ns a tile from L1 on a Sapphire Rapids), and tensors in
/// safetensors files sit 8-byte aligned, so both operands are copied into lines first.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
pub struct Line(pub(super) [u32; ROWS]);

/// The inputs of a call as tiles of the second operand: for 16 inputs and 32 values, 16 rows
/// of 16 value pairs, row `p` holding pair `p` of every input. Tiles in the order
/// [input group][step]; the last group's missing inputs are zero.
#[derive(Default)]
pub struct Inputs {
    lines: Vec<Line>,
    steps: usize,
    groups: usize,
}

impl Inputs {
    /// [`Self::pack_on_pool`] on one thread: the tests' reference for the pool's packings.
    ///
    /// # Safety
    /// The CPU must pass [`super::avx512_bf16::available`] (AMX CPUs do).
    #[cfg(test)]
    pub unsafe fn pack<T: Bf16Rows>(&mut self, x: &[T], n: usize, k: usize) {
        let group = self.shape(x.len(), n, k);
        for (g, tiles) in self.lines.chunks_exact_mut(group).enumerate() {
            // SAFETY: the caller checked the CPU; shape() checked x against n and k.
            unsafe { pack_group(x, n, k, g, tiles) };
        }
    }

    /// `n` inputs of `k` values (rows of `x`, bf16 or f32 rounded to bf16 ([`Bf16Rows`]), `k` a
    /// multiple of [`STEP`]): for each group and step, the 16 inputs' 16 pairs turned to
    /// columns in registers, the groups spread over the current rayon pool (a projection's
    /// inputs, packed once for every task, where one thread packing them kept the others
    /// waiting).
    ///
    /// # Safety
    /// The CPU must pass [`super::avx512_bf16::available`] (AMX CPUs do).
    pub unsafe fn pack_on_pool<T: Bf16Rows + Sync>(&mut self, x: &[T], n: usize, k: usize) {
        use rayon::prelude::*;
        let group = self.shape(x.len(), n, k);
        self.lines.par_chunks_exact_mut(group).enumerate().for_each(|(g, tiles)| {
            // SAFETY: the caller checked the CPU; shape() checked x against n and k.
            unsafe { pack_group(x, n, k, g, tiles) };
        });
    }

    /// The bytes its lines hold (their capacity).
    pub fn bytes(&self) -> usize {
        self.lines.capacity() * std::mem::size_of::<Line>()
    }

    /// Every input group, as [`products`] takes them.
    pub fn columns(&self) -> Columns<'_> {
        self.groups(0..self.groups)
    }

    /// The input groups `range` alone (inputs `range.start * 16..`), numbered from 0 for
    /// [`products`].
    pub fn groups(&self, range: std::ops::Range<usize>) -> Columns<'_> {
        assert!(range.start <= range.end && range.end <= self.groups);
        let per_group = self.steps * ROWS;
        Columns {
            lines: &self.lines[range.start * per_group..range.end * per_group],
            steps: self.steps,
            groups: range.len(),
        }
    }

    /// Sizes the lines for `n` inputs of `k` values (every line is then written by
    /// [`pack_group`], missing inputs' as zeros); the lines of one group.
    fn shape(&mut self, len: usize, n: usize, k: usize) -> usize {
        assert!(k.is_multiple_of(STEP) && len >= n * k);
        let (groups, steps) = (n.div_ceil(ROWS), k / STEP);
        self.lines.resize(groups * steps * ROWS, Line::default());
        (self.steps, self.groups) = (steps, groups);
        steps * ROWS
    }

    /// The second operand from a `k x n` matrix `x` stored by rows whose `n` columns are the
    /// inputs, summed over its `k` rows (attention's values: a position a row, a channel a
    /// column): for each group of 16 columns and each step of 32 rows, line `p` holds rows
    /// `2p` and `2p + 1` of the step interleaved. Rows past `k`, to the step's end, are zero.
    ///
    /// # Safety
    /// The CPU must pass [`super::avx512_bf16::available`] (AMX CPUs do).
    pub unsafe fn interleave(&mut self, x: &[u16], k: usize, n: usize) {
        assert!(n.is_multiple_of(ROWS) && x.len() >= k * n);
        let (groups, steps) = (n / ROWS, k.div_ceil(STEP));
        // Every line is written below, those past `k` as zeros.
        self.lines.resize(groups * steps * ROWS, Line::default());
        (self.steps, self.groups) = (steps, groups);
        // SAFETY: the caller checked the CPU (`available` asks for AVX-512 BW); the reads stay
        // inside the k rows of x, the writes inside `lines`.
        unsafe { interleave(&x[..k * n], k, n, &mut self.lines) };

        #[target_feature(enable = "avx512f,avx512bw")]
        unsafe fn interleave(x: &[u16], k: usize, n: usize, lines: &mut [Line]) {
            use std::arch::x86_64::*;
            // Lanes 2j and 2j + 1 of a line: column j of the first row, then of the second.
            let order = _mm512_set_epi16(
                31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                17, 1, 16, 0,
            );
            let (groups, steps) = (n / ROWS, k.div_ceil(STEP));
            let row = |r: usize, g: usize| {
                if r < k {
                    // SAFETY: row r < k of x holds columns g * 16..g * 16 + 16.
                    unsafe { _mm256_loadu_si256(x.as_ptr().add(r * n + g * ROWS) as *const __m256i) }
                } else {
                    _mm256_setzero_si256()
                }
            };
            for g in 0..groups {
                for s in 0..steps {
                    let tile = &mut lines[(g * steps + s) * ROWS..][..ROWS];
                    for (p, line) in tile.iter_mut().enumerate() {
                        let r = s * STEP + 2 * p;
                        if r >= k {
                            *line = Line::default();
                            continue;
                        }
                        let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(row(r, g)), row(r + 1, g));
                        // SAFETY: a line is 64 aligned bytes.
                        unsafe {
                            _mm512_store_si512(line.0.as_mut_ptr() as *mut _, _mm512_permutexvar_epi16(order, both))
                        };
                    }
                }
            }
        }
    }
}

/// Packs each of `inputs`, `(buffer, n)`: `n` inputs of `k` values that `row(i, j, dst)`
/// writes as bf16 for input `j` of the `i`-th (every value of `dst`; or none, returning
/// `false`: the input is zeros), laid out as [`Inputs::pack_on_pool`] lays them out. One
/// parallel call on the current rayon pool over every group of every buffer, each group's
/// inputs made in a small buffer of its own: inputs derived from stored ones (attention's
/// keys as bf16 halves, for every sequence of a step) with no copy of them all kept on the
/// side. A group with no input present is zeros without a transpose.
///
/// # Safety
/// The CPU must pass [`super::avx512_bf16::available`] (AMX CPUs do).
pub unsafe fn pack_rows_on_pool<'a>(
    inputs: impl IntoIterator<Item = (&'a mut Inputs, usize)>,
    k: usize,
    row: impl Fn(usize, usize, &mut [u16]) -> bool + Sync,
) {
    use rayon::prelude::*;
    let mut groups = Vec::new();
    for (i, (inputs, n)) in inputs.into_iter().enumerate() {
        let group = inputs.shape(n * k, n, k);
        groups.extend(inputs.lines.chunks_exact_mut(group).enumerate().map(|(g, tiles)| (i, n, g, tiles)));
    }
    groups.into_par_iter().for_each_init(Vec::new, |rows, (i, n, g, tiles)| {
        let count = (n - g * ROWS).min(ROWS);
        rows.resize(count * k, 0);
        let mut present = false;
        for (j, dst) in rows.chunks_exact_mut(k).enumerate() {
            if row(i, g * ROWS + j, dst) {
                present = true;
            } else {
                dst.fill(0);
            }
        }
        if !present {
            return tiles.fill(Line::default());
        }
        // SAFETY: the caller checked the CPU; `rows` holds the group's inputs, as group 0 of
        // `count`, and `tiles` its lines (shape() sized them).
        unsafe { pack_group(rows, count, k, 0, tiles) };
    });
}

/// Consecutive input groups of an [`Inputs`], the second operand of [`products`].
#[derive(Clone, Copy)]
pub struct Columns<'a> {
    lines: &'a [Line],
    steps: usize,
    groups: usize,
}

impl Columns<'_> {
    /// How many groups of 16 inputs.
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// Steps of 32 values in an input.
    pub(super) fn steps(&self) -> usize {
        self.steps
    }

    /// The tile of group `g`, step `s`.
    pub(super) fn tile(&self, g: usize, s: usize) -> *const Line {
        self.lines[(g * self.steps + s) * ROWS..].as_ptr()
    }
}

/// Input rows [`Inputs::pack_on_pool`] reads: bf16 as they are, or f32 rounded to bf16 on the way.
pub trait Bf16Rows: Copy {
    /// The 32 values at `p` as bf16, in order.
    ///
    /// # Safety
    /// 32 values are readable at `p`; the CPU passes [`available`].
    unsafe fn step(p: *const Self) -> std::arch::x86_64::__m512;
}

impl Bf16Rows for u16 {
    #[inline(always)]
    unsafe fn step(p: *const u16) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p as *const f32) }
    }
}

impl Bf16Rows for f32 {
    /// To nearest even, as `avx512_bf16::narrow` rounds.
    #[inline(always)]
    unsafe fn step(p: *const f32) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's; the CPU has AVX-512 BF16.
        unsafe {
            let both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p.add(16)), _mm512_loadu_ps(p));
            std::mem::transmute::<__m512bh, __m512>(both)
        }
    }
}

/// Group `g` of the `n` inputs `x` (`k` values each) into its lines `tiles` (one tile a step),
/// each step's 16 inputs' 16 pairs turned to columns.
///
/// # Safety
/// The CPU must pass [`super::avx512_bf16::available`] (AMX CPUs do); `x` holds `n` rows of
/// `k` values and `tiles` the group's `k / 2` lines.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pack_group<T: Bf16Rows>(x: &[T], n: usize, k: usize, g: usize, tiles: &mut [Line]) {
    use std::arch::x86_64::*;
    let count = (n - g * ROWS).min(ROWS);
    for (s, tile) in tiles.chunks_exact_mut(ROWS).enumerate() {
        let rows = std::array::from_fn(|j| {
            if j < count {
                // SAFETY: input g * 16 + j < n; its values s * 32.. are inside its row.
                unsafe { T::step(x.as_ptr().add((g * ROWS + j) * k + s * STEP)) }
            } else {
                _mm512_setzero_ps()
            }
        });
        for (line, column) in tile.iter_mut().zip(transpose(rows)) {
            // SAFETY: a line is 64 aligned bytes.
            unsafe { _mm512_store_ps(line.0.as_mut_ptr() as *mut f32, column) };
        }
    }
}

/// Up to 32 weight rows as tiles of the first operand, each tile's 16 rows of a step on 16
/// lines one after the other. Tiles in the order [tile][step]; rows past the weight's are zero.
#[derive(Default)]
pub struct Weights {
    lines: Vec<Line>,
    steps: usize,
    tiles: usize,
}

impl Weights {
    /// The rows `w` (`k` values each, `k` a multiple of [`STEP`], at most 32 rows).
    ///
    /// # Safety
    /// The CPU must pass [`super::avx512_bf16::available`] (AMX CPUs do).
    pub unsafe fn copy(&mut self, w: &[u16], k: usize) {
        assert!(k.is_multiple_of(STEP) && w.len().is_multiple_of(k) && w.len() <= 2 * ROWS * k);
        let (rows, steps) = (w.len() / k, k / STEP);
        let tiles = rows.div_ceil(ROWS);
        self.lines.resize(tiles * steps * ROWS, Line::default());
        (self.steps, self.tiles) = (steps, tiles);
        // The last tile's rows past the weight's are zero: their lines, of every step.
        for s in (0..steps).filter(|_| tiles > 0) {
            self.lines[((tiles - 1) * steps + s) * ROWS..][rows - (tiles - 1) * ROWS..ROWS].fill(Line::default());
        }
        // SAFETY: the caller checked the CPU (AVX-512F with AMX); the lines hold tiles x steps
        // tiles of 16, and row r's step s goes to line (tile * steps + s) * 16 + r % 16.
        unsafe { copy(w, rows, steps, &mut self.lines) };

        /// 64 bytes a move (the baseline target copies 16).
        #[target_feature(enable = "avx512f")]
        unsafe fn copy(w: &[u16], rows: usize, steps: usize, lines: &mut [Line]) {
            use std::arch::x86_64::*;
            let (src, dst) = (w.as_ptr(), lines.as_mut_ptr());
            for r in 0..rows {
                let (tile, i) = (r / ROWS, r % ROWS);
                for s in 0..steps {
                    // SAFETY: row r's step s is inside w; its line inside `lines`, aligned.
                    unsafe {
                        let v = _mm512_loadu_si512(src.add((r * steps + s) * STEP) as *const _);
                        _mm512_store_si512(dst.add((tile * steps + s) * ROWS + i) as *mut _, v);
                    }
                }
            }
        }
    }

    /// Steps of 32 values in a row.
    pub(super) fn steps(&self) -> usize {
        self.steps
    }

    /// Tiles of 16 rows (one or two).
    pub(super) fn tiles(&self) -> usize {
        self.tiles
    }

    /// Tile `t` of step `s`.
    pub(super) fn tile(&self, t: usize, s: usize) -> *const Line {
        self.lines[(t * self.steps + s) * ROWS..].as_ptr()
    }
}

/// One tile's sums as stored: `[weight row][input]`.
#[repr(C, align(64))]
pub struct Sums(pub [[f32; ROWS]; ROWS]);

impl Sums {
    /// Each input's sums, `rows` (up to 16) of them, to `out(input)` for the first `inputs`
    /// inputs: the tile turned to `[input][weight row]` in registers, 64 bytes a store where
    /// storing value by value cost as much as the products.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `out(j)` for `j < inputs` points to `rows` writable floats.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn store(&self, rows: usize, inputs: usize, out: impl Fn(usize) -> *mut f32) {
        use std::arch::x86_64::*;
        // SAFETY: 16 rows of 16 floats, each 64-byte aligned.
        let columns = transpose(std::array::from_fn(|i| unsafe { _mm512_load_ps(self.0[i].as_ptr()) }));
        let mask = if rows >= ROWS { u16::MAX } else { (1u16 << rows) - 1 };
        for (j, column) in columns.into_iter().enumerate().take(inputs) {
            // SAFETY: the caller's guarantee for out(j); the mask keeps to `rows`.
            unsafe { _mm512_mask_storeu_ps(out(j), mask, column) };
        }
    }
}

/// The columns of a 16 x 16 matrix of 32-bit values held as 16 rows: pairs of rows, then
/// quads, unpacked within 128-bit lanes, then the lanes gathered.
#[target_feature(enable = "avx512f")]
fn transpose(r: [std::arch::x86_64::__m512; ROWS]) -> [std::arch::x86_64::__m512; ROWS] {
    use std::arch::x86_64::*;
    let mut t = [_mm512_setzero_ps(); ROWS];
    for k in 0..8 {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    // In each 128-bit lane L, u[4q + c] holds column 4L + c of rows 4q..4q + 4.
    let mut u = [_mm512_setzero_ps(); ROWS];
    for q in 0..4 {
        let [a, b, c, d] = [0, 1, 2, 3].map(|i| _mm512_castps_pd(t[4 * q + i]));
        u[4 * q] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    // Column 4L + c: lane L of u[c], u[4 + c], u[8 + c], u[12 + c].
    let mut columns = [_mm512_setzero_ps(); ROWS];
    for c in 0..4 {
        let low = _mm512_shuffle_f32x4::<0x44>(u[c], u[4 + c]);
        let high = _mm512_shuffle_f32x4::<0xEE>(u[c], u[4 + c]);
        let low2 = _mm512_shuffle_f32x4::<0x44>(u[8 + c], u[12 + c]);
        let high2 = _mm512_shuffle_f32x4::<0xEE>(u[8 + c], u[12 + c]);
        columns[c] = _mm512_shuffle_f32x4::<0x88>(low, low2);
        columns[4 + c] = _mm512_shuffle_f32x4::<0xDD>(low, low2);
        columns[8 + c] = _mm512_shuffle_f32x4::<0x88>(high, high2);
        columns[12 + c] = _mm512_shuffle_f32x4::<0xDD>(high, high2);
    }
    columns
}

/// [`products`] on `unit`: AMX tiles, or AVX-512 BF16 vectors (`avx512_bf16_tiles.rs`, which
/// fetches nothing `ahead`).
///
/// # Safety
/// The CPU must have `unit` ([`Bf16Unit::available`]); `weights` and `inputs` hold rows of
/// the same length.
pub unsafe fn products_on(
    unit: Bf16Unit,
    weights: &Weights,
    inputs: Columns<'_>,
    ahead: &[u16],
    put: impl FnMut(usize, usize, &Sums),
) {
    // SAFETY (both): the caller's.
    match unit {
        Bf16Unit::Tiles => unsafe { products(weights, inputs, ahead, put) },
        Bf16Unit::Vectors => unsafe { super::avx512_bf16_tiles::products(weights, inputs, put) },
    }
}

/// The products of the weight tiles (one or two) with every input group, handed to
/// `put(group, tile, sums)`. `ahead` is what the thread's next call will copy (the next weight
/// rows, or nothing): its cache lines are fetched into L2 a few a step, so that the copy finds
/// them there instead of waiting on memory (it took a seventh of a prompt's projections).
///
/// # Safety
/// The CPU must pass [`available`]; `weights` and `inputs` hold rows of the same length.
pub unsafe fn products(
    weights: &Weights,
    inputs: Columns<'_>,
    ahead: &[u16],
    mut put: impl FnMut(usize, usize, &Sums),
) {
    debug_assert!(weights.steps == inputs.steps);
    let (steps, groups, second) = (weights.steps, inputs.groups, weights.tiles == 2);
    let line = std::mem::size_of::<Line>();
    let mut sums = Sums([[0.0; ROWS]; ROWS]);
    // `ahead`'s cache lines, a few each step (one more for a start inside a line).
    let ahead_lines = (ahead.len() * 2).div_ceil(line) + usize::from(!ahead.is_empty());
    let per_step = ahead_lines.div_ceil((groups.div_ceil(2) * steps).max(1));
    let mut fetched = 0;
    // SAFETY: every tile load reads 16 lines inside `weights` or `inputs` (tile(.., s) for
    // s < steps, g < groups); the stores write 1 KiB into `sums`.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
        let mut g = 0;
        while g < groups {
            let two = g + 1 < groups;
            asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nomem, nostack));
            for s in 0..steps {
                for _ in 0..per_step.min(ahead_lines - fetched) {
                    // A prefetch never faults; the address stays in (or one line past) `ahead`.
                    let p = ahead.as_ptr().wrapping_add(fetched * line / 2).cast::<i8>();
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p);
                    fetched += 1;
                }
                asm!(
                    "tileloadd tmm4, [{w0} + {line} * 1]",
                    "tileloadd tmm6, [{x0} + {line} * 1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    w0 = in(reg) weights.tile(0, s),
                    x0 = in(reg) inputs.tile(g, s),
                    line = in(reg) line,
                    options(nostack, readonly),
                );
                if two {
                    asm!(
                        "tileloadd tmm7, [{x1} + {line} * 1]",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        x1 = in(reg) inputs.tile(g + 1, s),
                        line = in(reg) line,
                        options(nostack, readonly),
                    );
                }
                if second {
                    asm!(
                        "tileloadd tmm5, [{w1} + {line} * 1]",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        w1 = in(reg) weights.tile(1, s),
                        line = in(reg) line,
                        options(nostack, readonly),
                    );
                    if two {
                        asm!("tdpbf16ps tmm3, tmm5, tmm7", options(nomem, nostack));
                    }
                }
            }
            let out = sums.0.as_mut_ptr();
            asm!("tilestored [{} + {} * 1], tmm0", in(reg) out, in(reg) line, options(nostack));
            put(g, 0, &sums);
            if two {
                asm!("tilestored [{} + {} * 1], tmm1", in(reg) out, in(reg) line, options(nostack));
                put(g + 1, 0, &sums);
            }
            if second {
                asm!("tilestored [{} + {} * 1], tmm2", in(reg) out, in(reg) line, options(nostack));
                put(g, 1, &sums);
                if two {
                    asm!("tilestored [{} + {} * 1], tmm3", in(reg) out, in(reg) line, options(nostack));
                    put(g + 1, 1, &sums);
                }
            }
            g += if two { 2 } else { 1 };
        }
        asm!("tilerelease", options(nomem, nostack));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16(v: f32) -> u16 {
        half::bf16::from_f32(v).to_bits()
    }

    /// f32 inputs packed straight into tiles are the bf16 rounding `narrow` gives, packed; the
    /// pool's packing lays out the same lines as one thread's, and so does packing rows made
    /// a group at a time, several buffers in one call.
    #[test]
    fn f32_inputs_pack_as_their_bf16_rounding() {
        if !available() {
            eprintln!("no AMX on this CPU");
            return;
        }
        let (k, n) = (64, 37); // two steps; two full groups and a partial one
                               // Values with bits below bf16's, both signs, a zero (i = 0).
        let x: Vec<f32> = (0..n * k).map(|i| ((i * 5) as f32 * 0.37).sin() * (1.0 + (i % 7) as f32 * 1e-3)).collect();
        let mut rounded = vec![0u16; x.len()];
        let [mut want, mut direct, mut pooled, mut made, mut one, mut alone] =
            std::array::from_fn(|_| Inputs::default());
        // SAFETY: available() checked the CPU (AVX-512 BF16 included).
        unsafe {
            crate::kernels::avx512_bf16::narrow(&x, &mut rounded);
            want.pack(&rounded, n, k);
            direct.pack(&x, n, k);
            pooled.pack_on_pool(&x, n, k);
            // Over the size of another call's lines, as a kept buffer is; beside a second
            // buffer of one input.
            made.pack(&x[..k], 1, k);
            pack_rows_on_pool([(&mut made, n), (&mut one, 1)], k, |i, j, dst| {
                dst.copy_from_slice(&rounded[(i + j) * k..][..k]);
                true
            });
            alone.pack(&rounded[k..2 * k], 1, k);
        }
        let bits = |i: &Inputs| i.lines.iter().flat_map(|l| l.0).collect::<Vec<u32>>();
        assert_eq!(want.lines.len(), 3 * 2 * ROWS);
        assert_eq!(bits(&direct), bits(&want));
        assert_eq!(bits(&pooled), bits(&want));
        assert_eq!(bits(&made), bits(&want));
        assert_eq!(bits(&one), bits(&alone));
        // Column j of a line is input j's pair: the last group's missing inputs (5.. of 16)
        // are zeros, its present ones are not.
        for line in &direct.lines[2 * 2 * ROWS..] {
            assert!(line.0[5..].iter().all(|&pair| pair == 0) && line.0[..5].iter().all(|&pair| pair != 0));
        }
    }

    /// Every sum is the sum of its row's products with its input (to f32 rounding), whichever
    /// tile and group it falls in, and its bits do not depend on the groups or tiles beside it.
    #[test]
    fn tiles_sum_each_rows_products_with_each_input() {
        if !available() {
            eprintln!("no AMX on this CPU");
            return;
        }
        let (k, n, rows) = (96, 37, 2 * ROWS); // three steps; two full groups and a partial one
        let w: Vec<u16> = (0..rows * k).map(|i| bf16(((i * 7) as f32 * 0.013).sin())).collect();
        let x: Vec<u16> = (0..n * k).map(|i| bf16(((i * 3) as f32 * 0.029).cos())).collect();
        let (mut weights, mut inputs) = (Weights::default(), Inputs::default());
        // SAFETY: available() checked the CPU.
        unsafe {
            weights.copy(&w, k);
            inputs.pack(&x, n, k);
        }
        assert_eq!(weights.tiles, 2);
        let value = |b: u16| f32::from_bits((b as u32) << 16) as f64;
        let mut got = vec![f32::NAN; n * rows];
        // SAFETY: available() checked the CPU; both hold rows of k values. (The rows fetched
        // ahead, here the same ones, change nothing but where they sit.)
        unsafe {
            products(&weights, inputs.columns(), &w, |g, tile, sums| {
                for (r, row) in sums.0.iter().enumerate() {
                    for (j, &v) in row.iter().enumerate() {
                        let t = g * ROWS + j;
                        if t < n {
                            got[t * rows + tile * ROWS + r] = v;
                        } else {
                            assert_eq!(v, 0.0, "a missing input's sums");
                        }
                    }
                }
            })
        };
        for t in 0..n {
            for r in 0..rows {
                let want: f64 = (0..k).map(|i| value(x[t * k + i]) * value(w[r * k + i])).sum();
                let v = got[t * rows + r] as f64;
                assert!((v - want).abs() < 1e-4, "input {t} row {r}: {v} vs {want}");
            }
        }
        // Groups 1 and 2 alone (inputs 16..37), numbered from 0: the same bits.
        let mut calls = 0;
        // SAFETY: as above.
        unsafe {
            products(&weights, inputs.groups(1..3), &[], |g, tile, sums| {
                calls += 1;
                for (r, row) in sums.0.iter().enumerate() {
                    for (j, &v) in row.iter().enumerate().filter(|&(j, _)| (g + 1) * ROWS + j < n) {
                        let t = (g + 1) * ROWS + j;
                        assert_eq!(v.to_bits(), got[t * rows + tile * ROWS + r].to_bits(), "input {t} row {r}");
                    }
                }
            })
        };
        assert_eq!((inputs.groups(1..3).groups(), calls), (2, 4));
        // One input alone against the first 16 rows, and against the last 5 (a tile padded with
        // zero rows): the same bits.
        for t in [0, 17, n - 1] {
            let mut one = Inputs::default();
            // SAFETY: as above.
            unsafe { one.pack(&x[t * k..(t + 1) * k], 1, k) };
            for (first, count) in [(0, ROWS), (rows - 5, 5)] {
                // SAFETY: as above.
                unsafe { weights.copy(&w[first * k..(first + count) * k], k) };
                assert_eq!(weights.tiles, 1);
                // SAFETY: as above.
                unsafe {
                    products(&weights, one.columns(), &[], |_, _, sums| {
                        for r in 0..ROWS {
                            let v = sums.0[r][0];
                            if r < count {
                                assert_eq!(
                                    v.to_bits(),
                                    got[t * rows + first + r].to_bits(),
                                    "input {t} row {}",
                                    first + r
                                );
                            } else {
                                assert_eq!(v, 0.0, "a padding row's sum");
                            }
                        }
                    })
                };
            }
        }
    }
}
