//! The settings `set_config` changes while models run (engine-wide or per model), as the llama.cpp
//! plugin names them: prompt chunking and pacing, and prompt-lookup speculation. A change applies
//! from the next step; a draft length to the requests admitted from then on.

use llmr_engine_sdk::{EngineError, ErrorCode};
use llmr_sampling::{parse_draft_max, parse_draft_threshold, DraftSettings};

pub const DEFAULT_PREFILL_CHUNK: usize = 256;
/// How much longer than a plain decode step a step holding prompt tokens may take while others
/// generate (`llmr_sampling::Pacer`): the llama.cpp plugin's (bench/RESULTS.md, "Pacing long
/// prompts").
pub const DEFAULT_PREFILL_STALL: f64 = 4.0;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LiveSettings {
    /// Most prompt tokens a step reads.
    pub prefill_chunk: usize,
    /// How much longer than a plain decode step a step with prompt tokens may take while others
    /// generate (`Pacer`).
    pub prefill_stall: f64,
    /// Prompt-lookup speculation: most draft tokens per sequence and step (0: off), and the
    /// chance of being kept a draft token needs (`None`: what one more token costs the step).
    pub draft_max: usize,
    pub draft_threshold: Option<f64>,
}

impl Default for LiveSettings {
    fn default() -> Self {
        LiveSettings {
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            prefill_stall: DEFAULT_PREFILL_STALL,
            draft_max: DraftSettings::DEFAULT.max,
            draft_threshold: None,
        }
    }
}

/// One setting, checked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LiveChange {
    PrefillChunk(usize),
    PrefillStall(f64),
    DraftMax(usize),
    DraftThreshold(Option<f64>),
}

impl LiveChange {
    /// The setting `key` at `value`; an unknown key or a value out of range is UNSUPPORTED,
    /// naming the key.
    pub fn parse(key: &str, value: &serde_json::Value) -> Result<Self, EngineError> {
        let bad = |what: String| EngineError::new(ErrorCode::Unsupported, what);
        let must = |what: &str| bad(format!("`{key}` must be {what}, got {value}"));
        match key {
            "prefill_chunk" => match value.as_u64() {
                Some(n @ 1..=65536) => Ok(LiveChange::PrefillChunk(n as usize)),
                _ => Err(must("an integer from 1 to 65536")),
            },
            "prefill_stall" => match value.as_f64() {
                Some(x) if x >= 1.0 && x.is_finite() => Ok(LiveChange::PrefillStall(x)),
                _ => Err(must("a number >= 1")),
            },
            "speculative_draft_max" => parse_draft_max(value).map(LiveChange::DraftMax).map_err(bad),
            "speculative_threshold" => parse_draft_threshold(value).map(LiveChange::DraftThreshold).map_err(bad),
            _ => Err(bad(format!(
                "unknown setting `{key}` (known: kv_policy, prefill_chunk, prefill_stall, speculative_draft_max, \
                 speculative_threshold)"
            ))),
        }
    }
}

impl LiveSettings {
    pub fn apply(&mut self, change: LiveChange) {
        match change {
            LiveChange::PrefillChunk(n) => self.prefill_chunk = n,
            LiveChange::PrefillStall(x) => self.prefill_stall = x,
            LiveChange::DraftMax(n) => self.draft_max = n,
            LiveChange::DraftThreshold(t) => self.draft_threshold = t,
        }
    }

    /// These settings with every key of `object` (engine params or a model's load options) that
    /// names one applied; other keys are left to their readers.
    pub fn with_keys_of(mut self, object: &serde_json::Value) -> Result<Self, EngineError> {
        for key in ["prefill_chunk", "prefill_stall", "speculative_draft_max", "speculative_threshold"] {
            if let Some(value) = object.get(key) {
                self.apply(LiveChange::parse(key, value)?);
            }
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn settings_parse_apply_and_refuse_naming_the_key() {
        let mut s = LiveSettings::default();
        s.apply(LiveChange::parse("speculative_draft_max", &json!(0)).unwrap());
        s.apply(LiveChange::parse("speculative_threshold", &json!("auto")).unwrap());
        s.apply(LiveChange::parse("prefill_chunk", &json!(64)).unwrap());
        assert_eq!(s, LiveSettings { draft_max: 0, prefill_chunk: 64, ..LiveSettings::default() });
        s.apply(LiveChange::parse("speculative_threshold", &json!(0.5)).unwrap());
        assert_eq!(s.draft_threshold, Some(0.5));
        for (key, value) in [
            ("speculative_draft_max", json!(33)),
            ("speculative_threshold", json!(1.5)),
            ("prefill_chunk", json!(0)),
            ("prefill_stall", json!(0.5)),
            ("threads_please", json!(2)),
        ] {
            let e = LiveChange::parse(key, &value).unwrap_err();
            assert_eq!(e.code, ErrorCode::Unsupported);
            assert!(e.message.contains(key), "{}", e.message);
        }
        let options = json!({"speculative_draft_max": 4, "kv_policy": {"mode": "static"}});
        let s = LiveSettings::default().with_keys_of(&options).unwrap();
        assert_eq!(s, LiveSettings { draft_max: 4, ..LiveSettings::default() });
        let bad = json!({"prefill_stall": "slow"});
        assert!(LiveSettings::default().with_keys_of(&bad).is_err());
    }
}
