//! Sampling settings of one generation: what the wire crate validates a request into, the host
//! writes into `llmr_infer_request` and the SDK hands a plugin.

use crate::Constraint;

/// Validated settings (ranges are the wire crate's job: a plugin may rely on them).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sampling {
    /// `None`: until the context is full or the model stops.
    pub max_tokens: Option<u32>,
    /// 0: greedy.
    pub temperature: f32,
    pub top_p: f32,
    /// `None`: off.
    pub top_k: Option<u32>,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// `None`: random.
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    /// `Some(n)`: report the chosen token's logprob and the `n` most likely alternatives.
    pub logprobs: Option<u32>,
    /// `Some`: the output must belong to this grammar (structured output, forced tool calls).
    pub constraint: Option<Constraint>,
    /// Whether an engine that drafts tokens (speculative decoding) may do so for this request;
    /// the output follows the same distribution either way (greedy: the argmax at every token),
    /// `false` only keeps one token per step.
    #[serde(default = "yes")]
    pub speculative: bool,
}

fn yes() -> bool {
    true
}

impl Default for Sampling {
    /// OpenAI's defaults: temperature 1, every other sampler off.
    fn default() -> Self {
        Sampling {
            max_tokens: None,
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            min_p: 0.0,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            stop: Vec::new(),
            logprobs: None,
            constraint: None,
            speculative: true,
        }
    }
}

impl Sampling {
    /// Greedy decoding with every sampler off.
    pub fn greedy() -> Self {
        Sampling { temperature: 0.0, ..Sampling::default() }
    }

    /// Whether any repetition penalty is on.
    pub fn has_penalties(&self) -> bool {
        self.repeat_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
}
