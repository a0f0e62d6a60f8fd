//! What an engine reads off raw logits besides a draw: the most likely token, and the
//! log-probabilities OpenAI reports (`logprobs`, `top_logprobs`).

use crate::temperature::exp_nonpositive;

/// The id of the highest logit; the first of equal ones, as llama.cpp's greedy sampler picks.
/// 0 for an empty slice, and where none is above `-inf` (NaN never is).
///
/// Two passes that vectorise: the highest value ([`max_logit`]), then the first group of 16
/// holding it. One pass keeping the best id was a branch per logit, on the scheduler's thread
/// while the model's threads wait: Gemma 3 has 262,144 a token.
pub fn argmax(logits: &[f32]) -> usize {
    let max = max_logit(logits);
    if max == f32::NEG_INFINITY {
        return 0;
    }
    let mut groups = logits.chunks(16);
    let group = groups.position(|g| g.iter().fold(false, |seen, &v| seen | (v == max)));
    group.map_or(0, |g| g * 16 + logits[g * 16..].iter().position(|&v| v == max).unwrap_or(0))
}

/// The highest logit, NaN left out (`-inf` where none is above it): eight running maxima, which
/// vectorise, where one would be a chain of dependent comparisons.
#[inline(always)]
pub(crate) fn max_logit(logits: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = logits.chunks_exact(8);
    let tail = chunks.remainder().iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    lanes.iter().copied().fold(tail, f32::max)
}

