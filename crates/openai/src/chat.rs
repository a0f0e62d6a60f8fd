//! `/v1/chat/completions`: the request as sent, its validation into a [`ChatRequest`], and the
//! response and stream-chunk shapes.

use crate::common::{Logprobs, StreamOptions, Usage};
use crate::sampling::{choice_count, Sampling, SamplingWire, StopWire, UnsetSampling};
use crate::{output_constraint, ApiError, OutputFields};
use serde::{Deserialize, Serialize};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<WireMessage>,
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
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
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    #[serde(default)]
    pub tools: Option<Vec<WireTool>>,
    #[serde(default)]
    pub tool_choice: Option<WireToolChoice>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
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
    #[serde(default)]
    pub user: Option<String>,
    /// vLLM's (and transformers'): continue the final assistant message instead of answering it.
    #[serde(default)]
    pub continue_final_message: Option<bool>,
    /// vLLM's: `false` renders the conversation without the assistant's opening.
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// For reasoning models: handed to the chat template as `reasoning_effort` (gpt-oss's reads it).
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    /// For reasoning models: at most this many tokens of thinking, then the thinking is closed
    /// and the answer follows (Qwen's API names it so; Anthropic's is `thinking.budget_tokens`).
    #[serde(default)]
    pub thinking_budget: Option<u32>,
    /// Passed to the chat template as variables (e.g. `enable_thinking`), as vLLM and llama.cpp do.
    #[serde(default)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
