//! The sampling settings a model's publisher recommends (Hugging Face `generation_config.json`,
//! GGUF `general.sampling.*`), used for the settings a request leaves unset: a model tuned for
//! temperature 0.7 and top-p 0.8 gets them unless the client says otherwise, and OpenAI's
//! defaults apply only where the model recommends nothing (as vLLM does).

use crate::Sampling;
use serde::{Deserialize, Serialize};

/// What a model recommends; every field optional. Engines report it in `ModelInfo`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingDefaults {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat_penalty: Option<f32>,
}

/// Which of those settings a request left unset (the wire crate knows; `Sampling` holds values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnsetSampling {
    pub temperature: bool,
    pub top_p: bool,
    pub top_k: bool,
    pub min_p: bool,
    pub repeat_penalty: bool,
}

impl SamplingDefaults {
    pub fn is_empty(&self) -> bool {
        *self == SamplingDefaults::default()
    }

    /// Fills the settings `unset` names from the recommendations, each only when it lies in the
    /// range a client could have sent (a recommendation outside it is ignored, never an error the
    /// client did not cause); a top-k of 0 or beyond the vocabulary means none.
    pub fn fill(&self, s: &mut Sampling, unset: UnsetSampling, vocab: Option<u32>) {
        let within = |v: Option<f32>, lo: f32, hi: f32| v.filter(|x| x.is_finite() && (lo..=hi).contains(x));
        if unset.temperature {
            if let Some(t) = within(self.temperature, 0.0, 2.0) {
                s.temperature = t;
            }
        }
        if unset.top_p {
            if let Some(p) = within(self.top_p, 0.0, 1.0) {
                s.top_p = p;
            }
        }
        if unset.min_p {
            if let Some(p) = within(self.min_p, 0.0, 1.0) {
                s.min_p = p;
            }
        }
        if unset.repeat_penalty {
            if let Some(p) = within(self.repeat_penalty, 0.0, 10.0) {
                s.repeat_penalty = p;
            }
        }
        if unset.top_k {
            if let Some(k) = self.top_k.filter(|&k| k >= 1 && vocab.is_none_or(|v| k <= v)) {
                s.top_k = Some(k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unset_settings_are_filled_and_only_from_sane_values() {
        let qwen = SamplingDefaults {
            temperature: Some(0.7),
            top_p: Some(0.8),
            top_k: Some(20),
            min_p: None,
            repeat_penalty: Some(1.05),
        };
        let all = UnsetSampling { temperature: true, top_p: true, top_k: true, min_p: true, repeat_penalty: true };
        let mut s = Sampling::default();
        qwen.fill(&mut s, all, Some(151_936));
        assert_eq!((s.temperature, s.top_p, s.top_k, s.min_p, s.repeat_penalty), (0.7, 0.8, Some(20), 0.0, 1.05));
        // The client's own values stay.
        let mut s = Sampling { temperature: 0.0, ..Sampling::default() };
        qwen.fill(&mut s, UnsetSampling { temperature: false, ..all }, None);
        assert_eq!((s.temperature, s.top_k), (0.0, Some(20)));
        // Out-of-range recommendations are ignored.
        let odd = SamplingDefaults { temperature: Some(7.0), top_k: Some(500_000), ..SamplingDefaults::default() };
        let mut s = Sampling::default();
        odd.fill(&mut s, all, Some(49_152));
        assert_eq!((s.temperature, s.top_k), (1.0, None));
    }
}
