//! The element-wise and row-wise operations of a transformer layer, in f32.

use rayon::prelude::*;

/// RMS norm of each `dim`-wide row of `x` into `out`, scaled by `weight` (`x / rms * w`).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut Vec<f32>) {
    norm_rows(x, weight, 0.0, eps, out);
}

/// Gemma's RMS norm (`Gemma3RMSNorm`): `x / rms * (1 + w)`, the weights stored zero-centred;
/// in f32 as transformers computes it (`(x / rms)` first, then times `1 + w`).
pub fn rms_norm_gemma(x: &[f32], weight: &[f32], eps: f32, out: &mut Vec<f32>) {
    norm_rows(x, weight, 1.0, eps, out);
}

/// [`rms_norm_gemma`] in place: Gemma's q/k norms, one row per head.
pub fn rms_norm_gemma_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    let norm = |row: &mut [f32]| {
        let scale = inv_rms(row, eps);
        for (v, w) in row.iter_mut().zip(weight) {
            *v = *v * scale * (1.0 + w);
        }
    };
    if x.len() >= 2 * NORM_TASK_ROWS * dim {
        x.par_chunks_exact_mut(dim).with_min_len(NORM_TASK_ROWS).for_each(norm);
    } else {
        x.chunks_exact_mut(dim).for_each(norm);
    }
}

/// Rows of a norm one task takes: a prompt chunk's rows spread over the pool (one thread
/// norming them kept the others waiting), a decoding step's few stay on the caller's thread.
const NORM_TASK_ROWS: usize = 16;

fn inv_rms(row: &[f32], eps: f32) -> f32 {
    let mean_sq = sum_of_squares(row) / row.len() as f32;
    1.0 / (mean_sq + eps).sqrt()
}

/// `Σ v²` as 16 partial sums (sum `j` takes elements `j`, `j + 16`, ...) added pairwise in a
/// fixed order. One running sum was one chain of dependent adds the compiler may not reorder
/// (4% of a prompt's samples, the other threads waiting); 16 are independent, so they
/// vectorise at any register width, and give the same bits at every width.
#[inline(always)]
fn sum_of_squares(row: &[f32]) -> f32 {
    let mut sums = [0f32; 16];
    let mut chunks = row.chunks_exact(16);
    for c in &mut chunks {
        for (s, v) in sums.iter_mut().zip(c) {
            *s += v * v;
        }
    }
    for (s, v) in sums.iter_mut().zip(chunks.remainder()) {
        *s += v * v;
    }
    let mut width = sums.len();
    while width > 1 {
        width /= 2;
        for j in 0..width {
            sums[j] += sums[j + width];
        }
    }
    sums[0]
}

/// `out = x / rms * (offset + w)` per row; `offset` is 0 or 1, exact, so `offset + w` is `w`
/// for the plain norm.
fn norm_rows(x: &[f32], weight: &[f32], offset: f32, eps: f32, out: &mut Vec<f32>) {
    let dim = weight.len();
    // Every element is written below: only a longer `out` needs its new part filled.
    out.resize(x.len(), 0.0);
    let norm = |(row, o): (&[f32], &mut [f32])| {
        let scale = inv_rms(row, eps);
        for ((o, v), w) in o.iter_mut().zip(row).zip(weight) {
            *o = v * scale * (offset + w);
        }
    };
    if x.len() >= 2 * NORM_TASK_ROWS * dim {
        x.par_chunks_exact(dim).zip(out.par_chunks_exact_mut(dim)).with_min_len(NORM_TASK_ROWS).for_each(norm);
    } else {
        x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)).for_each(norm);
    }
}

/// Elements of an activation chunk one task takes.
const ACTIVATION_CHUNK: usize = 8192;

