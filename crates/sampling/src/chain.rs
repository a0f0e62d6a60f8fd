//! Choosing a token from the logits for one request's settings, in plain Rust: what an engine
//! without llama.cpp's sampler chain samples with.
//!
//! [`Sampler::new`] decides as the llama.cpp plugin does, so that both engines treat the same
//! request alike: greedy without penalties is a plain argmax, temperature sampling without top-k
//! or penalties (with or without top-p and min-p, the OpenAI parameters) draws straight from the
//! logits ([`TemperatureSampler`]); both are [`Direct`], and the llama.cpp plugin uses the same
//! [`Direct::for_settings`]. Everything else goes through [`Chain`], which applies llama-server's
//! order with llama.cpp's semantics: repetition penalties over the last [`PENALTY_LAST_N`] tokens,
//! top-k, top-p, min-p, temperature, then a seeded draw.

use crate::logits::argmax;
use crate::temperature::{exp_nonpositive, Draw, TemperatureSampler};
use llmr_engine_types::Sampling;
use std::cmp::Ordering as CmpOrdering;
use std::sync::atomic::{AtomicU64, Ordering};

/// Tokens the repetition penalties look back over (llama.cpp's default `penalty_last_n`).
pub const PENALTY_LAST_N: usize = 64;

/// A fresh seed per unseeded request: distinct across requests, not reproducible by design.
pub fn random_seed() -> u32 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mixed =
        (nanos ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (mixed >> 32) as u32
}

/// Whether `p` asks for the most likely token: temperature 0, or top-k 1.
pub fn is_greedy(p: &Sampling) -> bool {
    p.temperature <= 0.0 || p.top_k == Some(1)
}

/// The samplers that read the logits directly, without a candidate array over the vocabulary
/// (that alone was seen to cost ~10% of decode speed in the llama.cpp plugin).
pub enum Direct {
    Argmax,
    Temperature(TemperatureSampler),
}

impl Direct {
    /// The direct sampler for `p`, where one applies: greedy without penalties (argmax), or
    /// temperature without top-k and penalties (top-p and min-p included). `None`: `p` needs a
    /// chain. An unseeded request gets [`random_seed`].
    pub fn for_settings(p: &Sampling) -> Option<Self> {
        if p.has_penalties() {
            return None;
        }
        if is_greedy(p) {
            return Some(Self::Argmax);
        }
        if p.top_k.is_none() {
            let seed = p.seed.unwrap_or_else(|| u64::from(random_seed()));
            return Some(Self::Temperature(TemperatureSampler::new(p.temperature, p.top_p, p.min_p, seed)));
        }
        None
    }

    /// The id drawn from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> usize {
        match self {
            Self::Argmax => argmax(logits),
            Self::Temperature(s) => s.sample(logits),
        }
    }
}

/// A next id that a model picks where its logits are ([`Sampler::device_pick`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DevicePick {
    Argmax,
    Draw(Draw),
}

/// One request's sampler: [`Direct`] where it applies, else a [`Chain`].
pub struct Sampler {
    kind: Kind,
}

enum Kind {
    Direct(Direct),
    Chain(Box<Chain>),
}

impl Sampler {
    /// The sampler for `p` over a vocabulary of `n_vocab` ids (the size of the logits).
    pub fn new(p: &Sampling, n_vocab: usize) -> Self {
        let kind = match Direct::for_settings(p) {
            Some(direct) => Kind::Direct(direct),
            None => Kind::Chain(Box::new(Chain::new(p, n_vocab))),
        };
        Sampler { kind }
    }

    /// Whether this request goes through the full chain (else it reads the logits directly).
    pub fn is_chain(&self) -> bool {
        matches!(self.kind, Kind::Chain(_))
    }

    /// How a model that holds the logits where the host cannot read them cheaply (a GPU) picks
    /// this request's next id itself, handing over the id instead of the vocabulary's logits:
    /// the most likely one (greedy, no penalties), or a temperature draw (top-p and min-p
    /// included), which takes this sampler's next random number as [`Self::sample`] would.
    /// `None` where only the host can (a chain: top-k or penalties), or where it would draw and
    /// the model cannot (`draws` false).
    pub fn device_pick(&mut self, draws: bool) -> Option<DevicePick> {
        match &mut self.kind {
            Kind::Direct(Direct::Argmax) => Some(DevicePick::Argmax),
            Kind::Direct(Direct::Temperature(t)) if draws => Some(DevicePick::Draw(t.next_draw())),
            _ => None,
        }
    }