pub struct WireMessage {
    pub role: Role,
    #[serde(default)]
    pub content: Option<WireContent>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<WireToolCall>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default, alias = "reasoning")]
    pub reasoning_content: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum WireContent {
    Text(String),
    Parts(Vec<WirePart>),
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WirePart {
    Text { text: String },
    ImageUrl { image_url: WireImageUrl },
    Refusal { refusal: String },
    InputAudio { input_audio: serde_json::Value },
    File { file: serde_json::Value },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireImageUrl {
    pub url: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WireToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: WireFunctionCall,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WireFunctionCall {
    pub name: String,
    /// A JSON text, as OpenAI sends it.
    pub arguments: String,
}

fn function_kind() -> String {
    "function".into()
}

#[derive(Debug, Deserialize)]
pub struct WireTool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: WireFunctionDef,
}

#[derive(Debug, Deserialize)]
pub struct WireFunctionDef {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<serde_json::Value>,
    /// The arguments must follow `parameters` (OpenAI's strict function calling).
    #[serde(default)]
    pub strict: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum WireToolChoice {
    Mode(String),
    Named { r#type: String, function: NamedFunction },
}

#[derive(Debug, Deserialize)]
pub struct NamedFunction {
    pub name: String,
}

/// What the request allows the model to do with its tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Tools are not offered (also when the request has none).
    None,
    Auto,
    Required,
    Function(String),
}

impl ToolChoice {
    /// The model must call (`required`, or a named function).
    pub fn forces_call(&self) -> bool {
        matches!(self, ToolChoice::Required | ToolChoice::Function(_))
    }
}

/// A validated message: content parts that are all text are joined into one text (as vLLM and
/// llama.cpp do: most templates concatenate `message.content` and fail on a list).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatMessage {
    pub role: Role,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    /// The model's reasoning for an earlier assistant turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<WireToolCall>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    /// At least one part is not text.
    Parts(Vec<MessagePart>),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessagePart {
    Text { text: String },
    ImageUrl { image_url: WireImageUrl },
}

impl MessageContent {
    /// Parts that are all text are one text, joined by newlines (most templates concatenate
    /// `content` and fail on a list); with an image among them they stay parts.
    pub fn from_parts(parts: Vec<MessagePart>) -> MessageContent {
        let texts: Option<Vec<&str>> = parts
            .iter()
            .map(|p| match p {
                MessagePart::Text { text } => Some(text.as_str()),
                MessagePart::ImageUrl { .. } => None,
            })
            .collect();
        match texts {
            Some(texts) => MessageContent::Text(texts.join("\n")),
            None => MessageContent::Parts(parts),
        }
    }
}

impl ChatMessage {
    /// A message of plain text.
    pub fn text(role: Role, text: String) -> ChatMessage {
        ChatMessage {
            role,
            content: Some(MessageContent::Text(text)),
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionTool {
    pub name: String,
    pub description: Option<String>,
    /// The JSON Schema of the arguments.
    pub parameters: Option<serde_json::Value>,
    /// The arguments must follow `parameters` even when the model chooses to call
    /// (`tool_choice: auto`): decoded under the schema where the engine can.
    pub strict: bool,
}

/// A validated chat request.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<FunctionTool>,
    pub tool_choice: ToolChoice,
    pub sampling: Sampling,
    pub stream: bool,
    pub include_usage: bool,
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// The field an engine's refusal of `sampling.constraint` is blamed on.
    pub constraint_param: &'static str,
    /// Whether a forced call may be several (OpenAI's `parallel_tool_calls`, default true).
    pub parallel_tool_calls: bool,
    /// The sampling settings left to the model's recommendations.
    pub unset: UnsetSampling,
    /// Choices to generate (`n`).
    pub n: u32,
    /// The last message is the assistant's and the answer continues its text instead of
    /// starting a new turn (Anthropic's prefill; vLLM's `continue_final_message`).
    pub continue_final_message: bool,
    /// The prompt ends with the assistant's opening (the template's generation prompt).
    pub add_generation_prompt: bool,
    /// Tokens a reasoning model may think before its thinking is closed for it.
    pub thinking_budget: Option<u32>,
}

impl ChatCompletionRequest {
    pub fn validate(self) -> Result<ChatRequest, ApiError> {
        if self.model.trim().is_empty() {
            return Err(ApiError::invalid("model", "must not be empty"));
        }
        if self.messages.is_empty() {
            return Err(ApiError::invalid("messages", "must contain at least one message"));
        }
        let (max_tokens, field) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => (Some(m), "max_completion_tokens"),
            (None, m) => (m, "max_tokens"),
        };
        let wire = SamplingWire {
            max_tokens,
            max_tokens_field: field,
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
        let n = choice_count(self.n)?;
        let unset = wire.unset();
        let mut sampling = wire.validate()?;
        sampling.logprobs = match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (_, Some(n)) if !(0..=20).contains(&n) => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    format!("{n} is out of range; it must be between 0 and 20"),
                ))
            }
            (false, Some(n)) if n > 0 => return Err(ApiError::invalid("top_logprobs", "requires `logprobs: true`")),
            (true, n) => Some(n.unwrap_or(0) as u32),
            (false, _) => None,
        };
        let mut messages = Vec::with_capacity(self.messages.len());
        let mut any_text = false;
        for (i, m) in self.messages.into_iter().enumerate() {
            let msg = convert_message(i, m)?;
            any_text |= has_text(&msg) || !msg.tool_calls.is_empty();
            messages.push(msg);
        }
        if !any_text {
            return Err(ApiError::invalid("messages", "every message is empty; the prompt would be empty"));
        }
        let tools: Vec<FunctionTool> = self
            .tools
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                if t.kind != "function" {
                    return Err(ApiError::invalid(
                        &format!("tools[{i}].type"),
                        format!("`{}` is not supported; use `function`", t.kind),
                    ));
                }
                if t.function.name.trim().is_empty() {
                    return Err(ApiError::invalid(&format!("tools[{i}].function.name"), "must not be empty"));
                }
                Ok(FunctionTool {
                    name: t.function.name,
                    description: t.function.description,
                    parameters: t.function.parameters,
                    strict: t.function.strict.unwrap_or(false),
                })
            })
            .collect::<Result<_, _>>()?;
        let tool_choice = match self.tool_choice {
            None if tools.is_empty() => ToolChoice::None,
            None => ToolChoice::Auto,
            Some(WireToolChoice::Mode(m)) => match m.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!("`{other}` is not one of `none`, `auto`, `required` or a named function"),
                    ))
                }
            },
            Some(WireToolChoice::Named { function, .. }) => {
                if !tools.iter().any(|t| t.name == function.name) {
                    return Err(ApiError::invalid(
                        "tool_choice.function.name",
                        format!("`{}` is not one of the request's tools", function.name),
                    ));
                }
                ToolChoice::Function(function.name)
            }
        };
        if tools.is_empty() && tool_choice.forces_call() {
            return Err(ApiError::invalid("tool_choice", "requires `tools`"));
        }
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
        if sampling.constraint.is_some() && tool_choice.forces_call() {
            return Err(ApiError::invalid(
                "response_format",
                "cannot be combined with a forced tool call (`tool_choice` `required` or a named function)",
            ));
        }
        let continue_final_message = self.continue_final_message.unwrap_or(false);
        if continue_final_message {
            if self.add_generation_prompt == Some(true) {
                return Err(ApiError::invalid(
                    "continue_final_message",
                    "cannot be combined with `add_generation_prompt: true`",
                ));
            }
            if messages.last().is_none_or(|m| m.role != Role::Assistant) {
                return Err(ApiError::invalid("continue_final_message", "the last message must be the assistant's"));
            }
        }
        let mut template_kwargs = self.chat_template_kwargs.unwrap_or_default();
        if let Some(effort) = self.reasoning_effort {
            template_kwargs.entry("reasoning_effort").or_insert(serde_json::Value::String(effort));
        }
        let stream = self.stream.unwrap_or(false);
        Ok(ChatRequest {
            model: self.model,
            messages,
            tools,
            tool_choice,
            sampling,
            stream,
            include_usage: stream && self.stream_options.is_some_and(|o| o.include_usage),
            template_kwargs,
            constraint_param,
            parallel_tool_calls: self.parallel_tool_calls.unwrap_or(true),
            unset,
            n,
            continue_final_message,
            add_generation_prompt: self.add_generation_prompt.unwrap_or(true),
            thinking_budget: self.thinking_budget,
        })
    }
}