/// `e^x` to about 2 ulp, in arithmetic the compiler vectorises (libm's `expf` is a call per
/// element): `x = n·ln2 + r`, a degree-6 polynomial for `e^r` (|r| <= ln2/2), and `2^n` built
/// from its exponent bits. Saturates below e^-87 and above e^88.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n·LN2_HI is exact for |n| < 2^10.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding 1.5·2^23 rounds to an integer and leaves it in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let n = (shifted.to_bits() as i32).wrapping_sub(0x4B40_0000);
    p * f32::from_bits(((n + 127) << 23) as u32)
}

/// `f(gate, up)` into `gate`, element-wise, in parallel chunks on the caller's pool.
fn gated(gate: &mut [f32], up: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) {
    gate.par_chunks_mut(ACTIVATION_CHUNK).zip(up.par_chunks(ACTIVATION_CHUNK)).for_each(|(g, u)| {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F.
                return unsafe { each_avx512(g, u, &f) };
            }
            if is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2.
                return unsafe { each_avx2(g, u, &f) };
            }
        }
        each(g, u, &f)
    });
}

/// `g = f(g, u)` element by element. The compiler vectorises it to the widest registers the
/// function is compiled for: the crate's baseline target has four f32 lanes (SSE2), so the
/// wider copies below are compiled for the CPUs that have them. Each element takes the same
/// operations in the same order (Rust never fuses a multiply and an add by itself), so every
/// copy gives the same bits.
#[inline(always)]
fn each(g: &mut [f32], u: &[f32], f: &impl Fn(f32, f32) -> f32) {
    for (g, u) in g.iter_mut().zip(u) {
        *g = f(*g, *u);
    }
}

/// [`each`] on 16 lanes (the activations took 5% of a prompt on SSE2).
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn each_avx512(g: &mut [f32], u: &[f32], f: &impl Fn(f32, f32) -> f32) {
    each(g, u, f)
}

/// [`each`] on 8 lanes.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn each_avx2(g: &mut [f32], u: &[f32], f: &impl Fn(f32, f32) -> f32) {
    each(g, u, f)
}

/// `gate = silu(gate) * up`, in place (the SwiGLU of llama-style MLPs).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    gated(gate, up, |g, u| g / (1.0 + exp(-g)) * u);
}

/// PyTorch's `gelu(x, approximate="tanh")` (`gelu_pytorch_tanh`):
/// `0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³)))`.
pub fn gelu_tanh(x: f32) -> f32 {
    // sqrt(2/pi), as PyTorch's kernel forms it (M_SQRT2 * M_2_SQRTPI * 0.5).
    const BETA: f32 = (std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5) as f32;
    const KAPPA: f32 = 0.044715;
    let inner = BETA * (x + KAPPA * x * x * x);
    0.5 * x * (1.0 + inner.tanh())
}

/// `gate = gelu_tanh(gate) * up`, in place (the GeGLU of Gemma's MLP), through the identity
/// `0.5·x·(1 + tanh(z)) = x / (1 + e^(-2z))` and the vectorised [`exp`].
pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    const BETA: f32 = (std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5) as f32;
    const KAPPA: f32 = 0.044715;
    gated(gate, up, |x, u| x / (1.0 + exp(-2.0 * BETA * (x + KAPPA * x * x * x))) * u);
}

/// Logit soft-capping, in place: `x = cap · tanh(x / cap)` (`final_logit_softcapping`).
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = (*v / cap).tanh() * cap;
    }
}

