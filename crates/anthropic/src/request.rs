//! `POST /v1/messages` and `/v1/messages/count_tokens` as sent, validated into the domain
//! [`ChatRequest`].
//!
//! Anthropic's shape differs from OpenAI's in ways the conversion settles once:
//! - `system` is a field, not a message; it becomes the first (system) message.
//! - A user turn carries `tool_result` blocks: each becomes a `tool` message (in order, before the
//!   rest of the turn), as chat templates expect tool answers.
//! - An assistant turn's `tool_use` blocks are its tool calls (`input` is a JSON object; OpenAI
//!   sends the same as a JSON text); `thinking` blocks are its reasoning; `redacted_thinking` is
//!   opaque and dropped.
//! - A conversation that ends with an assistant turn is continued, not answered: the answer
//!   starts where that text ends (Anthropic's "prefill").
//! - `max_tokens` is required; `tool_choice` `any` is OpenAI's `required`;
//!   `output_config.format` is a JSON schema the answer follows.
//!
//! Block types this server cannot take (documents, server tools' results, ...) are a 400 naming
//! the block, never silently dropped.

use llmr_openai::{
    checked_schema, ApiError, ChatMessage, ChatRequest, FunctionTool, MessageContent, MessagePart, Role, SamplingWire,
    StopWire, ToolChoice, WireFunctionCall, WireImageUrl, WireToolCall,
};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    pub model: String,
    pub messages: Vec<WireMessage>,
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub system: Option<SystemPrompt>,
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub tools: Option<Vec<WireTool>>,
    #[serde(default)]
    pub tool_choice: Option<WireToolChoice>,
    #[serde(default)]
    pub thinking: Option<Thinking>,
    #[serde(default)]
    pub output_config: Option<OutputConfig>,
}

/// `/v1/messages/count_tokens`: the same prompt, nothing to generate.
#[derive(Debug, Deserialize)]
pub struct CountTokensRequest {
    pub model: String,
    pub messages: Vec<WireMessage>,
    #[serde(default)]
    pub system: Option<SystemPrompt>,
    #[serde(default)]
    pub tools: Option<Vec<WireTool>>,
    #[serde(default)]
    pub tool_choice: Option<WireToolChoice>,
    #[serde(default)]
    pub thinking: Option<Thinking>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "expected a string or a list of text blocks")]
pub enum SystemPrompt {
    Text(String),
    Blocks(Vec<Value>),
}

#[derive(Debug, Deserialize)]
pub struct WireMessage {
    pub role: WireRole,
    pub content: WireContent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireRole {
    User,
    Assistant,
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "expected a string or a list of content blocks")]
pub enum WireContent {
    Text(String),
    /// Blocks stay JSON until converted, so an unknown `type` is reported with its path.
    Blocks(Vec<Value>),
}

