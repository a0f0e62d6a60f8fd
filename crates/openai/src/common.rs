//! Shapes shared by several endpoints: usage, stream options, logprobs, ids.

use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV the engine reused from an earlier request.
    pub cached_tokens: u32,
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: u32) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: Some(PromptTokensDetails { cached_tokens }),
        }
    }
}

pub use llmr_engine_types::TokenLogprob;

/// Chat logprobs: `{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Logprobs {
    pub content: Vec<LogprobEntry>,
    pub refusal: Option<Vec<LogprobEntry>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogprobEntry {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Vec<TopLogprobEntry>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TopLogprobEntry {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

impl Logprobs {
    pub fn from_tokens(tokens: &[TokenLogprob]) -> Self {
        let content = tokens
            .iter()
            .map(|t| LogprobEntry {
                token: t.text.clone(),
                logprob: t.logprob,
                bytes: t.text.as_bytes().to_vec(),
                top_logprobs: Some(
                    t.top
                        .iter()
                        .map(|(text, lp)| TopLogprobEntry {
                            token: text.clone(),
                            logprob: *lp,
                            bytes: text.as_bytes().to_vec(),
                        })
                        .collect(),
                ),
            })
            .collect();
        Logprobs { content, refusal: None }
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `chatcmpl-…`-style ids: a prefix and a process-unique, time-seeded counter.
pub fn new_id(prefix: &str, n: u64) -> String {
    format!("{prefix}-{:x}{n:08x}", unix_now())
}

/// The same with an underscore, as the Responses and Anthropic APIs spell theirs (`resp_…`,
/// `msg_…`, `toolu_…`).
pub fn new_underscore_id(prefix: &str, n: u64) -> String {
    format!("{prefix}_{:x}{n:08x}", unix_now())
}
