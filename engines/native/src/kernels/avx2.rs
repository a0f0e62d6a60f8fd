//! AVX2 + FMA dot products of f32 activations with weight rows as stored (bf16, f16 or f32),
//! widening eight weights at a time in registers: the weights are read once, straight from the
//! mapped file, with no f32 copy; and f16 or int8 slices widened to f32 (the KV cache's blocks,
//! for the tiles of prompt queries that read each block many times). Callers check the CPU (`is_x86_feature_detected!`) first.

use std::arch::x86_64::*;

/// A weight element type this kernel reads.
pub trait Weight: Copy {
    /// Eight values at `p` as f32.
    ///
    /// # Safety
    /// `p..p+8` must be readable; the CPU must have AVX2 and F16C.
    unsafe fn load8(p: *const Self) -> __m256;
    fn to_f32(self) -> f32;
}

impl Weight for half::bf16 {
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        // SAFETY: the caller guarantees eight readable values and AVX2.
        unsafe {
            let v = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
        }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

impl Weight for half::f16 {
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        // SAFETY: as above; F16C comes with every AVX2 CPU the dispatcher accepts.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

impl Weight for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        // SAFETY: as above.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

/// `src` widened to f32 into `dst` (the same length), eight values a register.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn widen_f16(src: &[half::f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    let main = src.len() / 8 * 8;
    for i in (0..main).step_by(8) {
        // SAFETY: i + 8 <= main <= the length of both; the caller guarantees F16C.
        unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(i), half::f16::load8(src.as_ptr().add(i))) }
    }
    for (d, s) in dst[main..].iter_mut().zip(&src[main..]) {
        *d = s.to_f32();
    }
}

/// The sum of the eight lanes of `v`.
#[inline(always)]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: register-only operations; the caller runs with AVX.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// The sums of four accumulators. A loop in a function of its own with the kernels' features:
/// `map` with a closure compiled the sums without them (closures do not inherit a function's
/// target features), which passed each register through memory to a call.
#[inline(always)]
fn sums(acc: &[__m256; 4]) -> [f32; 4] {
    let mut out = [0f32; 4];
    for (o, a) in out.iter_mut().zip(acc) {
        // SAFETY: register-only; the callers run with AVX.
        *o = unsafe { hsum(*a) };
    }
    out
}

/// Asks for column `i` of the four rows after the tile at `wp` (rows of `k` values): the
/// task's next tile, read from memory while this one is computed. A prefetch never faults, so
/// the address may lie past the weights.
#[inline(always)]
fn prefetch_next_tile<W>(wp: *const W, k: usize, i: usize) {
    for r in 0..4 {
        // SAFETY: a prefetch is a hint that reads nothing architecturally and never faults.
        unsafe { _mm_prefetch(wp.wrapping_add((4 + r) * k + i) as *const i8, _MM_HINT_T0) };
    }
}

/// Dot products of `x` with the four rows `w[0..k]`, `w[k..2k]`, `w[2k..3k]`, `w[3k..4k]`, one
/// row after the other: each thread then reads its weights as one stream in address order,
/// which the hardware prefetcher follows, where four rows read side by side were four streams
/// 2*k bytes apart (single-sequence decode went from 46-48 to 56-62 tok/s on SmolLM2 and from
/// 22-25 to 29-32 on Gemma 3, 2 threads; each row still adds in the same order as the
/// batched kernels, so results stay batch-invariant).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `w` must hold `4 * x.len()` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4<W: Weight>(x: &[f32], w: &[W]) -> [f32; 4] {
    let k = x.len();
    assert!(w.len() >= 4 * k);
    let main = k / 8 * 8;
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    for (r, a) in acc.iter_mut().enumerate() {
        let row = wp.wrapping_add(r * k);
        let mut i = 0;
        while i < main {
            // SAFETY: i + 8 <= main <= k, and every row has k values (asserted above).
            // Prefetching an address past the slice is allowed (it never faults).
            unsafe {
                if i % 32 == 0 {
                    _mm_prefetch(row.wrapping_add(4 * k + i) as *const i8, _MM_HINT_T0);
                }
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(i)), W::load8(row.add(i)), *a);
            }
            i += 8;
        }
    }
    let mut out = sums(&acc);
    for i in main..k {
        for (r, o) in out.iter_mut().enumerate() {
            *o += x[i] * w[r * k + i].to_f32();
        }
    }
    out
}

/// [`dot4`] for a batch's last input after [`dot4x3`] has read the same rows: they are in the
/// cache, so reading the four rows side by side costs nothing, and their four chains of FMAs
/// overlap where [`dot4`]'s one chain at a time waits on each FMA's latency (the last of 4
/// sequences took as long as the other three). Each row adds in the same order as in [`dot4`].
///
/// # Safety
/// As [`dot4`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4_side_by_side<W: Weight>(x: &[f32], w: &[W]) -> [f32; 4] {
    let k = x.len();
    assert!(w.len() >= 4 * k);
    let main = k / 8 * 8;
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < main {
        // SAFETY: i + 8 <= main <= k, and every row has k values (asserted above).
        unsafe {
            let xv = _mm256_loadu_ps(xp.add(i));
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(xv, W::load8(wp.add(r * k + i)), *a);
            }
        }
        i += 8;
    }
    let mut out = sums(&acc);
    for i in main..k {
        for (r, o) in out.iter_mut().enumerate() {
            *o += x[i] * w[r * k + i].to_f32();
        }
    }
    out
}

