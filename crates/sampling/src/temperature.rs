//! Temperature sampling, with or without top-p and min-p, straight from the logits.
//!
//! The OpenAI defaults (temperature 1, top_p 1, no top_k) make a llama.cpp sampler chain build a
//! candidate array over the whole vocabulary and call libm's `expf` once per token id: for
//! Gemma 3's 262,144 ids that is about 2 ms per sampled token on this machine, 15% of single-user
//! decode and more at high concurrency, where the scheduler samples every sequence in turn. Here
//! the weights come from one pass of plain arithmetic that the compiler vectorizes, and the draw
//! finds its block of 512 ids before its token: 0.14 ms per draw over 262,144 logits (one pass of
//! libm `expf` alone takes 0.89 ms). Top-p finds its cut from two histograms of the
//! probabilities instead of sorting the vocabulary, in integer sums that a GPU kernel repeats to
//! the bit, so that a draw made on the device is the host's.

use crate::logits::max_logit;

/// e^x for x <= 0, to about 2e-6 relative error, in arithmetic without calls, branches or
/// float-to-int conversions, so that loops over it vectorize. Below -87 it is about 1e-38.
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    // e^x = 2^t = 2^k * 2^f with k = round(t), f in [-0.5, 0.5]. Adding 1.5 * 2^23 rounds t to
    // an integer held in the low mantissa bits.
    const ROUNDER: f32 = 12_582_912.0;
    let t = x.max(-87.0) * std::f32::consts::LOG2_E;
    let big = t + ROUNDER;
    let k = big - ROUNDER;
    let f = t - k;
    let k_bits = (big.to_bits() as i32).wrapping_sub(ROUNDER.to_bits() as i32);
    // Taylor series of 2^f = e^(f ln 2) to degree 6.
    const C: [f32; 6] =
        [std::f32::consts::LN_2, 0.240_226_5, 0.055_504_11, 0.009_618_129, 0.001_333_356, 0.000_154_035_3];
    let p = 1.0 + f * (C[0] + f * (C[1] + f * (C[2] + f * (C[3] + f * (C[4] + f * C[5])))));
    f32::from_bits(((k_bits + 127) as u32) << 23) * p
}

/// Buffers reused from draw to draw.
#[derive(Default)]
struct Scratch {
    weights: Vec<f32>,
    /// Sum of each `BLOCK` of weights, to find the drawn token fast.
    blocks: Vec<f32>,
    /// Top-p: each token's bucket and probability at temperature 1 in fixed point, their mass
    /// per bucket, and the tokens of the group where the cut falls (bucket, logit).
    fine: Vec<u32>,
    fixed: Vec<u64>,
    mass: Vec<u64>,
    inside: Vec<(u32, f32)>,
}

const BLOCK: usize = 512;

/// Top-p's probabilities (at temperature 1) in fixed point, 2^40 for 1: their sums are exact in
/// any order, so a GPU kernel summing them in parallel (the native engine's pick kernels) finds
/// the same cut as this code.
const FIXED_ONE: f32 = 1_099_511_627_776.0;
/// Top-p's histogram buckets by distance below the best logit: 1/16384 of a logit wide, in
/// groups of 1024 (1/16 of a logit); the last catches everything from 64 logits down.
const FINE_PER_LOGIT: f32 = 16384.0;
const FINE_LAST: u32 = 1024 * 1024 - 1;
const GROUP_BITS: u32 = 10;
const GROUP: usize = 1 << GROUP_BITS;

#[inline(always)]
fn fine_bucket(below_best: f32) -> u32 {
    (below_best * FINE_PER_LOGIT).min(FINE_LAST as f32) as u32
}

/// A probability in fixed point (`FIXED_ONE` for 1), truncated, in arithmetic that vectorizes:
/// the product is an integer below 2^52 once floored in f64, and adding 2^52 puts that integer
/// in the low bits of the f64 (AVX2 has no f32 or f64 to 64-bit integer conversion).
#[inline(always)]
fn fixed(prob: f32) -> u64 {
    const TWO_52: f64 = 4_503_599_627_370_496.0;
    let v = (f64::from(prob) * f64::from(FIXED_ONE)).floor();
    (v + TWO_52).to_bits() - TWO_52.to_bits()
}

/// The first bucket of `hist` where the running sum from `before` reaches `wanted` (the last
/// when none does), and the sum before it.
fn crossing(hist: &[u64], wanted: u64, mut before: u64) -> (usize, u64) {
    for (b, &m) in hist.iter().enumerate() {
        if before + m >= wanted {
            return (b, before);
        }
        before += m;
    }
    (hist.len() - 1, before - hist[hist.len() - 1])
}