fn has_text(m: &ChatMessage) -> bool {
    match &m.content {
        None => false,
        Some(MessageContent::Text(t)) => !t.trim().is_empty(),
        Some(MessageContent::Parts(parts)) => parts.iter().any(|p| match p {
            MessagePart::Text { text } => !text.trim().is_empty(),
            MessagePart::ImageUrl { .. } => true,
        }),
    }
}

fn convert_message(i: usize, m: WireMessage) -> Result<ChatMessage, ApiError> {
    let content = match m.content {
        None => None,
        Some(WireContent::Text(t)) => Some(MessageContent::Text(t)),
        Some(WireContent::Parts(parts)) => {
            let mut out = Vec::with_capacity(parts.len());
            for (j, p) in parts.into_iter().enumerate() {
                out.push(match p {
                    WirePart::Text { text } => MessagePart::Text { text },
                    WirePart::Refusal { refusal } => MessagePart::Text { text: refusal },
                    WirePart::ImageUrl { image_url } => MessagePart::ImageUrl { image_url },
                    WirePart::InputAudio { .. } | WirePart::File { .. } => {
                        return Err(ApiError::invalid(
                            &format!("messages[{i}].content[{j}].type"),
                            "audio and file parts are not supported by chat models here",
                        ))
                    }
                });
            }
            Some(MessageContent::from_parts(out))
        }
    };
    if m.role == Role::Tool && m.tool_call_id.is_none() {
        return Err(ApiError::invalid(&format!("messages[{i}].tool_call_id"), "is required for a `tool` message"));
    }
    Ok(ChatMessage {
        role: m.role,
        content,
        reasoning_content: m.reasoning_content,
        tool_calls: m.tool_calls.unwrap_or_default(),
        tool_call_id: m.tool_call_id,
        name: m.name,
    })
}