/// Log-probability of `chosen` and the `top_n` most likely tokens under the model's own
/// distribution (raw logits, before sampling transforms), as OpenAI reports them.
///
/// The normaliser sums `e^(l - max)` with the sampler's vectorised exponential into 16 partial
/// sums: with libm's `expf` a logit and one running sum it took 0.7-0.8 ms over Gemma 3's
/// 262,144 logits (now 0.2-0.3 ms for the whole call), for every sequence that asks, on the
/// scheduler's thread.
pub fn logprobs(logits: &[f32], chosen: usize, top_n: usize) -> (f32, Vec<(usize, f32)>) {
    let max = max_logit(logits);
    let mut sums = [0f32; 16];
    for group in logits.chunks(16) {
        for (s, &l) in sums.iter_mut().zip(group) {
            *s += exp_nonpositive(l - max);
        }
    }
    let log_sum = sums.iter().sum::<f32>().ln() + max;
    let mut top: Vec<(usize, f32)> = Vec::with_capacity(top_n + 1);
    if top_n > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if top.len() < top_n || l > top[top.len() - 1].1 {
                let at = top.partition_point(|&(_, v)| v >= l);
                top.insert(at, (i, l));
                top.truncate(top_n);
            }
        }
    }
    let chosen_lp = logits.get(chosen).map_or(f32::NEG_INFINITY, |l| l - log_sum);
    (chosen_lp, top.into_iter().map(|(i, l)| (i, l - log_sum)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_and_logprobs_agree_with_a_direct_softmax() {
        let logits = [1.0f32, 3.0, 2.0, -1.0];
        assert_eq!(argmax(&logits), 1);
        let (lp, top) = logprobs(&logits, 2, 3);
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((lp - (2.0f32.exp() / z).ln()).abs() < 1e-5);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2, 0]);
        let total: f32 = logits.iter().map(|&l| (l - z.ln()).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
    }

    /// The two passes pick what one pass keeping the first strictly better id picks: ties
    /// within and across groups of 16, NaN, infinities, signed zeros, short and ragged lengths.
    #[test]
    fn argmax_picks_the_first_highest_as_one_pass_does() {
        let one_pass = |logits: &[f32]| {
            let (mut best, mut best_val) = (0, f32::NEG_INFINITY);
            for (i, &v) in logits.iter().enumerate() {
                if v > best_val {
                    (best, best_val) = (i, v);
                }
            }
            best
        };
        let mut cases: Vec<Vec<f32>> = vec![
            vec![],
            vec![f32::NAN; 5],
            vec![f32::NEG_INFINITY; 37],
            vec![f32::NAN, f32::NEG_INFINITY, -3.0, f32::NAN],
            vec![-0.0, 0.0, -0.0],
            vec![0.0, -0.0],
            vec![1.0, f32::INFINITY, 2.0, f32::INFINITY],
        ];
        let mut rng = fastrand::Rng::with_seed(5);
        for len in [1, 7, 15, 16, 17, 31, 33, 100, 262_147] {
            // Few distinct values: the highest recurs, within a group and across groups.
            cases.push((0..len).map(|_| rng.u8(0..6) as f32 - 3.0).collect());
            let mut v: Vec<f32> = (0..len).map(|_| rng.f32() * 50.0 - 25.0).collect();
            v[rng.usize(0..len)] = f32::NAN;
            cases.push(v);
        }
        for (i, logits) in cases.iter().enumerate() {
            assert_eq!(argmax(logits), one_pass(logits), "case {i} ({} logits)", logits.len());
        }
    }

    /// `cargo test --release -p llmr-sampling --lib logits::tests::bench -- --ignored
    /// --nocapture`: over Gemma 3's 262,144 logits, the picks and the log-probabilities against
    /// their one-pass forms (a best id kept with a branch per logit; libm's `expf` into one
    /// running sum), the best of 50 calls.
    #[test]
    #[ignore]
    fn bench() {
        let mut rng = fastrand::Rng::with_seed(1);
        let logits: Vec<f32> = (0..262_144).map(|_| rng.f32() * 30.0 - 10.0).collect();
        let best_of = |f: &dyn Fn(&[f32]) -> f32| {
            let time = || {
                let start = std::time::Instant::now();
                std::hint::black_box(f(std::hint::black_box(&logits)));
                start.elapsed().as_secs_f64() * 1e3
            };
            (0..50).map(|_| time()).fold(f64::INFINITY, f64::min)
        };
        let one_pass_pick = best_of(&|l| {
            let (mut best, mut best_val) = (0, f32::NEG_INFINITY);
            for (i, &v) in l.iter().enumerate() {
                if v > best_val {
                    (best, best_val) = (i, v);
                }
            }
            best as f32
        });
        let pick = best_of(&|l| argmax(l) as f32);
        let libm_normaliser = best_of(&|l| {
            let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            l.iter().map(|&v| (v - max).exp()).sum::<f32>().ln() + max
        });
        let lp = best_of(&|l| logprobs(l, 5, 0).0);
        println!("262,144 logits: argmax {pick:.3} ms (one pass {one_pass_pick:.3}); logprobs {lp:.3} ms (libm normaliser alone {libm_normaliser:.3})");
    }

    #[test]
    fn logprobs_match_a_softmax_in_f64_over_a_large_vocabulary() {
        let mut rng = fastrand::Rng::with_seed(11);
        // Large logits too: the max is subtracted before exp, so nothing overflows.
        let logits: Vec<f32> = (0..50_000).map(|_| rng.f32() * 40.0 + 60.0).collect();
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let best = argmax(&logits);
        assert!(logits.iter().all(|&l| l <= logits[best]));
        let (lp, top) = logprobs(&logits, 123, 5);
        // Within what f32 leaves of a normaliser near 100 (its ulp is 7.6e-6).
        assert!((f64::from(lp) - (f64::from(logits[123]).exp() / z).ln()).abs() < 5e-5, "chosen {lp}");
        assert_eq!(top.len(), 5);
        assert_eq!(top[0].0, best);
        let mut sorted: Vec<usize> = (0..logits.len()).collect();
        sorted.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), sorted[..5]);
        for &(id, lp) in &top {
            assert!((f64::from(lp) - (f64::from(logits[id]).exp() / z).ln()).abs() < 5e-5, "{id}: {lp}");
        }
    }

    #[test]
    fn ties_edges_and_out_of_range() {
        assert_eq!(argmax(&[0.5, 2.0, 2.0, 1.0]), 1, "first of equal logits");
        assert_eq!(argmax(&[]), 0);
        let (lp, top) = logprobs(&[0.0, 0.0], 7, 0);
        assert_eq!(lp, f32::NEG_INFINITY, "an id past the vocabulary has no probability");
        assert!(top.is_empty());
        let (lp, top) = logprobs(&[0.0, 0.0], 1, 10);
        assert!((lp - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(top.len(), 2, "never more than the vocabulary");
    }
}