/// Dot products of two input rows `x0`, `x1` with the four weight rows of `w` (as [`dot4`]):
/// each weight load serves both inputs; `prefetch` as in [`dot4x3`].
///
/// # Safety
/// As [`dot4`]; `x0` and `x1` have the same length.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4x2<W: Weight>(x0: &[f32], x1: &[f32], w: &[W], prefetch: bool) -> [[f32; 4]; 2] {
    let k = x0.len();
    assert!(x1.len() == k && w.len() >= 4 * k);
    let main = k / 8 * 8;
    let wp = w.as_ptr();
    let mut a0 = [_mm256_setzero_ps(); 4];
    let mut a1 = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < main {
        // SAFETY: i + 8 <= k; every row and both inputs hold k values. Prefetching past the
        // slice never faults.
        unsafe {
            if prefetch && i % 32 == 0 {
                prefetch_next_tile(wp, k, i);
            }
            let x0v = _mm256_loadu_ps(x0.as_ptr().add(i));
            let x1v = _mm256_loadu_ps(x1.as_ptr().add(i));
            for r in 0..4 {
                let wv = W::load8(wp.add(r * k + i));
                a0[r] = _mm256_fmadd_ps(x0v, wv, a0[r]);
                a1[r] = _mm256_fmadd_ps(x1v, wv, a1[r]);
            }
        }
        i += 8;
    }
    let mut out = [sums(&a0), sums(&a1)];
    for i in main..k {
        for r in 0..4 {
            let wv = w[r * k + i].to_f32();
            out[0][r] += x0[i] * wv;
            out[1][r] += x1[i] * wv;
        }
    }
    out
}

/// Dot products of three input rows with the four weight rows of `w` (as [`dot4`]): twelve
/// accumulators (with the three inputs and one weight, all sixteen registers), so each weight
/// load serves three FMAs and twelve independent chains hide the FMA latency. With `prefetch`,
/// the next four rows (the task's next tile) are fetched meanwhile, so reading the weights from
/// memory overlaps the arithmetic. Each output is summed in the same order as in [`dot4`], so a
/// sequence's logits do not depend on its batch.
///
/// # Safety
/// As [`dot4`]; the three inputs have the same length.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4x3<W: Weight>(x: [&[f32]; 3], w: &[W], prefetch: bool) -> [[f32; 4]; 3] {
    let k = x[0].len();
    assert!(x[1].len() == k && x[2].len() == k && w.len() >= 4 * k);
    let main = k / 8 * 8;
    let (p0, p1, p2, wp) = (x[0].as_ptr(), x[1].as_ptr(), x[2].as_ptr(), w.as_ptr());
    // No closures in the loop: they would not inherit this function's target features.
    let z = _mm256_setzero_ps();
    let (mut a0, mut a1, mut a2) = ([z; 4], [z; 4], [z; 4]);
    let mut i = 0;
    while i < main {
        // SAFETY: i + 8 <= k; every row and all three inputs hold k values. Prefetching past the
        // slice never faults.
        unsafe {
            if prefetch && i % 32 == 0 {
                prefetch_next_tile(wp, k, i);
            }
            let (x0, x1, x2) = (_mm256_loadu_ps(p0.add(i)), _mm256_loadu_ps(p1.add(i)), _mm256_loadu_ps(p2.add(i)));
            for r in 0..4 {
                let wv = W::load8(wp.add(r * k + i));
                a0[r] = _mm256_fmadd_ps(x0, wv, a0[r]);
                a1[r] = _mm256_fmadd_ps(x1, wv, a1[r]);
                a2[r] = _mm256_fmadd_ps(x2, wv, a2[r]);
            }
        }
        i += 8;
    }
    let mut out = [[0f32; 4]; 3];
    for r in 0..4 {
        // SAFETY: register-only.
        unsafe { (out[0][r], out[1][r], out[2][r]) = (hsum(a0[r]), hsum(a1[r]), hsum(a2[r])) };
    }
    for i in main..k {
        for r in 0..4 {
            let wv = w[r * k + i].to_f32();
            for j in 0..3 {
                out[j][r] += x[j][i] * wv;
            }
        }
    }
    out
}

/// The dot product of `x` with one row `w[0..k]`.
///
/// # Safety
/// As [`dot4`], with `w` holding `x.len()` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot<W: Weight>(x: &[f32], w: &[W]) -> f32 {
    let k = x.len();
    assert!(w.len() >= k);
    let main = k / 8 * 8;
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < main {
        // SAFETY: i + 8 <= k and both slices hold k values.
        unsafe { acc = _mm256_fmadd_ps(_mm256_loadu_ps(x.as_ptr().add(i)), W::load8(w.as_ptr().add(i)), acc) };
        i += 8;
    }
    // SAFETY: register-only.
    let mut s = unsafe { hsum(acc) };
    for i in main..k {
        s += x[i] * w[i].to_f32();
    }
    s
}