// ---- responses ----

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatCompletion {
    /// Read with defaults: what a reader needs is the choices (other servers leave some out).
    #[serde(default)]
    pub id: String,
    /// `chat.completion`
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub created: u64,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub system_fingerprint: Option<String>,
    pub choices: Vec<ChatChoice>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatChoice {
    #[serde(default)]
    pub index: u32,
    pub message: ResponseMessage,
    #[serde(default)]
    pub logprobs: Option<Logprobs>,
    pub finish_reason: FinishReason,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResponseMessage {
    pub role: Role,
    pub content: Option<String>,
    /// A reasoning model's thinking, split from `content` (vLLM's and llama-server's field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default)]
    pub refusal: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "crate::json::null_as_default")]
    pub tool_calls: Vec<WireToolCall>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    /// Read with defaults: what a reader needs is the choices (other servers leave some out).
    #[serde(default)]
    pub id: String,
    /// `chat.completion.chunk`
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub created: u64,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub system_fingerprint: Option<String>,
    pub choices: Vec<ChunkChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChunkChoice {
    #[serde(default)]
    pub index: u32,
    pub delta: Delta,
    #[serde(default)]
    pub logprobs: Option<Logprobs>,
    pub finish_reason: Option<FinishReason>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Delta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "crate::json::null_as_default")]
    pub tool_calls: Vec<ToolCallChunk>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolCallChunk {
    pub index: u32,
    pub id: String,
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: WireFunctionCall,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_body;

    fn req(json: &str) -> Result<ChatRequest, ApiError> {
        parse_body::<ChatCompletionRequest>(json.as_bytes())?.validate()
    }

    #[test]
    fn a_full_request_converts() {
        let r = req(r#"{"model":"m","messages":[
            {"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"hi"}]},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"42"}],
            "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
            "tool_choice":{"type":"function","function":{"name":"f"}},
            "max_completion_tokens":5,"stream":true,"stream_options":{"include_usage":true},
            "logprobs":true,"top_logprobs":2,"stop":"\n"}"#)
        .unwrap();
        assert_eq!(r.messages.len(), 4);
        assert_eq!(r.messages[1].content, Some(MessageContent::Text("hi".into())));
        assert_eq!(r.messages[2].tool_calls[0].function.arguments, r#"{"a":1}"#);
        assert_eq!(r.tool_choice, ToolChoice::Function("f".into()));
        assert_eq!((r.sampling.max_tokens, r.sampling.logprobs), (Some(5), Some(2)));
        assert!(r.stream && r.include_usage);
        assert_eq!(r.sampling.stop, vec!["\n".to_string()]);
        assert!(r.sampling.speculative, "speculative decoding is on unless a request turns it off");
        let off = req(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"speculative":false}"#).unwrap();
        assert!(!off.sampling.speculative);
        let e = req(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"speculative":"no"}"#).unwrap_err();
        assert!(e.message.contains("speculative"), "{}", e.message);
    }

    #[test]
    fn answers_from_other_servers_are_read_without_their_metadata() {
        let chunk: ChatCompletionChunk = serde_json::from_str(r#"{"choices":[{"delta":{"content":"Hé"}}]}"#).unwrap();
        assert_eq!(chunk.choices[0].delta.content.as_deref(), Some("Hé"));
        let whole: ChatCompletion = serde_json::from_str(
            r#"{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#,
        )
        .unwrap();
        assert_eq!(whole.choices[0].message.content.as_deref(), Some("hi"));
        let list: crate::ModelList = serde_json::from_str(r#"{"data":[{"id":"m"}]}"#).unwrap();
        assert_eq!(list.data[0].id, "m");
    }

    #[test]
    fn invalid_requests_name_the_field() {
        let cases = [
            (r#"{"model":"m","messages":[]}"#, "messages"),
            (r#"{"model":"m","messages":[{"role":"user","content":"  \n "}]}"#, "messages"),
            (r#"{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":3}"#, "temperature"),
            (r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0}"#, "max_tokens"),
            (r#"{"model":"m","messages":[{"role":"tool","content":"x"}]}"#, "messages[0].tool_call_id"),
            (r#"{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"required"}"#, "tool_choice"),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes","tools":[{"type":"function","function":{"name":"f"}}]}"#,
                "tool_choice",
            ),
            (r#"{"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":3}"#, "top_logprobs"),
            (r#"{"model":"m","messages":[{"role":"user","content":"x"}],"n":17}"#, "n"),
            (r#"{"model":"m","messages":[{"role":"user","content":"x"}],"n":0}"#, "n"),
            (r#"{"model":"","messages":[{"role":"user","content":"x"}]}"#, "model"),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"continue_final_message":true}"#,
                "continue_final_message",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}],
                    "continue_final_message":true,"add_generation_prompt":true}"#,
                "continue_final_message",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}}"#,
                "response_format.type",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},
                    "tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"}"#,
                "response_format",
            ),
        ];
        for (json, param) in cases {
            let e = req(json).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{json}: {}", e.message);
            assert!(e.message.starts_with(param), "{}", e.message);
        }
    }
}