#[derive(Debug, Deserialize)]
pub struct WireTool {
    /// Absent or `custom` for a client tool; anything else is one of Anthropic's server tools.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub input_schema: Option<Value>,
    /// The input must follow `input_schema` (Anthropic's strict tool use).
    #[serde(default)]
    pub strict: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct WireToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub disable_parallel_tool_use: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct Thinking {
    #[serde(rename = "type")]
    pub kind: String,
    /// Tokens the model may think (with `enabled`); then its thinking is closed for it.
    #[serde(default)]
    pub budget_tokens: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub struct OutputConfig {
    #[serde(default)]
    pub format: Option<Value>,
    #[serde(default)]
    pub effort: Option<String>,
}

impl MessagesRequest {
    pub fn validate(self) -> Result<ChatRequest, ApiError> {
        let max_tokens = match self.max_tokens {
            Some(n) => n,
            None => return Err(ApiError::invalid("max_tokens", "is required")),
        };
        let wire = SamplingWire {
            max_tokens: Some(max_tokens),
            max_tokens_field: "max_tokens",
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stop: self.stop_sequences.map(StopWire::Many),
            ..Default::default()
        };
        let unset = wire.unset();
        let mut sampling = match wire.validate() {
            Err(e) if e.param.as_deref() == Some("stop") => {
                return Err(ApiError::invalid("stop_sequences", e.message.trim_start_matches("stop: ")))
            }
            other => other?,
        };
        let mut conversation = Conversation::validate(
            self.model,
            self.messages,
            self.system,
            self.tools,
            self.tool_choice,
            self.thinking,
        )?;
        let mut constraint_param = "output_config.format";
        if let Some(config) = self.output_config {
            if let Some(effort) = config.effort {
                conversation.template_kwargs.insert("reasoning_effort".into(), Value::String(effort));
            }
            if let Some(format) = config.format.filter(|f| !f.is_null()) {
                sampling.constraint = Some(output_format(&format)?);
                constraint_param = "output_config.format.schema";
            }
        }
        if sampling.constraint.is_some() && conversation.tool_choice.forces_call() {
            return Err(ApiError::invalid(
                "output_config.format",
                "cannot be combined with a forced tool call (`tool_choice` `any` or `tool`)",
            ));
        }
        let stream = self.stream.unwrap_or(false);
        Ok(conversation.into_request(sampling, unset, stream, constraint_param))
    }
}

impl CountTokensRequest {
    /// The request as a chat request that generates nothing: only its prompt is counted.
    pub fn validate(self) -> Result<ChatRequest, ApiError> {
        let conversation = Conversation::validate(
            self.model,
            self.messages,
            self.system,
            self.tools,
            self.tool_choice,
            self.thinking,
        )?;
        Ok(conversation.into_request(Default::default(), Default::default(), false, "output_config.format"))
    }
}

fn output_format(format: &Value) -> Result<llmr_openai::Constraint, ApiError> {
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => match format.get("schema") {
            Some(schema) => checked_schema(schema, "output_config.format.schema"),
            None => Err(ApiError::invalid("output_config.format.schema", "is required")),
        },
        Some(other) => Err(ApiError::invalid(
            "output_config.format.type",
            format!("`{other}` is not supported; use `json_schema`"),
        )),
        None => Err(ApiError::invalid("output_config.format.type", "is required")),
    }
}

/// What `/v1/messages` and `count_tokens` share: the prompt's parts.
struct Conversation {
    model: String,
    messages: Vec<ChatMessage>,
    tools: Vec<FunctionTool>,
    tool_choice: ToolChoice,
    parallel_tool_calls: bool,
    template_kwargs: serde_json::Map<String, Value>,
    continue_final_message: bool,
    thinking_budget: Option<u32>,
}

impl Conversation {
    /// The domain request: one choice, the conversation's prompt, `sampling` for its answer.
    fn into_request(
        self,
        sampling: llmr_openai::Sampling,
        unset: llmr_openai::UnsetSampling,
        stream: bool,
        constraint_param: &'static str,
    ) -> ChatRequest {
        ChatRequest {
            model: self.model,
            messages: self.messages,
            tools: self.tools,
            tool_choice: self.tool_choice,
            sampling,
            stream,
            include_usage: true,
            template_kwargs: self.template_kwargs,
            constraint_param,
            parallel_tool_calls: self.parallel_tool_calls,
            unset,
            n: 1,
            continue_final_message: self.continue_final_message,
            add_generation_prompt: true,
            thinking_budget: self.thinking_budget,
        }
    }

