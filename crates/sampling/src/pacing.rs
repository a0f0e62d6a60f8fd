//! How many prompt tokens may join a step while other sequences are generating.
//!
//! On a CPU every prompt token in a batch costs about as much as a generated one, so a prompt
//! chunk of fixed size stalls every generating stream by the chunk's cost (256 tokens were seen
//! to turn a 10 ms step into 1-2 s). The pacer learns, from the steps it sees, what a
//! generating-only step costs and what one more prompt token adds, and lets in as many prompt
//! tokens as keep a mixed step within `stall` times a generating-only one. With no sequence
//! generating, a prompt gets the whole `prefill_chunk`. Only prompts longer than one chunk are
//! paced (the scheduler decides): short ones join whole, so throughput under many short requests
//! is unchanged. The price is paid by the long prompt: under load it is read in smaller pieces
//! (a later first token); `stall` is the knob (`prefill_stall`).

/// Fewest prompt tokens per step, so a prompt always progresses.
const MIN_BUDGET: usize = 8;
/// While the costs are not known yet.
const LEARNING_BUDGET: usize = 32;
/// Weight of the newest observation.
const ALPHA: f64 = 0.2;

#[derive(Debug, Default, Clone, Copy)]
struct Ema(Option<f64>);

impl Ema {
    fn update(&mut self, x: f64) {
        self.0 = Some(match self.0 {
            Some(v) => v + ALPHA * (x - v),
            None => x,
        });
    }
}

#[derive(Debug, Default)]
pub struct Pacer {
    /// Nanoseconds of a step with generating tokens only, per generating token.
    decode_per_token: Ema,
    /// Nanoseconds one prompt token adds to a step.
    prompt_per_token: Ema,
}

impl Pacer {
    /// Prompt tokens allowed in a step with `decoding` generated tokens, at most `chunk`.
    pub fn budget(&self, decoding: usize, chunk: usize, stall: f64) -> usize {
        if decoding == 0 || stall.is_infinite() {
            return chunk;
        }
        match (self.decode_per_token.0, self.prompt_per_token.0) {
            (Some(d), Some(p)) if p > 0.0 => {
                let allowed = (stall - 1.0).max(0.0) * d * decoding as f64 / p;
                (allowed as usize).clamp(MIN_BUDGET, chunk.max(MIN_BUDGET))
            }
            _ => LEARNING_BUDGET.min(chunk),
        }
    }

    /// Learns from a decoded step of `decoding` generated and `prompt` prompt tokens.
    pub fn record(&mut self, decoding: usize, prompt: usize, elapsed_ns: u64) {
        let t = elapsed_ns as f64;
        match (decoding, prompt) {
            (0, 0) => {}
            (d, 0) => self.decode_per_token.update(t / d as f64),
            (0, p) => self.prompt_per_token.update(t / p as f64),
            (d, p) => {
                if let Some(per) = self.decode_per_token.0 {
                    self.prompt_per_token.update(((t - per * d as f64) / p as f64).max(0.0));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_generating_sequence_gets_the_whole_chunk_and_learning_is_cautious() {
        let p = Pacer::default();
        assert_eq!(p.budget(0, 256, 1.5), 256);
        assert_eq!(p.budget(4, 256, 1.5), LEARNING_BUDGET);
        assert_eq!(p.budget(4, 16, 1.5), 16);
    }

    #[test]
    fn the_budget_keeps_a_mixed_step_within_the_stall() {
        let mut p = Pacer::default();
        // 16 generating tokens take 16 ms; prompt tokens cost 0.5 ms each.
        p.record(16, 0, 16_000_000);
        p.record(0, 100, 50_000_000);
        // 0.5 x 16 ms of room: 16 prompt tokens; 2 x 16 ms: 64.
        assert_eq!(p.budget(16, 256, 1.5), 16);
        assert_eq!(p.budget(16, 256, 3.0), 64);
        assert_eq!(p.budget(16, 32, 100.0), 32, "never above the chunk");
        assert_eq!(p.budget(1, 256, 1.0), MIN_BUDGET, "always some progress");
        assert_eq!(p.budget(16, 256, f64::INFINITY), 256);
        // A mixed step that cost more than predicted lowers the next budget.
        p.record(16, 16, 16_000_000 + 16 * 2_000_000);
        assert_eq!(p.budget(16, 256, 3.0), 40);
    }
}
