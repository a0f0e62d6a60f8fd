//! `/v1/completions` (legacy text completion).

use crate::chat::FinishReason;
use crate::common::{StreamOptions, Usage};
use crate::embeddings::token_ids;
use crate::sampling::{choice_count, Sampling, SamplingWire, StopWire, UnsetSampling, MAX_CHOICES_PER_REQUEST};
use crate::{output_constraint, ApiError, OutputFields};
use serde::{Deserialize, Serialize};

/// OpenAI's documented default for this endpoint.
pub const DEFAULT_COMPLETION_MAX_TOKENS: u32 = 16;

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: PromptWire,
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub min_p: Option<f64>,
    #[serde(default)]
    pub repeat_penalty: Option<f64>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub seed: Option<i64>,
    /// llmr's: `false` turns speculative decoding (prompt lookup) off for this request.
    #[serde(default)]
    pub speculative: Option<bool>,
    #[serde(default)]
    pub stop: Option<StopWire>,
    #[serde(default)]
    pub n: Option<i64>,
    #[serde(default)]
    pub best_of: Option<i64>,
    #[serde(default)]
    pub echo: Option<bool>,
    #[serde(default)]
    pub logprobs: Option<i64>,
    #[serde(default)]
    pub suffix: Option<String>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub user: Option<String>,
    /// Not OpenAI's (its legacy completions have none); llama-server and vLLM accept it here
    /// with chat's meaning, and so does llmr.
    #[serde(default)]
    pub response_format: Option<serde_json::Value>,
    /// llama-server's: a JSON schema the answer must follow, as a `json_schema` response format.
    #[serde(default)]
    pub json_schema: Option<serde_json::Value>,
    /// llama-server's grammar (Lark after `%llguidance`; GBNF is refused).
    #[serde(default)]
    pub grammar: Option<serde_json::Value>,
    /// vLLM's structured outputs, and its older `guided_*` fields.
    #[serde(default)]
    pub structured_outputs: Option<serde_json::Value>,
    #[serde(default)]
    pub guided_json: Option<serde_json::Value>,
    #[serde(default)]
    pub guided_regex: Option<serde_json::Value>,
    #[serde(default)]
    pub guided_choice: Option<serde_json::Value>,
    #[serde(default)]
    pub guided_grammar: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "expected a string, a list of strings, a list of token ids or a list of token-id lists")]
pub enum PromptWire {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

/// One prompt of a completion request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompletionPrompt {
    Text(String),
    /// Token ids of the model's vocabulary (OpenAI accepts them).
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone)]
pub struct TextCompletionRequest {
    pub model: String,
    /// One or more prompts; each gets `n` choices (indexed prompt by prompt).
    pub prompts: Vec<CompletionPrompt>,
    pub n: u32,
    pub sampling: Sampling,
    pub echo: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// The field an engine's refusal of `sampling.constraint` is blamed on.
    pub constraint_param: &'static str,
    /// The sampling settings left to the model's recommendations.
    pub unset: UnsetSampling,
}