    fn validate(
        model: String,
        wire: Vec<WireMessage>,
        system: Option<SystemPrompt>,
        tools: Option<Vec<WireTool>>,
        tool_choice: Option<WireToolChoice>,
        thinking: Option<Thinking>,
    ) -> Result<Conversation, ApiError> {
        if model.trim().is_empty() {
            return Err(ApiError::invalid("model", "must not be empty"));
        }
        if wire.is_empty() {
            return Err(ApiError::invalid("messages", "must contain at least one message"));
        }
        let mut messages = Vec::with_capacity(wire.len() + 1);
        if let Some(system) = system {
            let text = system_text(system)?;
            if !text.trim().is_empty() {
                messages.push(ChatMessage::text(Role::System, text));
            }
        }
        let last = wire.len() - 1;
        let ends_with_assistant = wire[last].role == WireRole::Assistant;
        for (i, m) in wire.into_iter().enumerate() {
            convert_message(i, m, &mut messages)?;
        }
        let any_text = messages.iter().any(|m| {
            !m.tool_calls.is_empty()
                || match &m.content {
                    Some(MessageContent::Text(t)) => !t.trim().is_empty(),
                    Some(MessageContent::Parts(_)) => true,
                    None => false,
                }
        });
        if !any_text {
            return Err(ApiError::invalid("messages", "every message is empty; the prompt would be empty"));
        }
        // A final assistant turn of plain text is continued; one that made tool calls is history.
        let continue_final_message = ends_with_assistant
            && messages.last().is_some_and(|m| m.role == Role::Assistant && m.tool_calls.is_empty());
        let tools = convert_tools(tools.unwrap_or_default())?;
        let (tool_choice, parallel_tool_calls) = convert_tool_choice(tool_choice, &tools)?;
        let mut template_kwargs = serde_json::Map::new();
        let thinking_budget = thinking.as_ref().filter(|t| t.kind == "enabled").and_then(|t| t.budget_tokens);
        if let Some(thinking) = thinking {
            let enable = match thinking.kind.as_str() {
                "enabled" | "adaptive" => true,
                "disabled" => false,
                other => {
                    return Err(ApiError::invalid(
                        "thinking.type",
                        format!("`{other}` is not one of `enabled`, `adaptive`, `disabled`"),
                    ))
                }
            };
            // The variable the templates of thinking models read (Qwen3's, among others).
            template_kwargs.insert("enable_thinking".into(), Value::Bool(enable));
        }
        Ok(Conversation {
            model,
            messages,
            tools,
            tool_choice,
            parallel_tool_calls,
            template_kwargs,
            continue_final_message,
            thinking_budget,
        })
    }
}

fn system_text(system: SystemPrompt) -> Result<String, ApiError> {
    match system {
        SystemPrompt::Text(t) => Ok(t),
        SystemPrompt::Blocks(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                match block_type(b, &format!("system[{j}]"))? {
                    "text" => texts.push(string_field(b, "text", &format!("system[{j}].text"))?),
                    other => {
                        return Err(ApiError::invalid(
                            &format!("system[{j}].type"),
                            format!("`{other}` is not supported in `system`; use `text`"),
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
    }
}

fn block_type<'a>(block: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    if !block.is_object() {
        return Err(ApiError::invalid(at, "must be a content block object"));
    }
    match block.get("type") {
        Some(Value::String(t)) => Ok(t),
        Some(_) => Err(ApiError::invalid(&format!("{at}.type"), "must be a string")),
        None => Err(ApiError::invalid(&format!("{at}.type"), "is required")),
    }
}

fn string_field(block: &Value, key: &str, at: &str) -> Result<String, ApiError> {
    match block.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(ApiError::invalid(at, "must be a string")),
        None => Err(ApiError::invalid(at, "is required")),
    }
}

/// One wire message into one or more chat messages (tool results become `tool` messages).
fn convert_message(i: usize, m: WireMessage, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let role = match m.role {
        WireRole::User => Role::User,
        WireRole::Assistant => Role::Assistant,
    };
    let blocks = match m.content {
        WireContent::Text(text) => {
            out.push(ChatMessage::text(role, text));
            return Ok(());
        }
        WireContent::Blocks(blocks) => blocks,
    };
    let mut parts: Vec<MessagePart> = Vec::new();
    let mut calls: Vec<WireToolCall> = Vec::new();
    let mut reasoning: Vec<String> = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        let kind = block_type(b, &at)?;
        match (kind, m.role) {
            ("text", _) => parts.push(MessagePart::Text { text: string_field(b, "text", &format!("{at}.text"))? }),
            ("image", WireRole::User) => parts.push(MessagePart::ImageUrl { image_url: image(b, &at)? }),
            ("tool_result", WireRole::User) => out.push(tool_result(b, &at)?),
            ("tool_use", WireRole::Assistant) => calls.push(tool_use(b, &at)?),
            ("thinking", WireRole::Assistant) => reasoning.push(string_field(b, "thinking", &format!("{at}.thinking"))?),
            // Opaque (encrypted by Anthropic): nothing a template could show.
            ("redacted_thinking", WireRole::Assistant) => {}
            ("image" | "tool_result", WireRole::Assistant) | ("tool_use" | "thinking" | "redacted_thinking", WireRole::User) => {
                return Err(ApiError::invalid(
                    &format!("{at}.type"),
                    format!("`{kind}` blocks belong in {} turns", if m.role == WireRole::User { "assistant" } else { "user" }),
                ))
            }
            (other, _) => {
                return Err(ApiError::invalid(
                    &format!("{at}.type"),
                    format!(
                        "`{other}` blocks are not supported here; use `text`, `image`, `tool_use`, `tool_result` or `thinking`"
                    ),
                ))
            }
        }
    }
    if parts.is_empty() && calls.is_empty() && reasoning.is_empty() {
        // A user turn of tool results only: the `tool` messages are the turn.
        if blocks.is_empty() {
            out.push(ChatMessage::text(role, String::new()));
        }
        return Ok(());
    }
    let content = (!parts.is_empty()).then(|| MessageContent::from_parts(parts));
    out.push(ChatMessage {
        role,
        content,
        reasoning_content: (!reasoning.is_empty()).then(|| reasoning.join("\n")),
        tool_calls: calls,
        tool_call_id: None,
        name: None,
    });
    Ok(())
}

fn image(b: &Value, at: &str) -> Result<WireImageUrl, ApiError> {
    let source = b.get("source").ok_or_else(|| ApiError::invalid(&format!("{at}.source"), "is required"))?;
    let at = format!("{at}.source");
    match block_type(source, &at)? {
        "base64" => {
            let media = string_field(source, "media_type", &format!("{at}.media_type"))?;
            let data = string_field(source, "data", &format!("{at}.data"))?;
            Ok(WireImageUrl { url: format!("data:{media};base64,{data}") })
        }
        "url" => Ok(WireImageUrl { url: string_field(source, "url", &format!("{at}.url"))? }),
        other => Err(ApiError::invalid(&format!("{at}.type"), format!("`{other}` is not one of `base64`, `url`"))),
    }
}

fn tool_use(b: &Value, at: &str) -> Result<WireToolCall, ApiError> {
    let id = string_field(b, "id", &format!("{at}.id"))?;
    let name = string_field(b, "name", &format!("{at}.name"))?;
    let input = match b.get("input") {
        Some(v @ Value::Object(_)) => v.to_string(),
        Some(_) => return Err(ApiError::invalid(&format!("{at}.input"), "must be an object")),
        None => "{}".into(),
    };
    Ok(WireToolCall { id, kind: "function".into(), function: WireFunctionCall { name, arguments: input } })
}

fn tool_result(b: &Value, at: &str) -> Result<ChatMessage, ApiError> {
    let id = string_field(b, "tool_use_id", &format!("{at}.tool_use_id"))?;
    let text = match b.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (k, inner) in blocks.iter().enumerate() {
                let at = format!("{at}.content[{k}]");
                match block_type(inner, &at)? {
                    "text" => texts.push(string_field(inner, "text", &format!("{at}.text"))?),
                    other => {
                        return Err(ApiError::invalid(
                            &format!("{at}.type"),
                            format!("`{other}` is not supported in a tool result; use `text`"),
                        ))
                    }
                }
            }
            texts.join("\n")
        }
        Some(_) => return Err(ApiError::invalid(&format!("{at}.content"), "must be a string or a list of blocks")),
    };
    // The model sees a failed tool call as such (the templates have no error field).
    let text = if b.get("is_error").and_then(Value::as_bool) == Some(true) { format!("Error: {text}") } else { text };
    let mut m = ChatMessage::text(Role::Tool, text);
    m.tool_call_id = Some(id);
    Ok(m)
}

