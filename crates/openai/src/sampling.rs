//! The sampling fields every generation endpoint shares, validated into domain values.
//!
//! Ranges follow the OpenAI reference (spec 003 Part 4): temperature 0..2, top_p 0..1,
//! penalties -2..2, max_tokens >= 1. `top_k`, `min_p` and `repeat_penalty` are the llama.cpp
//! extensions most clients send; `top_k`'s upper bound (the vocabulary) is checked once the
//! model is known, by [`SamplingBounds::check_top_k`].

use crate::ApiError;
pub use llmr_engine_types::{Constraint, Sampling, UnsetSampling};
use serde::Deserialize;

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopWire {
    One(String),
    Many(Vec<String>),
}

/// At most this many stop sequences (OpenAI allows 4; llama.cpp clients send more).
pub const MAX_STOP_SEQUENCES: usize = 16;

/// The raw sampling fields, borrowed from whichever request carries them.
#[derive(Debug, Default, Clone)]
pub struct SamplingWire {
    pub max_tokens: Option<i64>,
    pub max_tokens_field: &'static str,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repeat_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<StopWire>,
    /// llmr's: `false` turns speculative decoding off for this request (on by default where the
    /// engine has it; the output follows the same distribution either way).
    pub speculative: Option<bool>,
}

/// At most this many choices per prompt (`n`), and choices per request (prompts times `n`):
/// each is a generation of its own in a slot, so a request is bounded.
pub const MAX_CHOICES: u32 = 16;
pub const MAX_CHOICES_PER_REQUEST: usize = 64;

/// `n`: how many choices to generate for each prompt.
pub fn choice_count(n: Option<i64>) -> Result<u32, ApiError> {
    match n {
        None => Ok(1),
        Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => Ok(n as u32),
        Some(n) => Err(ApiError::invalid("n", format!("{n} is out of range; it must be between 1 and {MAX_CHOICES}"))),
    }
}

fn in_range(param: &str, v: Option<f64>, lo: f64, hi: f64, default: f32) -> Result<f32, ApiError> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(x as f32),
        Some(x) => Err(ApiError::invalid(param, format!("{x} is out of range; it must be between {lo} and {hi}"))),
    }
}

impl SamplingWire {
    /// The settings this request leaves to the model's recommendations.
    pub fn unset(&self) -> UnsetSampling {
        UnsetSampling {
            temperature: self.temperature.is_none(),
            top_p: self.top_p.is_none(),
            top_k: self.top_k.is_none(),
            min_p: self.min_p.is_none(),
            repeat_penalty: self.repeat_penalty.is_none(),
        }
    }

    pub fn validate(self) -> Result<Sampling, ApiError> {
        let max_tokens = match self.max_tokens {
            None => None,
            Some(n) if n >= 1 => Some(u32::try_from(n).unwrap_or(u32::MAX)),
            Some(n) => {
                return Err(ApiError::invalid(self.max_tokens_field, format!("{n} is invalid; it must be >= 1")))
            }
        };
        let top_k = match self.top_k {
            // llama.cpp and vLLM read 0 and -1 as "off".
            None | Some(0) | Some(-1) => None,
            Some(k) if k >= 1 => Some(u32::try_from(k).unwrap_or(u32::MAX)),
            Some(k) => return Err(ApiError::invalid("top_k", format!("{k} is invalid; it must be >= 1"))),
        };
        let stop = match self.stop {
            None => Vec::new(),
            Some(StopWire::One(s)) => vec![s],
            Some(StopWire::Many(v)) => v,
        };
        if stop.len() > MAX_STOP_SEQUENCES {
            return Err(ApiError::invalid("stop", format!("at most {MAX_STOP_SEQUENCES} sequences are allowed")));
        }
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid("stop", "empty stop sequences are not allowed"));
        }
        Ok(Sampling {
            max_tokens,
            temperature: in_range("temperature", self.temperature, 0.0, 2.0, 1.0)?,
            top_p: in_range("top_p", self.top_p, 0.0, 1.0, 1.0)?,
            top_k,
            min_p: in_range("min_p", self.min_p, 0.0, 1.0, 0.0)?,
            repeat_penalty: in_range("repeat_penalty", self.repeat_penalty, 0.0, 10.0, 1.0)?,
            presence_penalty: in_range("presence_penalty", self.presence_penalty, -2.0, 2.0, 0.0)?,
            frequency_penalty: in_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0, 0.0)?,
            // A negative seed (llama.cpp's -1) means "random".
            seed: self.seed.and_then(|s| u64::try_from(s).ok()),
            stop,
            logprobs: None,
            constraint: None,
            speculative: self.speculative.unwrap_or(true),
        })
    }
}