/// How far below the best logit top-p cuts, as llama.cpp's top-p sampler does: it keeps the
/// smallest set of most likely tokens whose probability (at temperature 1, before min-p and
/// the temperature, as in its chain) reaches `p`. Tokens within 1/16384 of a logit of the last
/// one kept (a probability 1.00006 times its own) are kept too: the cut is found in a
/// histogram, by group, then by bucket in the group where the mass reaches `p`, not by a sort.
#[inline(always)]
fn top_p_gap(logits: &[f32], max: f32, p: f32, scratch: &mut Scratch) -> f32 {
    // Each token's bucket and fixed-point probability in plain arithmetic that vectorizes, then
    // the histogram by group (the one scalar pass).
    scratch.fine.clear();
    scratch.fine.extend(logits.iter().map(|&l| fine_bucket(max - l)));
    scratch.fixed.clear();
    scratch.fixed.extend(logits.iter().map(|&l| fixed(exp_nonpositive(l - max))));
    let hist = &mut scratch.mass;
    hist.clear();
    hist.resize(GROUP, 0);
    // Adding the 0 of a far-down token changes nothing: no branch.
    for (&fine, &q) in scratch.fine.iter().zip(&scratch.fixed) {
        hist[(fine >> GROUP_BITS) as usize] += q;
    }
    let total: u64 = scratch.fixed.iter().sum();
    let wanted = (total as f64 * f64::from(p)) as u64;
    let (group, before) = crossing(hist, wanted, 0);
    // The group's tokens, then the bucket in it where the mass reaches `wanted`.
    scratch.inside.clear();
    hist.clear();
    hist.resize(GROUP, 0);
    for ((&fine, &q), &l) in scratch.fine.iter().zip(&scratch.fixed).zip(logits) {
        if (fine >> GROUP_BITS) as usize == group && q != 0 {
            hist[fine as usize & (GROUP - 1)] += q;
            scratch.inside.push((fine, l));
        }
    }
    let cut = ((group << GROUP_BITS) | crossing(hist, wanted, before).0) as u32;
    let lowest = scratch.inside.iter().filter(|t| t.0 == cut).fold(f32::INFINITY, |m, t| m.min(t.1));
    if lowest.is_finite() {
        lowest - max
    } else {
        f32::NEG_INFINITY
    }
}

/// Fills the weights of one draw, e^((logit - max) / T) for the tokens that top-p and min-p keep
/// and 0 for the rest, with their block sums; returns their total.
#[inline(always)]
fn weigh(logits: &[f32], scale: f32, min_gap: f32, top_p: f32, scratch: &mut Scratch) -> f32 {
    let max = max_logit(logits);
    let gap = if top_p < 1.0 { min_gap.max(top_p_gap(logits, max, top_p, scratch)) } else { min_gap };
    scratch.weights.resize(logits.len(), 0.0);
    scratch.blocks.clear();
    for (w, l) in scratch.weights.chunks_mut(BLOCK).zip(logits.chunks(BLOCK)) {
        let mut sums = [0.0f32; 8];
        for (w8, l8) in w.chunks_mut(8).zip(l.chunks(8)) {
            for ((o, &v), s) in w8.iter_mut().zip(l8).zip(sums.iter_mut()) {
                let x = v - max;
                *o = if x >= gap { exp_nonpositive(x * scale) } else { 0.0 };
                *s += *o;
            }
        }
        scratch.blocks.push(sums.iter().sum());
    }
    scratch.blocks.iter().sum()
}

/// The same compiled for AVX2 + FMA, used when the CPU has them (the crate is built for the
/// x86-64 baseline, where the loops get 4 lanes instead of 8).
///
/// # Safety
/// The CPU must support AVX2 and FMA (`is_x86_feature_detected!`): the body is compiled to use
/// them, and running it elsewhere is an illegal instruction. Nothing else is unsafe in it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weigh_avx2(logits: &[f32], scale: f32, min_gap: f32, top_p: f32, scratch: &mut Scratch) -> f32 {
    weigh(logits, scale, min_gap, top_p, scratch)
}

pub struct TemperatureSampler {
    inv_temperature: f32,
    /// Tokens whose logit is more than this far below the best are left out (ln(min_p); without
    /// min-p the lowest finite gap, so that a logit of minus infinity, a token a grammar masked
    /// out, weighs exactly nothing: the fast `exp` gives it about 1e-38, which a draw rounding
    /// past the last kept token could land on).
    min_logit_gap: f32,
    /// Keep the most likely tokens up to this probability (1: all).
    top_p: f32,
    rng: fastrand::Rng,
    scratch: Scratch,
}

