//! Speculative decoding without a draft model: prompt-lookup drafting.
//!
//! The draft for a sequence is what followed the last place its own recent tokens appeared before
//! (in the prompt or in the text generated so far): a summary quotes its source, an edit copies
//! most of the code it was given, a tool loop repeats names and arguments. The engine feeds the
//! pending token and the draft in one forward, samples at every position in order, and keeps the
//! draft up to the first token the sampler did not pick. Sampling stays exactly what it was:
//! each kept token is the one the sampler drew from the model's logits at its position, and a
//! draft token counts only if the draw equals it (for a fixed draft, accepting a draft token with
//! probability p(d) and resampling from the rest on a miss is the same as drawing and comparing),
//! so from the same logits greedy output is token for token the same and sampled output follows
//! the same distribution. (An engine whose logits move with the batch's shape, as llama.cpp's do,
//! may resolve a near tie differently with a draft in the batch.)
//!
//! Drafting costs a forward over more tokens, which pays only when drafts are kept and extra
//! tokens are cheap. [`Speculator`] keeps per sequence how often its draft tokens were kept and
//! drafts only as deep as pays against what one more token costs the step (`StepCost`): long
//! drafts on a GPU or at one sequence, none on a CPU already batching many sequences. A sequence
//! whose drafts stop paying rests for a while, longer each time, then tries one token again, so
//! free text costs next to nothing.

/// How prompt-lookup drafting searches and how long its drafts get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftSettings {
    /// Most draft tokens per step and sequence; 0 turns drafting off.
    pub max: usize,
    /// Longest and shortest suffix of the sequence looked up; a longer match is tried first.
    pub ngram_max: usize,
    pub ngram_min: usize,
}

impl DraftSettings {
    /// Matches of 3 and 4 tokens: in free text a 1- or 2-token match ("of the") is followed by
    /// something else more often than not, and such drafts cost more than they saved (SmolLM2
    /// continuing Hamlet at temperature 0.8 ran 4% slower with 2-token matches); copied text
    /// matches at any length.
    pub const DEFAULT: DraftSettings = DraftSettings { max: 8, ngram_max: 4, ngram_min: 3 };

    pub fn enabled(&self) -> bool {
        self.max > 0
    }
}

/// `speculative_draft_max`, an engine setting: 0 (off) to 32 draft tokens per sequence and step.
pub fn parse_draft_max(value: &serde_json::Value) -> Result<usize, String> {
    value
        .as_u64()
        .filter(|&v| v <= 32)
        .map(|v| v as usize)
        .ok_or_else(|| format!("`speculative_draft_max` takes an integer from 0 (off) to 32, got {value}"))
}

/// `speculative_threshold`, an engine setting: a chance from 0 (draft as deep as
/// `speculative_draft_max` whenever the text matches) to 1 (never), or `"auto"` (`None`): what one
/// more token costs the step, measured.
pub fn parse_draft_threshold(value: &serde_json::Value) -> Result<Option<f64>, String> {
    if value.as_str() == Some("auto") {
        return Ok(None);
    }
    value
        .as_f64()
        .filter(|v| (0.0..=1.0).contains(v))
        .map(Some)
        .ok_or_else(|| format!("`speculative_threshold` takes a number from 0 to 1 or \"auto\", got {value}"))
}