/// `x *= s`.
pub fn scale(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// `x += y`, in parallel chunks as the activations are.
pub fn add(x: &mut [f32], y: &[f32]) {
    gated(x, y, |a, b| a + b);
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

    /// A prompt's rows, normed in parallel on a pool, get the bits each row gets normed alone
    /// (as a decoding step norms it), for every norm; the partial sums keep the norm within
    /// f32 rounding of an f64 one.
    #[test]
    fn norms_give_each_row_its_own_bits_at_any_number_of_rows() {
        let (dim, rows, eps) = (72, 2 * NORM_TASK_ROWS + 5, 1e-6);
        let x: Vec<f32> = (0..rows * dim).map(|i| (i as f32 * 0.37).sin() * (1 + i % 13) as f32).collect();
        let w: Vec<f32> = (0..dim).map(|i| 0.5 - i as f32 * 0.013).collect();
        let threads = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let (mut plain, mut gemma, mut in_place) = (Vec::new(), Vec::new(), x.clone());
        threads.install(|| {
            rms_norm(&x, &w, eps, &mut plain);
            rms_norm_gemma(&x, &w, eps, &mut gemma);
            rms_norm_gemma_in_place(&mut in_place, &w, eps);
        });
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        // A longer buffer than the row: the norm leaves exactly the row's outputs.
        let mut one = vec![f32::NAN; 1000];
        for (r, row) in x.chunks_exact(dim).enumerate() {
            let at = r * dim..(r + 1) * dim;
            rms_norm(row, &w, eps, &mut one);
            assert_eq!(bits(&one), bits(&plain[at.clone()]), "row {r}");
            let rms = (row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / dim as f64 + eps as f64).sqrt();
            for ((&o, &v), &w) in one.iter().zip(row).zip(&w) {
                let want = f64::from(v) / rms * f64::from(w);
                assert!((f64::from(o) - want).abs() <= 1e-6 * want.abs().max(1e-3), "row {r}: {o} against {want}");
            }
            rms_norm_gemma(row, &w, eps, &mut one);
            assert_eq!(bits(&one), bits(&gemma[at.clone()]), "row {r}");
            let mut alone = row.to_vec();
            rms_norm_gemma_in_place(&mut alone, &w, eps);
            assert_eq!(bits(&alone), bits(&in_place[at]), "row {r}");
        }
        assert_eq!(bits(&gemma), bits(&in_place));
    }

    #[test]
    fn gemma_rms_norm_multiplies_by_one_plus_the_weight() {
        let x = [3.0, 4.0, 0.0, -1.0, 1.0, -1.0, 1.0, -1.0];
        let w = [0.0, 0.5, 1.0, -1.0];
        let mut out = Vec::new();
        rms_norm_gemma(&x, &w, 0.0, &mut out);
        let rms0 = ((9.0 + 16.0 + 1.0) / 4.0f32).sqrt();
        let want0 = [3.0 / rms0, 4.0 / rms0 * 1.5, 0.0, 0.0];
        for (a, b) in out[..4].iter().zip(want0) {
            assert!((a - b).abs() < 1e-6, "{out:?}");
        }
        assert_eq!(&out[4..], &[1.0, -1.5, 2.0, 0.0]);
        // A zero weight is the identity scale, unlike the plain norm's.
        let mut plain = Vec::new();
        rms_norm(&x, &[1.0; 4], 0.0, &mut plain);
        rms_norm_gemma(&x, &[0.0; 4], 0.0, &mut out);
        assert_eq!(plain, out);
        // In place over rows of a head's width gives what the out-of-place norm gives, eps
        // included.
        let mut y = x;
        rms_norm_gemma_in_place(&mut y, &w, 1e-6);
        rms_norm_gemma(&x, &w, 1e-6, &mut out);
        assert_eq!(y.to_vec(), out);
    }

    #[test]
    fn gelu_tanh_matches_pytorch() {
        // torch 2.9.1: torch.nn.functional.gelu(torch.tensor([...]), approximate="tanh"), float32.
        let cases = [
            (0.0f32, 0.0f32),
            (1.0, 0.841_192),
            (-1.0, -0.158_808),
            (2.5, 2.484_915_7),
            (-3.0, -0.003_637_433),
            (0.3, 0.185_370_94),
        ];
        for (x, want) in cases {
            let got = gelu_tanh(x);
            assert!((got - want).abs() < 1e-6, "gelu_tanh({x}) = {got}, want {want}");
        }
        // Far out it is the identity and zero.
        assert_eq!(gelu_tanh(20.0), 20.0);
        assert!(gelu_tanh(-20.0).abs() < 1e-6);
        let mut g = [1.0, -1.0];
        gelu_tanh_mul(&mut g, &[2.0, 3.0]);
        assert!((g[0] - 2.0 * 0.841_192).abs() < 1e-5 && (g[1] - 3.0 * -0.158_808).abs() < 1e-5);
    }

    #[test]
    fn softcap_bounds_logits_and_is_near_identity_when_small() {
        let mut x = [0.0, 0.01, 3.0, -100.0, 1e6];
        softcap(&mut x, 3.0);
        assert_eq!(x[0], 0.0);
        assert!((x[1] - 0.01).abs() < 1e-6);
        assert!((x[2] - 3.0 * 1f32.tanh()).abs() < 1e-6);
        assert!((x[3] + 3.0).abs() < 1e-6 && (x[4] - 3.0).abs() < 1e-6);
        let mut y = [1.0, -2.0];
        scale(&mut y, 25.25);
        assert_eq!(y, [25.25, -50.5]);
    }

    #[test]
    fn silu_mul_matches_its_definition() {
        let mut g = [0.0, 1.0, -2.0];
        silu_mul(&mut g, &[2.0, 2.0, 1.0]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 2.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
        assert!((g[2] - -2.0 / (1.0 + 2f32.exp())).abs() < 1e-6);
    }

    /// The activations give the same bits on every register width this CPU has (a length
    /// with a tail past whole vectors, values across exp's range and its saturation).
    #[test]
    fn the_activations_give_the_same_bits_on_every_register_width() {
        let n = 1000 + 13;
        let x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.731).sin() * (i % 97) as f32).collect();
        let up: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.119).cos()).collect();
        let silu = |g: f32, u: f32| g / (1.0 + exp(-g)) * u;
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let mut want = x.clone();
        each(&mut want, &up, &silu);
        let mut widths = 0;
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") {
                let mut got = x.clone();
                // SAFETY: the CPU has AVX-512F.
                unsafe { each_avx512(&mut got, &up, &silu) };
                assert_eq!(bits(&got), bits(&want));
                widths += 1;
            }
            if is_x86_feature_detected!("avx2") {
                let mut got = x.clone();
                // SAFETY: the CPU has AVX2.
                unsafe { each_avx2(&mut got, &up, &silu) };
                assert_eq!(bits(&got), bits(&want));
                widths += 1;
            }
        }
        // And through the public entry, whichever width it picks.
        let mut got = x.clone();
        silu_mul(&mut got, &up);
        assert_eq!(bits(&got), bits(&want));
        eprintln!("{widths} wider copies checked");
    }

    #[test]
    fn the_vectorised_exp_is_within_a_few_ulp_of_libm() {
        let mut worst = 0f64;
        for i in -87_000..88_000 {
            let x = i as f32 * 0.001 + 0.000_37;
            let (got, want) = (exp(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1000.0) < 1e-37 && exp(-1000.0) >= 0.0);
        assert!(exp(1000.0).is_finite());
    }

    #[test]
    fn the_fast_gelu_and_silu_match_their_definitions() {
        let x: Vec<f32> = (0..20_000).map(|i| (i as f32 - 10_000.0) * 0.0013).collect();
        let up: Vec<f32> = (0..20_000).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let mut g = x.clone();
        gelu_tanh_mul(&mut g, &up);
        for ((got, &x), &u) in g.iter().zip(&x).zip(&up) {
            let want = gelu_tanh(x) * u;
            assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "gelu({x}): {got} vs {want}");
        }
        let mut s = x.clone();
        silu_mul(&mut s, &up);
        for ((got, &x), &u) in s.iter().zip(&x).zip(&up) {
            let want = x / (1.0 + (-x).exp()) * u;
            assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "silu({x}): {got} vs {want}");
        }
    }
}
