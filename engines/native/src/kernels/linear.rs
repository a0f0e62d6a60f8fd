//! `y = x W^T (+ b)` for a weight stored as on disk (bf16, f16 or f32, `[out, in]` row-major,
//! memory-mapped), computed in f32. Work is split over the output features on the model's thread
//! pool; each task widens a tile of weight rows to f32 once and uses it for every input row, so
//! decode (one row per sequence) reads each weight once per step and prefill reuses the widened
//! tile across the whole chunk.

use crate::checkpoint::{DType, TensorView};
use half::f16;
use rayon::prelude::*;

/// Weight rows widened together (a tile is `TILE x in` f32 values).
const TILE: usize = 4;

pub struct Linear {
    weight: TensorView,
    bias: Option<Vec<f32>>,
    pub rows: usize,
    pub cols: usize,
}

/// A raw output pointer the tasks share: each task writes a disjoint set of columns.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: tasks write disjoint elements (their own output features) and the buffer outlives
// the parallel call that uses it.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Linear {
    /// `weight` must be `[rows, cols]`; `bias` `[rows]`.
    pub fn new(weight: TensorView, bias: Option<Vec<f32>>) -> Self {
        let (rows, cols) = (weight.shape[0], weight.shape[1]);
        debug_assert!(bias.as_ref().is_none_or(|b| b.len() == rows));
        Linear { weight, bias, rows, cols }
    }

    /// `x`: `n x cols`; returns `y`: `n x rows`.
    pub fn forward(&self, x: &[f32], n: usize, y: &mut Vec<f32>) {
        debug_assert_eq!(x.len(), n * self.cols);
        y.clear();
        y.resize(n * self.rows, 0.0);
        let out = Out(y.as_mut_ptr());
        let tiles = self.rows.div_ceil(TILE);
        // Enough tasks to balance, few enough that each amortises its scheduling.
        let per_task = (tiles / (rayon::current_num_threads() * 4)).max(1);
        (0..tiles).into_par_iter().with_min_len(per_task).for_each_init(
            || vec![0f32; TILE * self.cols],
            |scratch, tile| {
                let r0 = tile * TILE;
                let r1 = (r0 + TILE).min(self.rows);
                self.widen(r0, r1, scratch);
                dispatch(scratch, r1 - r0, self.cols, x, n, self.rows, r0, out);
                if let Some(b) = &self.bias {
                    for t in 0..n {
                        for (r, bias) in b.iter().enumerate().take(r1).skip(r0) {
                            // SAFETY: r in this task's rows, t < n: inside y.
                            unsafe { *out.0.add(t * self.rows + r) += bias };
                        }
                    }
                }
            },
        );
    }

    /// Weight rows `r0..r1` as f32 into `dst`.
    fn widen(&self, r0: usize, r1: usize, dst: &mut [f32]) {
        let cols = self.cols;
        let size = self.weight.dtype.size();
        let bytes = &self.weight.bytes()[r0 * cols * size..r1 * cols * size];
        let dst = &mut dst[..(r1 - r0) * cols];
        match self.weight.dtype {
            DType::BF16 => {
                for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
                    *d = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
                }
            }
            DType::F16 => {
                for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
                    *d = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
                }
            }
            DType::F32 => {
                for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                    *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        }
    }

    /// The weight row `r` as f32 (embedding lookups).
    pub fn row(&self, r: usize, dst: &mut [f32]) {
        self.widen(r, r + 1, dst);
    }
}

/// Picks the widest vector code the CPU runs.
#[allow(clippy::too_many_arguments)]
fn dispatch(w: &[f32], nr: usize, cols: usize, x: &[f32], n: usize, rows: usize, r0: usize, out: Out) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        unsafe { tile_avx2(w, nr, cols, x, n, rows, r0, out) };
        return;
    }
    tile(w, nr, cols, x, n, rows, r0, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_avx2(w: &[f32], nr: usize, cols: usize, x: &[f32], n: usize, rows: usize, r0: usize, out: Out) {
    tile(w, nr, cols, x, n, rows, r0, out)
}

/// Dot products of `nr` widened weight rows with every input row, written to the output.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile(w: &[f32], nr: usize, cols: usize, x: &[f32], n: usize, rows: usize, r0: usize, out: Out) {
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        if nr == TILE {
            let d = dot4(xt, &w[..cols], &w[cols..2 * cols], &w[2 * cols..3 * cols], &w[3 * cols..4 * cols]);
            for (i, v) in d.into_iter().enumerate() {
                // SAFETY: row r0 + i belongs to this task; t < n.
                unsafe { *out.0.add(t * rows + r0 + i) = v };
            }
        } else {
            for i in 0..nr {
                let v = dot(xt, &w[i * cols..(i + 1) * cols]);
                // SAFETY: as above.
                unsafe { *out.0.add(t * rows + r0 + i) = v };
            }
        }
    }
}

const LANES: usize = 8;

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (ac, ar) = a.split_at(a.len() / LANES * LANES);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(LANES).zip(bc.chunks_exact(LANES)) {
        for j in 0..LANES {
            acc[j] += x[j] * y[j];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

/// Four dot products sharing the loads of `x`.
#[inline(always)]
fn dot4(x: &[f32], w0: &[f32], w1: &[f32], w2: &[f32], w3: &[f32]) -> [f32; 4] {
    let mut acc = [[0f32; LANES]; 4];
    let main = x.len() / LANES * LANES;
    for k in (0..main).step_by(LANES) {
        let xs = &x[k..k + LANES];
        let ws = [&w0[k..k + LANES], &w1[k..k + LANES], &w2[k..k + LANES], &w3[k..k + LANES]];
        for r in 0..4 {
            for j in 0..LANES {
                acc[r][j] += xs[j] * ws[r][j];
            }
        }
    }
    let mut s = [0f32; 4];
    for r in 0..4 {
        s[r] = acc[r].iter().sum();
    }
    let w = [w0, w1, w2, w3];
    for k in main..x.len() {
        for r in 0..4 {
            s[r] += x[k] * w[r][k];
        }
    }
    s
}