impl CompletionRequest {
    pub fn validate(self) -> Result<TextCompletionRequest, ApiError> {
        if self.model.trim().is_empty() {
            return Err(ApiError::invalid("model", "must not be empty"));
        }
        let text = |t: String, param: &str| {
            if t.trim().is_empty() {
                Err(ApiError::invalid(param, "must not be empty or whitespace only"))
            } else {
                Ok(CompletionPrompt::Text(t))
            }
        };
        let prompts: Vec<CompletionPrompt> = match self.prompt {
            PromptWire::Text(t) => vec![text(t, "prompt")?],
            PromptWire::Texts(v) if v.is_empty() => return Err(ApiError::invalid("prompt", "must not be empty")),
            PromptWire::Texts(v) => {
                v.into_iter().enumerate().map(|(i, t)| text(t, &format!("prompt[{i}]"))).collect::<Result<_, _>>()?
            }
            PromptWire::Tokens(ids) => vec![CompletionPrompt::Tokens(token_ids(ids, "prompt")?)],
            PromptWire::TokenLists(lists) => lists
                .into_iter()
                .enumerate()
                .map(|(i, ids)| token_ids(ids, &format!("prompt[{i}]")).map(CompletionPrompt::Tokens))
                .collect::<Result<_, _>>()?,
        };
        let n = choice_count(self.n)?;
        if prompts.len() * n as usize > MAX_CHOICES_PER_REQUEST {
            return Err(ApiError::invalid(
                "prompt",
                format!(
                    "{} prompts with n = {n} make {} choices; at most {MAX_CHOICES_PER_REQUEST} per request",
                    prompts.len(),
                    prompts.len() * n as usize
                ),
            ));
        }
        if self.echo == Some(true) && prompts.iter().any(|p| matches!(p, CompletionPrompt::Tokens(_))) {
            return Err(ApiError::invalid("echo", "needs a text prompt (the prompt came as token ids)"));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid("suffix", "is not supported"));
        }
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(ApiError::invalid("best_of", "only 1 is supported"));
        }
        let wire = SamplingWire {
            max_tokens: Some(self.max_tokens.unwrap_or(DEFAULT_COMPLETION_MAX_TOKENS as i64)),
            max_tokens_field: "max_tokens",
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            stop: self.stop,
            speculative: self.speculative,
        };
        let unset = wire.unset();
        let mut sampling = wire.validate()?;
        sampling.logprobs = match self.logprobs {
            None => None,
            Some(n) if (0..=5).contains(&n) => Some(n as u32),
            Some(n) => {
                return Err(ApiError::invalid("logprobs", format!("{n} is out of range; it must be between 0 and 5")))
            }
        };
        let constraint_param;
        (sampling.constraint, constraint_param) = output_constraint(OutputFields {
            response_format: self.response_format.as_ref(),
            json_schema: self.json_schema.as_ref(),
            grammar: self.grammar.as_ref(),
            structured_outputs: self.structured_outputs.as_ref(),
            guided_json: self.guided_json.as_ref(),
            guided_regex: self.guided_regex.as_ref(),
            guided_choice: self.guided_choice.as_ref(),
            guided_grammar: self.guided_grammar.as_ref(),
        })?;
        let stream = self.stream.unwrap_or(false);
        Ok(TextCompletionRequest {
            model: self.model,
            prompts,
            n,
            sampling,
            echo: self.echo.unwrap_or(false),
            stream,
            include_usage: stream && self.stream_options.is_some_and(|o| o.include_usage),
            constraint_param,
            unset,
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TextCompletion {
    pub id: String,
    /// `text_completion`
    pub object: String,
    pub created: u64,
    pub model: String,
    #[serde(default)]
    pub system_fingerprint: Option<String>,
    pub choices: Vec<TextChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TextChoice {
    pub text: String,
    pub index: u32,
    #[serde(default)]
    pub logprobs: Option<TextLogprobs>,
    pub finish_reason: Option<FinishReason>,
}

/// The legacy logprobs shape: parallel arrays.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TextLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<serde_json::Map<String, serde_json::Value>>,
    pub text_offset: Vec<usize>,
}

impl TextLogprobs {
    pub fn from_tokens(tokens: &[crate::TokenLogprob], start_offset: usize) -> Self {
        let mut out = TextLogprobs::default();
        let mut offset = start_offset;
        for t in tokens {
            out.tokens.push(t.text.clone());
            out.token_logprobs.push(t.logprob);
            out.top_logprobs.push(t.top.iter().map(|(s, lp)| (s.clone(), serde_json::Value::from(*lp))).collect());
            out.text_offset.push(offset);
            offset += t.text.len();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_body;

    fn req(json: &str) -> Result<TextCompletionRequest, ApiError> {
        parse_body::<CompletionRequest>(json.as_bytes())?.validate()
    }

    #[test]
    fn defaults_and_errors() {
        let r = req(r#"{"model":"m","prompt":"Once"}"#).unwrap();
        assert_eq!(r.sampling.max_tokens, Some(DEFAULT_COMPLETION_MAX_TOKENS));
        use CompletionPrompt::{Text, Tokens};
        assert_eq!(req(r#"{"model":"m","prompt":["Once"]}"#).unwrap().prompts, [Text("Once".into())]);
        assert_eq!(req(r#"{"model":"m","prompt":[1,2,3]}"#).unwrap().prompts, [Tokens(vec![1, 2, 3])]);
        assert_eq!(req(r#"{"model":"m","prompt":[[7]]}"#).unwrap().prompts, [Tokens(vec![7])]);
        let several = req(r#"{"model":"m","prompt":["a","b"],"n":3}"#).unwrap();
        assert_eq!((several.prompts, several.n), (vec![Text("a".into()), Text("b".into())], 3));
        assert_eq!(
            req(r#"{"model":"m","prompt":[[1],[2,3]]}"#).unwrap().prompts,
            [Tokens(vec![1]), Tokens(vec![2, 3])]
        );
        for (json, param) in [
            (r#"{"model":"m","prompt":"   "}"#, "prompt"),
            (r#"{"model":"m","prompt":""}"#, "prompt"),
            (r#"{"model":"m","prompt":["a"," "]}"#, "prompt[1]"),
            (r#"{"model":"m","prompt":[[1],[]]}"#, "prompt[1]"),
            (r#"{"model":"m","prompt":["a","b","c","d","e"],"n":16}"#, "prompt"),
            (r#"{"model":"m","prompt":"x","n":17}"#, "n"),
            (r#"{"model":"m","prompt":[1,-2]}"#, "prompt[1]"),
            (r#"{"model":"m","prompt":[]}"#, "prompt"),
            (r#"{"model":"m","prompt":[1],"echo":true}"#, "echo"),
            (r#"{"model":"m","prompt":"x","logprobs":9}"#, "logprobs"),
            (r#"{"model":"m","prompt":"x","top_p":1.5}"#, "top_p"),
        ] {
            let e = req(json).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{json}");
        }
    }
}