fn convert_tools(tools: Vec<WireTool>) -> Result<Vec<FunctionTool>, ApiError> {
    tools
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
                return Err(ApiError::invalid(
                    &format!("tools[{i}].type"),
                    format!(
                        "`{kind}` (a server tool) is not supported; define the tool with `name` and `input_schema`"
                    ),
                ));
            }
            let name = t.name.filter(|n| !n.trim().is_empty());
            let Some(name) = name else {
                return Err(ApiError::invalid(&format!("tools[{i}].name"), "is required"));
            };
            let Some(schema) = t.input_schema else {
                return Err(ApiError::invalid(&format!("tools[{i}].input_schema"), "is required"));
            };
            if !schema.is_object() {
                return Err(ApiError::invalid(&format!("tools[{i}].input_schema"), "must be a JSON Schema object"));
            }
            Ok(FunctionTool {
                name,
                description: t.description,
                parameters: Some(schema),
                strict: t.strict.unwrap_or(false),
            })
        })
        .collect()
}

fn convert_tool_choice(choice: Option<WireToolChoice>, tools: &[FunctionTool]) -> Result<(ToolChoice, bool), ApiError> {
    let Some(choice) = choice else {
        return Ok((if tools.is_empty() { ToolChoice::None } else { ToolChoice::Auto }, true));
    };
    let parallel = !choice.disable_parallel_tool_use.unwrap_or(false);
    let mode = match choice.kind.as_str() {
        "auto" => ToolChoice::Auto,
        "none" => ToolChoice::None,
        "any" => ToolChoice::Required,
        "tool" => match choice.name {
            Some(name) if tools.iter().any(|t| t.name == name) => ToolChoice::Function(name),
            Some(name) => {
                return Err(ApiError::invalid(
                    "tool_choice.name",
                    format!("`{name}` is not one of the request's tools"),
                ))
            }
            None => return Err(ApiError::invalid("tool_choice.name", "is required when `type` is `tool`")),
        },
        other => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                format!("`{other}` is not one of `auto`, `any`, `tool`, `none`"),
            ))
        }
    };
    if tools.is_empty() && mode.forces_call() {
        return Err(ApiError::invalid("tool_choice", "requires `tools`"));
    }
    Ok((mode, parallel))
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmr_openai::parse_body;

    fn req(json: &str) -> Result<ChatRequest, ApiError> {
        parse_body::<MessagesRequest>(json.as_bytes())?.validate()
    }

    #[test]
    fn a_conversation_with_tools_converts() {
        let r = req(r#"{"model":"m","max_tokens":64,"system":[{"type":"text","text":"be brief"}],
            "messages":[
              {"role":"user","content":"weather in Paris?"},
              {"role":"assistant","content":[{"type":"thinking","thinking":"look it up","signature":"s"},
                {"type":"text","text":"Checking."},
                {"type":"tool_use","id":"toolu_1","name":"weather","input":{"city":"Paris"}}]},
              {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"21C"}]},
                {"type":"text","text":"and tomorrow?"}]}],
            "tools":[{"name":"weather","description":"d","input_schema":{"type":"object"}}],
            "tool_choice":{"type":"any","disable_parallel_tool_use":true},
            "stop_sequences":["\n\n"],"temperature":0.5,"stream":true}"#)
        .unwrap();
        let roles: Vec<Role> = r.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::System, Role::User, Role::Assistant, Role::Tool, Role::User]);
        assert_eq!(r.messages[2].reasoning_content.as_deref(), Some("look it up"));
        assert_eq!(r.messages[2].content, Some(MessageContent::Text("Checking.".into())));
        assert_eq!(r.messages[2].tool_calls[0].function.arguments, r#"{"city":"Paris"}"#);
        assert_eq!(r.messages[3].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(r.messages[3].content, Some(MessageContent::Text("21C".into())));
        assert_eq!(r.tool_choice, ToolChoice::Required);
        assert!(!r.parallel_tool_calls && r.stream && !r.continue_final_message);
        assert_eq!((r.sampling.max_tokens, r.sampling.temperature), (Some(64), 0.5));
        assert_eq!(r.sampling.stop, vec!["\n\n".to_string()]);
        assert!(r.unset.top_p && !r.unset.temperature);
    }

    #[test]
    fn a_final_assistant_turn_is_continued() {
        let r = req(r#"{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"Pick A or B"},
            {"role":"assistant","content":"The answer is ("}]}"#)
        .unwrap();
        assert!(r.continue_final_message);
        let r = req(r#"{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}],
            "output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}}}"#)
        .unwrap();
        assert!(!r.continue_final_message);
        assert_eq!(r.constraint_param, "output_config.format.schema");
        assert!(matches!(r.sampling.constraint, Some(llmr_openai::Constraint::JsonSchema(_))));
    }

    #[test]
    fn invalid_requests_name_the_field() {
        let cases = [
            (r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#, "max_tokens"),
            (r#"{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}"#, "max_tokens"),
            (r#"{"model":"m","max_tokens":5,"messages":[]}"#, "messages"),
            (
                r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}"#,
                "messages[0].content[0].type",
            ),
            (
                r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"text":"no type"}]}]}"#,
                "messages[0].content[0].type",
            ),
            (
                r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]}"#,
                "messages[0].content[0].type",
            ),
            (
                r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file"}}]}]}"#,
                "messages[0].content[0].source.type",
            ),
            (r#"{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"x"}]}"#, "messages[0].role"),
            (r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":null}]}"#, "messages[0].content"),
            (
                r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"web_search_20250305","name":"web_search"}]}"#,
                "tools[0].type",
            ),
            (
                r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f"}]}"#,
                "tools[0].input_schema",
            ),
            (
                r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"tool","name":"g"}}"#,
                "tool_choice.name",
            ),
            (
                r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"any"}}"#,
                "tool_choice",
            ),
            (
                r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"stop_sequences":[""]}"#,
                "stop_sequences",
            ),
            (
                r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"output_config":{"format":{"type":"yaml"}}}"#,
                "output_config.format.type",
            ),
            (
                r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"deep"}}"#,
                "thinking.type",
            ),
        ];
        for (json, param) in cases {
            let e = req(json).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{json}: {}", e.message);
        }
    }

    #[test]
    fn count_tokens_needs_no_max_tokens() {
        let r = parse_body::<CountTokensRequest>(br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#)
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(r.messages.len(), 1);
    }
}