    /// The next token from `logits`. `history` is what the penalties look back over (only its
    /// last [`PENALTY_LAST_N`] tokens count; ids outside the vocabulary are ignored): the tokens
    /// generated so far, as the llama.cpp plugin's chain sees them (llama-server adds the prompt).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let id = match &mut self.kind {
            Kind::Direct(d) => d.sample(logits),
            Kind::Chain(c) => c.sample(logits, history),
        };
        id as u32
    }
}

/// llama.cpp's repetition penalties.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Penalties {
    repeat: f32,
    frequency: f32,
    presence: f32,
}

impl Penalties {
    /// For every distinct token among the last [`PENALTY_LAST_N`] of `history`, seen `count`
    /// times: a positive logit is divided by `repeat` and a negative one multiplied (so both
    /// become less likely), then `count * frequency + presence` is subtracted.
    fn apply(&self, logits: &mut [f32], history: &[u32], scratch: &mut Vec<u32>) {
        scratch.clear();
        scratch.extend_from_slice(&history[history.len().saturating_sub(PENALTY_LAST_N)..]);
        scratch.sort_unstable();
        for run in scratch.chunk_by(|a, b| a == b) {
            let Some(l) = logits.get_mut(run[0] as usize) else { continue };
            *l = if *l <= 0.0 { *l * self.repeat } else { *l / self.repeat };
            *l -= run.len() as f32 * self.frequency + self.presence;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Candidate {
    id: u32,
    logit: f32,
}

/// Most likely first.
fn descending(a: &Candidate, b: &Candidate) -> CmpOrdering {
    b.logit.total_cmp(&a.logit)
}

/// Keeps the `k` highest logits, most likely first (ties at the edge: any of them, as in
/// llama.cpp). `k` 0 keeps everything, as in llama.cpp. Returns whether `c` is now sorted.
fn top_k(c: &mut Vec<Candidate>, k: usize) -> bool {
    if k == 0 {
        return false;
    }
    if k < c.len() {
        c.select_nth_unstable_by(k - 1, descending);
        c.truncate(k);
    }
    c.sort_unstable_by(descending);
    true
}

/// How many candidates top-p keeps: the smallest set of most likely ones whose probability
/// (softmax over the candidates, at temperature 1) reaches `p`, at least one. They are left
/// first in `c`, most likely first; `sorted` says `c` is sorted already. Unsorted
/// candidates are sorted only as far as needed: the best 256, then 4 times more until the set
/// is complete (llama.cpp also starts with its best 256), so a peaked distribution over a
/// large vocabulary costs a selection, not a sort.
fn top_p(c: &mut [Candidate], p: f32, sorted: bool) -> usize {
    if c.is_empty() {
        return 0;
    }
    let max = c.iter().map(|x| x.logit).fold(f32::NEG_INFINITY, f32::max);
    let weight = |x: &Candidate| f64::from(exp_nonpositive(x.logit - max));
    let wanted = f64::from(p) * c.iter().map(weight).sum::<f64>();
    let mut head = if sorted { c.len() } else { c.len().min(256) };
    loop {
        if !sorted {
            if head < c.len() {
                c.select_nth_unstable_by(head - 1, descending);
            }
            c[..head].sort_unstable_by(descending);
        }
        let mut cumulative = 0.0;
        for (i, x) in c[..head].iter().enumerate() {
            cumulative += weight(x);
            if cumulative >= wanted {
                return i + 1;
            }
        }
        if head == c.len() {
            return head; // rounding left the total a hair short: keep everything
        }
        head = (head * 4).min(c.len());
    }
}

/// Keeps the candidates whose probability is at least `p` times the best one's: logits at
/// most `-ln(p)` below the best (raw logits, before the temperature, as llama.cpp compares).
/// Keeps the order.
fn min_p(c: &mut Vec<Candidate>, p: f32) {
    let max = c.iter().map(|x| x.logit).fold(f32::NEG_INFINITY, f32::max);
    let threshold = max + p.ln().min(0.0);
    c.retain(|x| x.logit >= threshold);
}

/// The settings of a chain, and its buffers reused from draw to draw.
pub struct Chain {
    penalties: Option<Penalties>,
    /// Argmax after the penalties.
    greedy: bool,
    top_k: Option<usize>,
    top_p: f32,
    min_p: f32,
    temperature: f32,
    rng: fastrand::Rng,
    /// The logits after the penalties.
    penalized: Vec<f32>,
    candidates: Vec<Candidate>,
    weights: Vec<f32>,
    recent: Vec<u32>,
}

impl Chain {
    /// A chain for `p` whatever the settings (even those a [`Direct`] sampler serves: the tests
    /// compare the two). `n_vocab` sizes its buffers.
    pub fn new(p: &Sampling, n_vocab: usize) -> Self {
        let penalties = p.has_penalties().then_some(Penalties {
            repeat: p.repeat_penalty,
            frequency: p.frequency_penalty,
            presence: p.presence_penalty,
        });
        let seed = p.seed.unwrap_or_else(|| u64::from(random_seed()));
        Chain {
            penalties,
            greedy: is_greedy(p),
            top_k: p.top_k.map(|k| k as usize),
            top_p: p.top_p,
            min_p: p.min_p,
            temperature: p.temperature,
            rng: fastrand::Rng::with_seed(seed),
            penalized: Vec::with_capacity(if penalties.is_some() { n_vocab } else { 0 }),
            candidates: Vec::with_capacity(n_vocab),
            weights: Vec::with_capacity(n_vocab),
            recent: Vec::with_capacity(PENALTY_LAST_N),
        }
    }

    /// The next token from `logits`, with `history` for the penalties (see [`Sampler::sample`]).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> usize {
        let logits = match &self.penalties {
            Some(penalties) => {
                self.penalized.clear();
                self.penalized.extend_from_slice(logits);
                penalties.apply(&mut self.penalized, history, &mut self.recent);
                &self.penalized[..]
            }
            None => logits,
        };
        if self.greedy {
            return argmax(logits);
        }
        let c = &mut self.candidates;
        c.clear();
        c.extend(logits.iter().enumerate().map(|(i, &logit)| Candidate { id: i as u32, logit }));
        let sorted = self.top_k.is_some_and(|k| top_k(c, k));
        if self.top_p < 1.0 {
            let keep = top_p(c, self.top_p, sorted);
            c.truncate(keep);
        }
        if self.min_p > 0.0 {
            min_p(c, self.min_p);
        }
        draw(c, self.temperature, &mut self.rng, &mut self.weights)
    }
}

/// Draws a candidate with probability softmax(logit / temperature) and returns its id.
fn draw(c: &[Candidate], temperature: f32, rng: &mut fastrand::Rng, weights: &mut Vec<f32>) -> usize {
    let Some(first) = c.first() else { return 0 };
    let max = c.iter().map(|x| x.logit).fold(f32::NEG_INFINITY, f32::max);
    let scale = 1.0 / temperature;
    weights.clear();
    // A logit of minus infinity (masked by a grammar) weighs exactly nothing, not the fast
    // `exp`'s 1e-38: a draw rounding past the last kept candidate must not land on it.
    weights.extend(c.iter().map(|x| {
        if x.logit == f32::NEG_INFINITY {
            0.0
        } else {
            exp_nonpositive((x.logit - max) * scale)
        }
    }));
    let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    if !(total.is_finite() && total > 0.0) {
        // Non-finite logits (a repeat penalty of 0 makes +inf): the best candidate.
        return c.iter().fold(*first, |best, &x| if x.logit > best.logit { x } else { best }).id as usize;
    }
    let target = rng.f64() * total;
    let mut running = 0.0;
    let mut last_kept = first.id;
    for (x, &w) in c.iter().zip(weights.iter()) {
        if w > 0.0 {
            running += f64::from(w);
            last_kept = x.id;
            if running > target {
                return x.id as usize;
            }
        }
    }
    // Rounding left the sum a hair short of the target: the last candidate with weight.
    last_kept as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(f: impl FnOnce(&mut Sampling)) -> Sampling {
        let mut p = Sampling { seed: Some(42), ..Sampling::default() };
        f(&mut p);
        p
    }

    fn candidates(logits: &[f32]) -> Vec<Candidate> {
        logits.iter().enumerate().map(|(i, &logit)| Candidate { id: i as u32, logit }).collect()
    }

    fn ids(c: &[Candidate]) -> Vec<u32> {
        let mut ids: Vec<u32> = c.iter().map(|x| x.id).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn masked_candidates_are_never_drawn() {
        // A grammar's mask, through the chain (top-k wider than what the mask keeps, penalties).
        let mut logits = vec![f32::NEG_INFINITY; 3000];
        logits[10] = 0.3;
        logits[2000] = -0.4;
        let mut s = Sampler::new(&settings(|p| (p.top_k, p.repeat_penalty) = (Some(50), 1.2)), logits.len());
        let mut weights = Vec::new();
        let c = candidates(&logits);
        let mut rng = fastrand::Rng::with_seed(9);
        for _ in 0..5000 {
            assert!(logits[draw(&c, 1.0, &mut rng, &mut weights)].is_finite());
            assert!(logits[s.sample(&logits, &[10, 11]) as usize].is_finite());
        }
        assert!(weights.iter().zip(&c).all(|(&w, x)| (w > 0.0) == x.logit.is_finite()));
    }

    /// softmax(logits / t) over `kept`, 0 elsewhere.
    fn softmax_over(logits: &[f32], kept: &[usize], t: f64) -> Vec<f64> {
        let max = kept.iter().map(|&i| f64::from(logits[i])).fold(f64::NEG_INFINITY, f64::max);
        let mut p = vec![0.0; logits.len()];
        for &i in kept {
            p[i] = ((f64::from(logits[i]) - max) / t).exp();
        }
        let z: f64 = p.iter().sum();
        p.iter().map(|x| x / z).collect()
    }

    /// Draws `n` tokens and checks their frequencies against `expected`: a token of probability
    /// 0 is never drawn, each other within 4.5 standard deviations of a binomial proportion, and
    /// Pearson's chi-square below its 99.99% quantile.
    fn assert_draws_follow(mut next: impl FnMut() -> usize, expected: &[f64], n: usize) {
        let mut counts = vec![0usize; expected.len()];
        for _ in 0..n {
            counts[next()] += 1;
        }
        let mut chi2 = 0.0;
        let mut cells = 0;
        for (i, (&c, &e)) in counts.iter().zip(expected).enumerate() {
            if e == 0.0 {
                assert_eq!(c, 0, "token {i} should never be drawn: {counts:?}");
                continue;
            }
            let seen = c as f64 / n as f64;
            let tolerance = 4.5 * (e * (1.0 - e) / n as f64).sqrt();
            assert!((seen - e).abs() <= tolerance, "token {i}: drawn {seen}, expected {e} ({counts:?})");
            chi2 += (c as f64 - e * n as f64).powi(2) / (e * n as f64);
            cells += 1;
        }
        // 99.99% quantiles of chi-square with 1..=9 degrees of freedom.
        const Q: [f64; 9] = [15.14, 18.42, 21.11, 23.51, 25.74, 27.86, 29.88, 31.83, 33.72];
        if cells > 1 {
            assert!(chi2 < Q[cells - 2], "chi-square {chi2} with {} degrees of freedom ({counts:?})", cells - 1);
        }
    }

    #[test]
    fn sampler_new_decides_as_the_llama_plugin_does() {
        let chain = |f: fn(&mut Sampling)| Sampler::new(&settings(f), 10).is_chain();
        assert!(!chain(|p| *p = Sampling::greedy()), "greedy: argmax");
        assert!(!chain(|p| p.top_k = Some(1)), "top_k 1 is greedy");
        assert!(!chain(|_| {}), "OpenAI defaults: temperature straight from the logits");
        assert!(!chain(|p| (p.top_p, p.min_p) = (0.9, 0.05)), "top-p and min-p: still direct");
        assert!(chain(|p| p.top_k = Some(40)));
        assert!(chain(|p| p.frequency_penalty = 0.1));
        assert!(chain(|p| p.presence_penalty = -0.5));
        assert!(chain(|p| (p.temperature, p.repeat_penalty) = (0.0, 1.1)), "greedy after penalties");
        assert!(matches!(Direct::for_settings(&Sampling::greedy()), Some(Direct::Argmax)));
        assert!(matches!(Direct::for_settings(&settings(|_| {})), Some(Direct::Temperature(_))));
        assert!(Direct::for_settings(&settings(|p| p.top_k = Some(2))).is_none());
    }

    #[test]
    fn penalties_change_logits_as_llama_cpp_does() {
        let pen = Penalties { repeat: 1.5, frequency: 0.25, presence: 0.5 };
        let mut logits = [2.0f32, -1.0, 0.5, 3.0, 1.0, 0.0];
        // Token 0 twice, 1, 3 and 5 once; 99 is outside the vocabulary.
        pen.apply(&mut logits, &[0, 0, 1, 3, 99, 5], &mut Vec::new());
        let expected = [
            2.0 / 1.5 - (2.0 * 0.25 + 0.5), // positive: divided
            -1.5 - (0.25 + 0.5),            // negative (-1.0): multiplied
            0.5,                            // not in the history
            3.0 / 1.5 - (0.25 + 0.5),
            1.0,
            0.0 - (0.25 + 0.5), // zero: multiplied (stays 0), then the rest
        ];
        for (i, (&got, &want)) in logits.iter().zip(&expected).enumerate() {
            assert!((got - want).abs() < 1e-6, "token {i}: {got} vs {want}");
        }
        assert!((logits[0] - 1.0 / 3.0).abs() < 1e-6 && (logits[1] + 2.25).abs() < 1e-6);

        // Only the last 64 tokens count: token 4 is 65 back; token 2 is seen 64 times.
        let mut logits = [2.0f32, -1.0, 0.5, 3.0, 1.0];
        let mut history = vec![4u32];
        history.extend([2; PENALTY_LAST_N]);
        pen.apply(&mut logits, &history, &mut Vec::new());
        assert_eq!(logits[4], 1.0);
        assert!((logits[2] - (0.5 / 1.5 - (64.0 * 0.25 + 0.5))).abs() < 1e-5, "{}", logits[2]);
        assert_eq!(logits[..2], [2.0, -1.0]);
    }

    #[test]
    fn greedy_with_penalties_takes_the_best_penalized_logit() {
        let logits = [3.0f32, 2.9, 0.0];
        let mut s = Sampler::new(&settings(|p| (p.temperature, p.repeat_penalty) = (0.0, 1.1)), 3);
        assert_eq!(s.sample(&logits, &[]), 0);
        assert_eq!(s.sample(&logits, &[0]), 1, "3.0 / 1.1 = 2.73 < 2.9");
        assert_eq!(s.sample(&logits, &[0, 1]), 0, "2.73 > 2.9 / 1.1");
        let mut s = Sampler::new(&Sampling::greedy(), 3);
        assert_eq!(s.sample(&logits, &[0, 0, 0]), 0, "no penalties: the history is ignored");
    }

    #[test]
    fn chain_draws_follow_the_softmax_at_the_temperature() {
        let logits = [2.0f32, 1.0, 0.0, -1.0, 0.5];
        let all = [0, 1, 2, 3, 4];
        let expected = softmax_over(&logits, &all, 0.7);
        let mut chain = Chain::new(&settings(|p| p.temperature = 0.7), logits.len());
        assert_draws_follow(|| chain.sample(&logits, &[]), &expected, 200_000);
        // A penalty makes it a chain; with nothing to penalize it draws the same distribution.
        let mut s = Sampler::new(&settings(|p| (p.temperature, p.frequency_penalty) = (0.7, 0.3)), 5);
        assert!(s.is_chain());
        assert_draws_follow(|| s.sample(&logits, &[]) as usize, &expected, 200_000);
        // And penalized: token 0 seen twice, logit 2.0 - 0.6 = 1.4.
        let penalized = [1.4f32, 1.0, 0.0, -1.0, 0.5];
        let expected = softmax_over(&penalized, &all, 0.7);
        assert_draws_follow(|| s.sample(&logits, &[0, 0]) as usize, &expected, 200_000);
    }

    #[test]
    fn top_k_keeps_the_k_highest() {
        let logits = [0.3f32, 2.5, -1.0, 1.7, 0.9, 2.2, -0.4, 1.1];
        let mut c = candidates(&logits);
        assert!(top_k(&mut c, 3));
        assert_eq!(c.iter().map(|x| x.id).collect::<Vec<_>>(), vec![1, 5, 3], "most likely first");
        let mut c = candidates(&logits);
        assert!(top_k(&mut c, 100));
        assert_eq!(c.len(), 8, "k above the vocabulary keeps everything");
        let mut c = candidates(&logits);
        assert!(!top_k(&mut c, 0));
        assert_eq!(c, candidates(&logits), "0 is off");
        let mut s = Sampler::new(&settings(|p| (p.top_k, p.temperature) = (Some(3), 1.3)), 8);
        let expected = softmax_over(&logits, &[1, 5, 3], 1.3);
        assert_draws_follow(|| s.sample(&logits, &[]) as usize, &expected, 100_000);
    }

    /// The set a full sort keeps: most likely first until the probability reaches `p`.
    fn top_p_reference(logits: &[f32], p: f32) -> Vec<u32> {
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let probs = softmax_over(logits, &order, 1.0);
        let mut acc = 0.0;
        let mut kept = Vec::new();
        for i in order {
            kept.push(i as u32);
            acc += probs[i];
            if acc >= f64::from(p) {
                break;
            }
        }
        kept.sort_unstable();
        kept
    }

    #[test]
    fn top_p_keeps_the_smallest_nucleus() {
        let mut rng = fastrand::Rng::with_seed(3);
        for case in 0..60 {
            let n = [10, 300, 5_000][case % 3];
            let spread = [2.0f32, 8.0, 30.0][case / 3 % 3];
            let logits: Vec<f32> = (0..n).map(|_| rng.f32() * spread).collect();
            let p = [0.0f32, 0.5, 0.9, 0.95, 0.999][case % 5];
            let expected = top_p_reference(&logits, p);
            for sorted in [false, true] {
                let mut c = candidates(&logits);
                if sorted {
                    c.sort_by(descending);
                }
                let keep = top_p(&mut c, p, sorted);
                assert!(c.windows(2).take(keep).all(|w| w[0].logit >= w[1].logit), "kept most likely first");
                assert_eq!(ids(&c[..keep]), expected, "case {case} (n {n}, spread {spread}, p {p}, sorted {sorted})");
            }
        }
        // Probabilities 0.64, 0.24, 0.09, 0.03 (rounded): 0.85 needs two, and draws stay there.
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let mut c = candidates(&logits);
        assert_eq!(top_p(&mut c, 0.85, false), 2);
        let mut s = Chain::new(&settings(|p| (p.top_p, p.temperature) = (0.85, 2.0)), 4);
        let expected = softmax_over(&logits, &[0, 1], 2.0);
        assert_draws_follow(|| s.sample(&logits, &[]), &expected, 100_000);
    }

    #[test]
    fn min_p_keeps_logits_within_ln_p_of_the_best_before_the_temperature() {
        // e^(l - 3) >= 0.1 keeps logits >= 0.70.
        let logits = [3.0f32, 2.5, 0.8, 0.6, -5.0];
        let mut c = candidates(&logits);
        min_p(&mut c, 0.1);
        assert_eq!(ids(&c), vec![0, 1, 2]);
        let mut c = candidates(&logits);
        min_p(&mut c, 1.0);
        assert_eq!(ids(&c), vec![0], "1 keeps the best only");
        // Compared on raw logits: at temperature 0.5 token 1 is e^-2 of the best, still kept.
        let logits = [1.0f32, 0.0];
        let mut s = Sampler::new(&settings(|p| (p.min_p, p.temperature, p.top_k) = (0.3, 0.5, Some(2))), 2);
        assert!(s.is_chain());
        let expected = softmax_over(&logits, &[0, 1], 0.5);
        assert_draws_follow(|| s.sample(&logits, &[]) as usize, &expected, 100_000);
    }

    #[test]
    fn the_chain_runs_in_llama_servers_order() {
        // top-k 2 first, then top-p over what it kept: e^3 / (e^3 + e^2) = 0.73 >= 0.7 keeps one
        // token (top-p first would keep two: 0.64 of the whole).
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let mut s = Sampler::new(&settings(|p| (p.top_k, p.top_p) = (Some(2), 0.7)), 4);
        assert!((0..1000).all(|_| s.sample(&logits, &[]) == 0));
        // Penalties first: token 0 penalized below token 2, then top-k 2 keeps 1 and 2.
        let mut s = Sampler::new(&settings(|p| (p.top_k, p.presence_penalty) = (Some(2), 2.5)), 4);
        let expected = softmax_over(&[0.5, 2.0, 1.0, 0.0], &[1, 2], 1.0);
        assert_draws_follow(|| s.sample(&logits, &[0]) as usize, &expected, 100_000);
    }

    #[test]
    fn the_chain_and_the_direct_sampler_draw_the_same_distribution() {
        // top-p 0.9 keeps {0, 1, 2} (0.46, 0.74, 0.91); min-p 0.05 (logits >= 2 - 3.0) would
        // keep 0..=3; the temperature applies last.
        let logits = [2.0f32, 1.5, 1.0, 0.0, -1.0, -3.0];
        let p = settings(|p| (p.temperature, p.top_p, p.min_p) = (0.8, 0.9, 0.05));
        let expected = softmax_over(&logits, &[0, 1, 2], 0.8);
        let mut direct = Sampler::new(&p, 6);
        assert!(!direct.is_chain());
        assert_draws_follow(|| direct.sample(&logits, &[]) as usize, &expected, 100_000);
        let mut chain = Chain::new(&p, 6);
        assert_draws_follow(|| chain.sample(&logits, &[]), &expected, 100_000);
    }

    #[test]
    fn the_same_seed_repeats_its_draws() {
        let mut rng = fastrand::Rng::with_seed(5);
        let logits: Vec<f32> = (0..2_000).map(|_| rng.f32() * 4.0).collect();
        let run = |f: fn(&mut Sampling)| {
            let mut s = Sampler::new(&settings(f), logits.len());
            let mut history = Vec::new();
            for _ in 0..300 {
                let t = s.sample(&logits, &history);
                history.push(t);
            }
            history
        };
        let chain: fn(&mut Sampling) = |p| (p.top_k, p.repeat_penalty) = (Some(500), 1.3);
        assert_eq!(run(chain), run(chain));
        let direct: fn(&mut Sampling) = |p| p.top_p = 0.95;
        assert_eq!(run(direct), run(direct));
        assert_ne!(run(chain), run(|p| (p.top_k, p.repeat_penalty, p.seed) = (Some(500), 1.3, Some(43))));
        let unseeded = |_: ()| {
            let mut s = Sampler::new(&Sampling { top_k: Some(500), ..Sampling::default() }, logits.len());
            (0..50).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        assert_ne!(unseeded(()), unseeded(()), "unseeded requests get distinct seeds");
        assert_ne!(random_seed(), random_seed());
    }

    #[test]
    fn a_large_vocabulary_with_every_filter() {
        // Over flat logits top-p's partial selection has to widen several times (256, 1024, ...,
        // 65,536), and the draw stays among what every filter keeps.
        let mut rng = fastrand::Rng::with_seed(9);
        let logits: Vec<f32> = (0..65_536).map(|_| rng.f32() * 3.0).collect();
        let p = settings(|p| (p.top_p, p.min_p, p.frequency_penalty) = (0.8, 0.2, 0.1));
        let mut s = Sampler::new(&p, logits.len());
        let nucleus = top_p_reference(&logits, 0.8);
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for _ in 0..10 {
            let t = s.sample(&logits, &[]);
            assert!(nucleus.binary_search(&t).is_ok(), "{t} outside the nucleus");
            assert!(logits[t as usize] >= max + 0.2f32.ln());
        }
    }

    #[test]
    fn a_device_pick_draws_what_the_host_sampler_draws_from_the_same_seed() {
        let mut rng = fastrand::Rng::with_seed(5);
        let logits: Vec<f32> = (0..4000).map(|_| rng.f32() * 12.0).collect();
        for p in [
            settings(|p| p.temperature = 0.8),
            settings(|p| (p.temperature, p.top_p) = (1.0, 0.9)),
            settings(|p| (p.temperature, p.min_p) = (1.3, 0.05)),
        ] {
            let (mut host, mut device) = (Sampler::new(&p, logits.len()), Sampler::new(&p, logits.len()));
            for _ in 0..500 {
                let Some(DevicePick::Draw(d)) = device.device_pick(true) else { panic!("{p:?} draws on a device") };
                assert_eq!(d.choose(&logits) as u32, host.sample(&logits, &[]), "{p:?}");
            }
        }
        assert_eq!(Sampler::new(&Sampling::greedy(), 10).device_pick(false), Some(DevicePick::Argmax));
        assert_eq!(Sampler::new(&settings(|p| p.temperature = 0.8), 10).device_pick(false), None);
        for chain in [settings(|p| p.top_k = Some(40)), settings(|p| p.repeat_penalty = 1.1)] {
            assert_eq!(Sampler::new(&chain, 10).device_pick(true), None, "{chain:?} needs the host's chain");
        }
    }
}
