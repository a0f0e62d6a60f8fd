//! What an engine reads off raw logits besides a draw: the most likely token, and the
//! log-probabilities OpenAI reports (`logprobs`, `top_logprobs`).

/// The id of the highest logit; the first of equal ones, as llama.cpp's greedy sampler picks.
/// 0 for an empty slice.
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    let mut best_val = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_val {
            best_val = v;
            best = i;
        }
    }
    best
}

/// Log-probability of `chosen` and the `top_n` most likely tokens under the model's own
/// distribution (raw logits, before sampling transforms), as OpenAI reports them.
pub fn logprobs(logits: &[f32], chosen: usize, top_n: usize) -> (f32, Vec<(usize, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_sum = logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln() + max;
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

    #[test]
    fn logprobs_match_a_softmax_in_f64_over_a_large_vocabulary() {
        let mut rng = fastrand::Rng::with_seed(11);
        // Large logits too: the max is subtracted before exp, so nothing overflows.
        let logits: Vec<f32> = (0..50_000).map(|_| rng.f32() * 40.0 + 60.0).collect();
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let best = argmax(&logits);
        assert!(logits.iter().all(|&l| l <= logits[best]));
        let (lp, top) = logprobs(&logits, 123, 5);
        assert!((f64::from(lp) - (f64::from(logits[123]).exp() / z).ln()).abs() < 1e-3, "chosen {lp}");
        assert_eq!(top.len(), 5);
        assert_eq!(top[0].0, best);
        let mut sorted: Vec<usize> = (0..logits.len()).collect();
        sorted.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), sorted[..5]);
        for &(id, lp) in &top {
            assert!((f64::from(lp) - (f64::from(logits[id]).exp() / z).ln()).abs() < 1e-3);
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
