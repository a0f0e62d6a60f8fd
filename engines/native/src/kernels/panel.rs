//! What the parallel kernels share: the output pointer their tasks write through, and the GEMM
//! over a panel of weight rows widened (or dequantized) to f32 that prefill runs.

/// A raw output pointer the tasks of one parallel call share: each task writes a disjoint set
/// of elements (its own output rows, or its own attention heads).
#[derive(Clone, Copy)]
pub(crate) struct Out(pub *mut f32);
// SAFETY: tasks write disjoint elements (their own output rows) and the buffer outlives the
// parallel call that uses it.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// `out[t, r0 + r] = x[t] · w[r]` for the `nr` f32 rows of `w` and all `n` inputs; `out` is
/// `n x rows`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn panel_gemm(w: &[f32], nr: usize, cols: usize, x: &[f32], n: usize, rows: usize, r0: usize, out: Out) {
    debug_assert!(w.len() == nr * cols && x.len() == n * cols);
    // SAFETY: dst (t, r) = out + t * rows + r0 + r stays inside this task's rows of an n x rows
    // output; lhs (t, c) = x[t * cols + c] and rhs (c, r) = w[r * cols + c] stay inside x and w.
    unsafe {
        gemm::gemm(
            n,
            nr,
            cols,
            out.0.add(r0),
            1,
            rows as isize,
            false,
            x.as_ptr(),
            1,
            cols as isize,
            w.as_ptr(),
            cols as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}