/// The tokens that followed the most recent earlier occurrence of the longest suffix of
/// `history` (from `ngram_max` down to `ngram_min` tokens), at most `max` of them; empty when
/// no suffix occurred before. Scans backwards, so the nearest occurrence wins: in a long context
/// the nearest copy is the one being repeated.
pub fn lookup<T: PartialEq + Copy>(history: &[T], s: &DraftSettings, max: usize) -> Vec<T> {
    let len = history.len();
    if max == 0 {
        return Vec::new();
    }
    for n in (s.ngram_min.max(1)..=s.ngram_max).rev() {
        if n >= len {
            continue;
        }
        let suffix = &history[len - n..];
        // A match starting at `start` ends at `start + n`; it must end before the suffix itself
        // begins its last token, so that at least one token follows it.
        for start in (0..len - n).rev() {
            if &history[start..start + n] == suffix {
                let from = start + n;
                let to = (from + max).min(len);
                return history[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

/// One sequence's drafting state: how often its draft tokens were kept, and whether it rests.
///
/// A draft token at depth `k` is kept only if the `k - 1` before it were, so with a chance `a`
/// per token it is kept with chance `a^k`; it is worth feeding while `a^k` exceeds what one more
/// token adds to the step (`StepCost::marginal_share`, the caller's `threshold`). `a` is
/// estimated from this sequence's recent drafts (tokens kept against drafts cut short).
#[derive(Clone, Debug)]
pub struct Speculator {
    settings: DraftSettings,
    /// Recent tokens kept and drafts cut short, decaying so that a change of content shows.
    kept: f64,
    cut: f64,
    /// Steps left before drafting again after drafts stopped paying.
    resting: u32,
    /// How long the next rest lasts; doubles each time, back to the start once a draft is kept.
    next_rest: u32,
    /// After a rest one token is drafted whatever the estimate, to learn whether drafts pay again.
    probe: bool,
    pub drafted: u64,
    pub accepted: u64,
}

/// Weight kept by the earlier drafts at each new one.
const DECAY: f64 = 0.8;
/// How much more likely than break-even a draft token must be kept.
const MARGIN: f64 = 1.25;
const FIRST_REST: u32 = 8;
const LONGEST_REST: u32 = 256;
/// The threshold while the engine does not know its step costs yet: low enough to draft a token
/// with no history (chance 1/2, above 0.3 x `MARGIN`), so that the costs and the chance get
/// measured.
pub const UNKNOWN_COST_THRESHOLD: f64 = 0.3;

impl Speculator {
    pub fn new(settings: DraftSettings) -> Self {
        Speculator {
            settings,
            kept: 0.0,
            cut: 0.0,
            resting: 0,
            next_rest: FIRST_REST,
            probe: false,
            drafted: 0,
            accepted: 0,
        }
    }

    /// The chance a draft token is kept, given the one before it was (1/2 with no history).
    pub fn chance(&self) -> f64 {
        (self.kept + 1.0) / (self.kept + self.cut + 2.0)
    }

    /// How many draft tokens pay when one more token costs `threshold` of a step's time per token,
    /// with a margin for the noise in both estimates (a draft at break-even only adds jitter).
    fn worth(&self, threshold: f64) -> usize {
        let a = self.chance();
        let mut depth = 0;
        let mut p = a;
        while depth < self.settings.max && p > threshold * MARGIN {
            depth += 1;
            p *= a;
        }
        depth
    }

    /// The draft for the next step, at most `room` tokens (what the batch, the context and
    /// `max_tokens` leave); empty while resting, when drafts do not pay at `threshold`, or when
    /// nothing matches. A threshold of 1 or more is "not now" (no token is kept more surely than
    /// that): nothing is drafted and the sequence's state stays as it was.
    pub fn draft<T: PartialEq + Copy>(&mut self, history: &[T], room: usize, threshold: f64) -> Vec<T> {
        if !self.settings.enabled() || room == 0 || threshold >= 1.0 {
            return Vec::new();
        }
        if self.resting > 0 {
            self.resting -= 1;
            return Vec::new();
        }
        let mut depth = self.worth(threshold);
        if depth == 0 {
            if !self.probe {
                self.resting = self.next_rest;
                self.next_rest = (self.next_rest * 2).min(LONGEST_REST);
                self.probe = true;
                return Vec::new();
            }
            depth = 1;
        }
        let draft = lookup(history, &self.settings, depth.min(room));
        if !draft.is_empty() {
            self.probe = false;
        }
        draft
    }

    /// Records that `accepted` of `drafted` draft tokens were kept.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
        self.kept = self.kept * DECAY + accepted as f64;
        self.cut = self.cut * DECAY + f64::from(u8::from(accepted < drafted));
        if accepted > 0 {
            self.next_rest = FIRST_REST;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: DraftSettings = DraftSettings { max: 8, ngram_max: 3, ngram_min: 1 };

    #[test]
    fn the_longest_suffix_finds_what_followed_it() {
        // "a b c d e ... a b c" -> the 3-gram "a b c" occurred at 0; "d e x" followed.
        let h = [1, 2, 3, 4, 5, 9, 7, 1, 2, 3];
        assert_eq!(lookup(&h, &S, 3), vec![4, 5, 9]);
        // Bounded by max and by the end of the history.
        assert_eq!(lookup(&h, &S, 1), vec![4]);
        let h = [1, 2, 3, 1, 2];
        assert_eq!(lookup(&h, &S, 8), vec![3, 1, 2]);
    }

    #[test]
    fn the_nearest_occurrence_wins_and_longer_matches_first() {
        // "7 1" occurs at 0 (then 5) and at 3 (then 6); the suffix "7 1" matches both: nearest is 3.
        let h = [7, 1, 5, 7, 1, 6, 0, 7, 1];
        assert_eq!(lookup(&h, &S, 1), vec![6]);
        // With the 3-gram "0 7 1" absent elsewhere, "7 1" (2 tokens) is tried before "1".
        let h = [1, 4, 2, 7, 1, 5, 0, 7, 1];
        assert_eq!(lookup(&h, &S, 2), vec![5, 0]);
    }

    #[test]
    fn no_match_and_too_short_draft_nothing() {
        assert!(lookup(&[1, 2, 3, 4], &S, 8).is_empty());
        assert!(lookup::<i32>(&[], &S, 8).is_empty());
        assert!(lookup(&[5], &S, 8).is_empty());
        let two = DraftSettings { ngram_min: 2, ..S };
        // Only a 1-token match exists ("3"), below ngram_min.
        assert!(lookup(&[3, 8, 1, 3], &two, 8).is_empty());
    }

    #[test]
    fn drafts_lengthen_while_kept_and_rest_when_they_do_not_pay() {
        let mut s = Speculator::new(DraftSettings { max: 8, ngram_max: 2, ngram_min: 1 });
        let h: Vec<u32> = (0..20).chain(0..3).collect();
        // No history: a chance of 1/2; at a threshold of 0.3 one token pays (0.5), two do not (0.25).
        assert_eq!(s.draft(&h, 100, 0.3).len(), 1);
        for _ in 0..6 {
            s.record(4, 4);
        }
        assert!(s.chance() > 0.9, "{}", s.chance());
        assert_eq!(s.draft(&h, 100, 0.3).len(), 8, "long drafts while they are kept");
        assert_eq!(s.draft(&h, 2, 0.3).len(), 2, "never more than the room");
        let cheap = s.draft(&h, 100, 0.05).len();
        let dear = s.draft(&h, 100, 0.7).len();
        assert!(cheap == 8 && (1..8).contains(&dear), "a dearer token drafts less: {cheap} {dear}");
        // Drafts cut at once, again and again: the chance falls until nothing pays.
        for _ in 0..12 {
            s.record(4, 0);
        }
        assert!(s.chance() < 0.3, "{}", s.chance());
        for _ in 0..=FIRST_REST {
            assert!(s.draft(&h, 100, 0.3).is_empty(), "rests");
        }
        assert_eq!(s.draft(&h, 100, 0.3).len(), 1, "then probes with one token");
        s.record(1, 0);
        let rest = (0..).take_while(|_| s.draft(&h, 100, 0.3).is_empty()).count();
        assert_eq!(rest as u32, FIRST_REST * 2 + 1, "the next rest is longer");
        assert_eq!((s.drafted, s.accepted), (6 * 4 + 12 * 4 + 1, 6 * 4));
    }

    #[test]
    fn a_threshold_of_one_drafts_nothing_and_changes_nothing() {
        let mut s = Speculator::new(DraftSettings { max: 8, ngram_max: 2, ngram_min: 1 });
        let h: Vec<u32> = (0..20).chain(0..3).collect();
        for _ in 0..100 {
            assert!(s.draft(&h, 100, 1.0).is_empty());
            assert!(s.draft(&h, 100, f64::INFINITY).is_empty());
        }
        assert_eq!(s.draft(&h, 100, 0.3).len(), 1, "no rest was taken meanwhile");
    }

    #[test]
    fn off_drafts_nothing() {
        let mut s = Speculator::new(DraftSettings { max: 0, ..S });
        assert!(s.draft(&[1, 2, 1], 10, 0.0).is_empty());
    }
}