impl TemperatureSampler {
    pub fn new(temperature: f32, top_p: f32, min_p: f32, seed: u64) -> Self {
        TemperatureSampler {
            inv_temperature: 1.0 / temperature,
            // llama.cpp's min_p compares raw logits, before the temperature: so does this.
            min_logit_gap: if min_p > 0.0 { min_p.ln() } else { f32::MIN },
            top_p,
            rng: fastrand::Rng::with_seed(seed),
            scratch: Scratch::default(),
        }
    }

    /// Draws a token id with probability softmax(logits / temperature), among the tokens top-p
    /// and min-p keep.
    pub fn sample(&mut self, logits: &[f32]) -> usize {
        let draw = self.next_draw();
        draw.choose_with(logits, &mut self.scratch)
    }

    /// The next draw as settings and its random number, for a model that holds the logits
    /// where the host cannot read them cheaply (a GPU) and draws there, as [`Self::sample`]
    /// would: it takes the same one number from the generator, so a seeded request draws the
    /// same sequence of numbers on either side.
    pub fn next_draw(&mut self) -> Draw {
        Draw {
            u: self.rng.f32(),
            inv_temperature: self.inv_temperature,
            min_logit_gap: self.min_logit_gap,
            top_p: self.top_p,
        }
    }
}

/// One temperature draw: its settings and its uniform number (what a GPU kernel needs to draw
/// from the logits it holds as [`TemperatureSampler::sample`] draws on the host).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Draw {
    /// In [0, 1): where the draw lands in the kept tokens' cumulative weight, in id order.
    pub u: f32,
    pub inv_temperature: f32,
    /// Tokens more than this far below the best logit are left out (ln(min_p), or the lowest
    /// finite gap without min-p).
    pub min_logit_gap: f32,
    /// Keep the most likely tokens up to this probability at temperature 1 (1: all).
    pub top_p: f32,
}

impl Draw {
    /// The id this draw picks from `logits` on the host.
    pub fn choose(&self, logits: &[f32]) -> usize {
        self.choose_with(logits, &mut Scratch::default())
    }