/// The bounds that need the model, checked once it is known.
pub trait SamplingBounds {
    /// `top_k` is 1..=vocabulary size.
    fn check_top_k(&self, vocab_size: u32) -> Result<(), ApiError>;
    /// A prompt that leaves no room to generate is a 400 with both numbers (OpenAI's wording).
    fn check_context(&self, prompt_tokens: u32, context_length: u32, param: &str) -> Result<(), ApiError>;
}

impl SamplingBounds for Sampling {
    fn check_top_k(&self, vocab_size: u32) -> Result<(), ApiError> {
        match self.top_k {
            Some(k) if k > vocab_size => Err(ApiError::invalid(
                "top_k",
                format!("{k} is out of range; it must be between 1 and the vocabulary size, {vocab_size}"),
            )),
            _ => Ok(()),
        }
    }

    fn check_context(&self, prompt_tokens: u32, context_length: u32, param: &str) -> Result<(), ApiError> {
        let wanted = prompt_tokens as u64 + self.max_tokens.unwrap_or(1) as u64;
        if prompt_tokens >= context_length || wanted > context_length as u64 {
            let tail = match self.max_tokens {
                Some(m) => format!(" ({prompt_tokens} in the prompt; {m} requested for the completion)"),
                None => " in the prompt".to_owned(),
            };
            return Err(ApiError::invalid(
                param,
                format!(
                    "this model's maximum context length is {context_length} tokens, but the request needs {}{tail}",
                    if self.max_tokens.is_some() { wanted } else { prompt_tokens as u64 }
                ),
            )
            .with_code("context_length_exceeded"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire() -> SamplingWire {
        SamplingWire { max_tokens_field: "max_tokens", ..Default::default() }
    }

    #[test]
    fn ranges_are_checked_with_the_field_named() {
        let e = SamplingWire { temperature: Some(2.5), ..wire() }.validate().unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("temperature")));
        assert!(e.message.contains("2.5") && e.message.contains("between 0 and 2"), "{}", e.message);
        let e = SamplingWire { top_p: Some(-0.1), ..wire() }.validate().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_p"));
        let e = SamplingWire { max_tokens: Some(0), ..wire() }.validate().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = SamplingWire { max_tokens: Some(-3), max_tokens_field: "max_completion_tokens", ..wire() }
            .validate()
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_completion_tokens"));
        let e = SamplingWire { top_k: Some(-5), ..wire() }.validate().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_k"));
        let e = SamplingWire { temperature: Some(f64::NAN), ..wire() }.validate().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
    }

    #[test]
    fn edges_are_accepted() {
        let s =
            SamplingWire { temperature: Some(0.0), top_p: Some(1.0), top_k: Some(1), max_tokens: Some(1), ..wire() }
                .validate()
                .unwrap();
        assert_eq!((s.temperature, s.top_p, s.top_k, s.max_tokens), (0.0, 1.0, Some(1), Some(1)));
        assert_eq!(SamplingWire { top_k: Some(0), ..wire() }.validate().unwrap().top_k, None);
        assert_eq!(SamplingWire { seed: Some(-1), ..wire() }.validate().unwrap().seed, None);
    }

    #[test]
    fn top_k_and_context_bounds_need_the_model() {
        let s = SamplingWire { top_k: Some(50_000), max_tokens: Some(100), ..wire() }.validate().unwrap();
        let e = s.check_top_k(49_152).unwrap_err();
        assert!(e.message.contains("49152"), "{}", e.message);
        assert!(s.check_top_k(50_000).is_ok());
        let e = s.check_context(8100, 8192, "messages").unwrap_err();
        assert!(
            e.message.contains("8192") && e.message.contains("8200") && e.message.contains("8100"),
            "{}",
            e.message
        );
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(s.check_context(8092, 8192, "messages").is_ok());
        let unbounded = Sampling::default();
        assert!(unbounded.check_context(8192, 8192, "prompt").unwrap_err().message.contains("8192"));
        assert!(unbounded.check_context(8191, 8192, "prompt").is_ok());
    }
}
