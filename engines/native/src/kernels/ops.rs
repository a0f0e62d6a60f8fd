//! The element-wise and row-wise operations of a transformer layer, in f32.

/// RMS norm of each `dim`-wide row of `x` into `out`, scaled by `weight` (`x / rms * w`).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut Vec<f32>) {
    let dim = weight.len();
    out.clear();
    out.resize(x.len(), 0.0);
    for (row, o) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let scale = 1.0 / (mean_sq + eps).sqrt();
        for ((o, v), w) in o.iter_mut().zip(row).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// `gate = silu(gate) * up`, in place (the SwiGLU of llama-style MLPs).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `x += y`.
pub fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_gives_unit_rms_rows_times_the_weight() {
        let x = [3.0, 4.0, 0.0, -1.0, 1.0, -1.0, 1.0, -1.0];
        let mut out = Vec::new();
        rms_norm(&x, &[1.0, 1.0, 2.0, 1.0], 0.0, &mut out);
        let rms0 = ((9.0 + 16.0 + 1.0) / 4.0f32).sqrt();
        assert!((out[0] - 3.0 / rms0).abs() < 1e-6 && (out[3] + 1.0 / rms0).abs() < 1e-6);
        assert_eq!(&out[4..], &[1.0, -1.0, 2.0, -1.0]);
    }

    #[test]
    fn silu_mul_matches_its_definition() {
        let mut g = [0.0, 1.0, -2.0];
        silu_mul(&mut g, &[2.0, 2.0, 1.0]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 2.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
        assert!((g[2] - -2.0 / (1.0 + 2f32.exp())).abs() < 1e-6);
    }
}
