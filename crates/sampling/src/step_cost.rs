//! What a forward pass costs as a function of the tokens in its batch, learned from the steps an
//! engine runs: `t(n) = fixed + per_token * n`, fitted by least squares over recent steps.
//!
//! The fixed part is what a step pays whatever it holds (reading the weights once, launching the
//! work, waking threads); the per-token part is the compute each token adds. Their ratio decides
//! whether feeding draft tokens pays ([`crate::Speculator`]): on a GPU, or on a CPU at one
//! sequence, one more token costs a fraction of a step; on a CPU already batching many sequences,
//! about as much as a token of its own.

/// Weight of the newest step in the running sums (about the last 50 steps count).
const ALPHA: f64 = 0.02;
/// Steps seen before the fit is trusted.
const WARM_UP: u32 = 16;
/// Least variance of the batch sizes seen for a slope to mean anything (steps of one size only
/// say nothing about what another token costs).
const MIN_VARIANCE: f64 = 0.25;

#[derive(Clone, Debug, Default)]
pub struct StepCost {
    /// Running (exponentially weighted) means of n, t, n^2 and n*t.
    n: f64,
    t: f64,
    nn: f64,
    nt: f64,
    seen: u32,
}

impl StepCost {
    /// Learns from a step of `tokens` batch tokens that took `elapsed_ns`.
    pub fn record(&mut self, tokens: usize, elapsed_ns: u64) {
        if tokens == 0 {
            return;
        }
        let (n, t) = (tokens as f64, elapsed_ns as f64);
        if self.seen == 0 {
            (self.n, self.t, self.nn, self.nt) = (n, t, n * n, n * t);
        } else {
            let mix = |avg: &mut f64, x: f64| *avg += ALPHA * (x - *avg);
            mix(&mut self.n, n);
            mix(&mut self.t, t);
            mix(&mut self.nn, n * n);
            mix(&mut self.nt, n * t);
        }
        self.seen = self.seen.saturating_add(1);
    }

    /// (fixed, per_token) nanoseconds, once enough steps of different sizes were seen.
    pub fn fit(&self) -> Option<(f64, f64)> {
        let variance = self.nn - self.n * self.n;
        if self.seen < WARM_UP || variance < MIN_VARIANCE {
            return None;
        }
        let per_token = ((self.nt - self.n * self.t) / variance).max(0.0);
        let fixed = (self.t - per_token * self.n).max(0.0);
        Some((fixed, per_token))
    }

    /// What one more token adds to a step of `tokens` tokens, as a share of that step's time per
    /// token: a draft token is worth feeding only when the chance it is kept exceeds this. 1
    /// when every token costs the same (no fixed part), near 0 when the fixed part dominates.
    /// `None` while the costs are not known.
    pub fn marginal_share(&self, tokens: usize) -> Option<f64> {
        let (fixed, per_token) = self.fit()?;
        let n = tokens.max(1) as f64;
        let step = fixed + per_token * n;
        Some(if step > 0.0 { (per_token * n / step).clamp(0.0, 1.0) } else { 1.0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_fixed_and_a_per_token_cost() {
        let mut c = StepCost::default();
        assert_eq!(c.marginal_share(1), None, "nothing seen yet");
        // 6 ms a step plus 1.5 ms a token, batches of 1 to 9 tokens.
        for i in 0..200 {
            let n = 1 + i % 9;
            c.record(n, 6_000_000 + 1_500_000 * n as u64);
        }
        let (fixed, per_token) = c.fit().unwrap();
        assert!((fixed - 6e6).abs() < 1e3 && (per_token - 1.5e6).abs() < 1e3, "{fixed} {per_token}");
        // One sequence: a token adds 1.5 of the 7.5 ms its step takes per token.
        assert!((c.marginal_share(1).unwrap() - 0.2).abs() < 1e-3);
        // Sixteen: 24 of 30 ms.
        assert!((c.marginal_share(16).unwrap() - 0.8).abs() < 1e-3);
    }

    #[test]
    fn steps_of_one_size_teach_no_slope() {
        let mut c = StepCost::default();
        for _ in 0..100 {
            c.record(4, 10_000_000);
        }
        assert_eq!(c.fit(), None);
    }

    #[test]
    fn the_fit_follows_a_change_of_speed() {
        let mut c = StepCost::default();
        for i in 0..300 {
            let n = 1 + i % 5;
            c.record(n, 1_000_000 + 1_000_000 * n as u64);
        }
        let before = c.marginal_share(1).unwrap();
        // The machine gets busy: every token costs three times as much, the fixed part stays.
        for i in 0..600 {
            let n = 1 + i % 5;
            c.record(n, 1_000_000 + 3_000_000 * n as u64);
        }
        let after = c.marginal_share(1).unwrap();
        assert!((before - 0.5).abs() < 0.01 && (after - 0.75).abs() < 0.01, "{before} {after}");
    }
}