    fn choose_with(&self, logits: &[f32], scratch: &mut Scratch) -> usize {
        let (scale, gap, top_p) = (self.inv_temperature, self.min_logit_gap, self.top_p);
        #[cfg(target_arch = "x86_64")]
        let total = if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: `weigh_avx2` only requires the CPU to have AVX2 and FMA, checked just above;
            // its arguments are ordinary references, as for `weigh`.
            unsafe { weigh_avx2(logits, scale, gap, top_p, scratch) }
        } else {
            weigh(logits, scale, gap, top_p, scratch)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let total = weigh(logits, scale, gap, top_p, scratch);
        let Scratch { weights, blocks, .. } = scratch;
        let mut target = self.u * total;
        // Find the block, then the token in it. Rounding may leave the sums a hair short of the
        // target: then the last token with weight is the draw.
        let mut last_kept = 0;
        for (b, &sum) in blocks.iter().enumerate() {
            if sum <= 0.0 {
                continue;
            }
            let start = b * BLOCK;
            let block = &weights[start..(start + BLOCK).min(weights.len())];
            if target >= sum {
                target -= sum;
                last_kept = start + block.iter().rposition(|&w| w > 0.0).unwrap_or(0);
                continue;
            }
            for (i, &w) in block.iter().enumerate() {
                if w > 0.0 {
                    last_kept = start + i;
                    if target < w {
                        return start + i;
                    }
                    target -= w;
                }
            }
        }
        last_kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exponential_is_close_to_libm() {
        let mut worst = 0.0f32;
        for i in 0..=200_000 {
            let x = -(i as f32) * 80.0 / 200_000.0;
            let (fast, exact) = (exp_nonpositive(x), x.exp());
            worst = worst.max((fast - exact).abs() / exact);
        }
        assert!(worst < 5e-6, "worst relative error {worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(-1000.0) < 1e-37);
    }

    #[test]
    fn masked_tokens_weigh_nothing() {
        // A grammar's mask: a few tokens kept among many at minus infinity, with and without
        // top-p and min-p.
        let mut logits = vec![f32::NEG_INFINITY; 5000];
        for (i, l) in [(7, 1.0f32), (300, 0.5), (4999, -2.0)] {
            logits[i] = l;
        }
        for (top_p, min_p) in [(1.0, 0.0), (0.9, 0.0), (1.0, 0.05)] {
            let mut s = TemperatureSampler::new(1.3, top_p, min_p, 3);
            let (scale, gap) = (s.inv_temperature, s.min_logit_gap);
            weigh(&logits, scale, gap, top_p, &mut s.scratch);
            let kept: Vec<usize> = (0..logits.len()).filter(|&i| s.scratch.weights[i] > 0.0).collect();
            assert!(kept.iter().all(|&i| logits[i].is_finite()), "{kept:?}");
            for _ in 0..2000 {
                assert!(logits[s.sample(&logits)].is_finite());
            }
        }
    }

    #[test]
    fn draws_follow_the_softmax_at_the_temperature() {
        let logits = [2.0f32, 1.0, 0.0, -1.0, 0.5];
        let t = 0.7;
        let z: f32 = logits.iter().map(|l| (l / t).exp()).sum();
        let mut s = TemperatureSampler::new(t, 1.0, 0.0, 42);
        let n = 200_000;
        let mut counts = [0usize; 5];
        for _ in 0..n {
            counts[s.sample(&logits)] += 1;
        }
        for (i, &c) in counts.iter().enumerate() {
            let expected = (logits[i] / t).exp() / z;
            let seen = c as f32 / n as f32;
            // Four standard deviations of a binomial proportion.
            let tolerance = 4.0 * (expected * (1.0 - expected) / n as f32).sqrt();
            assert!((seen - expected).abs() < tolerance, "token {i}: {seen} vs {expected}");
        }
    }

    #[test]
    fn min_p_leaves_out_unlikely_tokens_and_a_seed_repeats() {
        // With min_p 0.1 only tokens whose probability is at least a tenth of the best's remain:
        // e^(l - 3) >= 0.1 keeps logits >= 0.70.
        let logits = [3.0f32, 2.5, 0.8, 0.6, -5.0];
        let mut s = TemperatureSampler::new(1.5, 1.0, 0.1, 7);
        let draws: Vec<usize> = (0..5_000).map(|_| s.sample(&logits)).collect();
        assert!(draws.iter().all(|&i| i <= 2), "a token below min_p was drawn");
        assert!(draws.contains(&2), "the high temperature should reach token 2");
        let mut again = TemperatureSampler::new(1.5, 1.0, 0.1, 7);
        assert!(draws.iter().all(|&d| d == again.sample(&logits)), "same seed, same draws");
    }

    #[test]
    fn top_p_keeps_what_a_sort_would_keep() {
        let mut rng = fastrand::Rng::with_seed(3);
        for case in 0..40 {
            let spread = [2.0f32, 8.0, 30.0][case % 3];
            let logits: Vec<f32> = (0..5_000).map(|_| rng.f32() * spread).collect();
            let p = [0.0f32, 0.5, 0.9, 0.95, 0.999][case % 5];
            // Reference: sort, keep until the cumulative probability reaches p.
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sorted: Vec<f32> = logits.iter().map(|l| l - max).collect();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let z: f64 = sorted.iter().map(|&x| f64::from(x).exp()).sum();
            let mut acc = 0.0f64;
            let mut expected = sorted[0];
            for &x in &sorted {
                acc += f64::from(x).exp() / z;
                expected = x;
                if acc >= f64::from(p) {
                    break;
                }
            }
            let gap = top_p_gap(&logits, max, p, &mut Scratch::default());
            // The edge token may differ by float rounding of the running sums, not by more.
            let kept = logits.iter().filter(|&&l| l - max >= gap).count();
            let kept_expected = logits.iter().filter(|&&l| l - max >= expected).count();
            assert!(kept.abs_diff(kept_expected) <= 1, "case {case}: kept {kept}, a sort keeps {kept_expected}");
        }
    }

    #[test]
    fn fixed_point_probabilities_are_the_truncated_products() {
        // The GPU kernel truncates e * 2^40 to an integer; the vectorized conversion must agree.
        let mut rng = fastrand::Rng::with_seed(8);
        for e in (0..100_000).map(|_| exp_nonpositive(-rng.f32() * 90.0)).chain([0.0, 1.0, 1e-12, 0.5]) {
            assert_eq!(fixed(e), (f64::from(e) * f64::from(FIXED_ONE)) as u64, "{e}");
        }
    }

    #[test]
    fn draws_with_top_p_stay_in_the_nucleus() {
        // Probabilities at temperature 1: 0.64, 0.24, 0.09, 0.03 (rounded): top-p 0.85 keeps two.
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let mut s = TemperatureSampler::new(2.0, 0.85, 0.0, 9);
        let draws: Vec<usize> = (0..5_000).map(|_| s.sample(&logits)).collect();
        assert!(draws.iter().all(|&i| i <= 1), "a token outside the nucleus was drawn");
        let second = draws.iter().filter(|&&i| i == 1).count() as f32 / 5_000.0;
        // Among the two kept, at temperature 2: e^0.5 / (e^1 + e^0.5) = 0.378.
        assert!((second - 0.378).abs() < 0.03, "second token drawn {second}");
    }
}
