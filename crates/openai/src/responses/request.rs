//! `POST /v1/responses` as sent, validated into a [`ResponsesCall`]: the domain chat request the
//! node renders (the same one `/v1/chat/completions` makes), and what the response object echoes.
//!
//! Input items become chat messages in order: `instructions` is the system message (it is not
//! carried over by `previous_response_id`: the router only prepends earlier *items*); a
//! `message` item is a message; `function_call` items join the assistant turn before them (so an
//! answer's text and its parallel calls stay one turn); a `function_call_output` is a `tool`
//! message; `reasoning` items are the model's own and are dropped. Item, content and tool types
//! this server cannot take (files, hosted tools, item references) are a 400 naming them.

use crate::{
    checked_schema, ApiError, ChatMessage, ChatRequest, Constraint, FunctionTool, MessageContent, MessagePart, Role,
    SamplingWire, ToolChoice, WireFunctionCall, WireImageUrl, WireToolCall,
};
use serde::Deserialize;
use serde_json::{Map, Value};

#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    pub model: String,
    pub input: Value,
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub max_output_tokens: Option<i64>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    /// llama.cpp's extensions, as on the other endpoints.
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub min_p: Option<f64>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub text: Option<Value>,
    #[serde(default)]
    pub reasoning: Option<Value>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub store: Option<bool>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub truncation: Option<String>,
    #[serde(default)]
    pub background: Option<bool>,
    #[serde(default)]
    pub conversation: Option<Value>,
    #[serde(default)]
    pub prompt: Option<Value>,
    #[serde(default)]
    pub top_logprobs: Option<i64>,
}

/// A validated `/v1/responses` request.
#[derive(Debug, Clone)]
pub struct ResponsesCall {
    pub chat: ChatRequest,
    /// What the response object repeats of the request.
    pub echo: ResponseEcho,
    /// Whether the request asked for the response to be stored (default true).
    pub store: bool,
}

/// The request's settings as the response object reports them.
#[derive(Debug, Clone)]
pub struct ResponseEcho {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub metadata: Map<String, Value>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    /// As the request gave them (unset: the model's recommendation or the default applies).
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub text: Value,
    pub reasoning: Value,
    pub user: Option<String>,
}

/// OpenAI's bounds on `metadata`.
const MAX_METADATA_KEYS: usize = 16;
const MAX_METADATA_KEY: usize = 64;
const MAX_METADATA_VALUE: usize = 512;

impl ResponsesRequest {
    pub fn validate(self) -> Result<ResponsesCall, ApiError> {
        if self.model.trim().is_empty() {
            return Err(ApiError::invalid("model", "must not be empty"));
        }
        let unsupported = |field: &str, what: &str| ApiError::invalid(field, format!("{what} is not supported here"));
        if self.background == Some(true) {
            return Err(unsupported("background", "background mode"));
        }
        if self.conversation.as_ref().is_some_and(|c| !c.is_null()) {
            return Err(unsupported("conversation", "the Conversations API"));
        }
        if self.prompt.as_ref().is_some_and(|p| !p.is_null()) {
            return Err(unsupported("prompt", "a stored prompt template"));
        }
        if self.top_logprobs.is_some_and(|n| n > 0) {
            return Err(unsupported("top_logprobs", "logprobs on /v1/responses"));
        }
        match self.truncation.as_deref() {
            None | Some("disabled") => {}
            Some("auto") => {
                return Err(ApiError::invalid(
                    "truncation",
                    "`auto` is not supported: an input longer than the context is a 400 (`disabled`)",
                ))
            }
            Some(other) => {
                return Err(ApiError::invalid("truncation", format!("`{other}` is not one of `auto`, `disabled`")))
            }
        }
        let metadata = self.metadata.unwrap_or_default();
        check_metadata(&metadata)?;
        let wire = SamplingWire {
            max_tokens: self.max_output_tokens,
            max_tokens_field: "max_output_tokens",
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            seed: self.seed,
            ..Default::default()
        };
        let unset = wire.unset();
        let mut sampling = wire.validate()?;

        let mut messages = Vec::new();
        if let Some(instructions) = self.instructions.as_ref().filter(|i| !i.trim().is_empty()) {
            messages.push(ChatMessage::text(Role::System, instructions.clone()));
        }
        for (i, item) in input_items(&self.input)?.iter().enumerate() {
            add_item(i, item, &mut messages)?;
        }
        let has_input = messages.iter().any(|m| m.role != Role::System);
        if !has_input {
            return Err(ApiError::invalid("input", "must contain at least one item"));
        }

        let raw_tools = self.tools.unwrap_or_default();
        let tools = raw_tools.iter().enumerate().map(|(i, t)| function_tool(i, t)).collect::<Result<Vec<_>, _>>()?;
        let tool_choice = tool_choice(self.tool_choice.as_ref(), &tools)?;
        let parallel_tool_calls = self.parallel_tool_calls.unwrap_or(true);

        let text = self.text.unwrap_or_else(|| serde_json::json!({"format": {"type": "text"}}));
        let (constraint, constraint_param) = text_format(&text)?;
        sampling.constraint = constraint;
        if sampling.constraint.is_some() && tool_choice.forces_call() {
            return Err(ApiError::invalid(
                "text.format",
                "cannot be combined with a forced tool call (`tool_choice` `required` or a function)",
            ));
        }
        let mut template_kwargs = Map::new();
        let reasoning = self.reasoning.unwrap_or(Value::Null);
        if let Some(effort) = reasoning.get("effort").and_then(Value::as_str) {
            template_kwargs.insert("reasoning_effort".into(), Value::String(effort.into()));
        }
        let stream = self.stream.unwrap_or(false);
        let echo = ResponseEcho {
            instructions: self.instructions,
            max_output_tokens: sampling.max_tokens,
            metadata,
            parallel_tool_calls,
            previous_response_id: self.previous_response_id,
            temperature: self.temperature,
            top_p: self.top_p,
            tool_choice: self.tool_choice.unwrap_or_else(|| Value::String("auto".into())),
            tools: raw_tools.iter().zip(&tools).map(|(raw, t)| echoed_tool(raw, t)).collect(),
            text,
            reasoning,
            user: self.user,
        };
        let chat = ChatRequest {
            model: self.model,
            messages,
            tools,
            tool_choice,
            sampling,
            stream,
            include_usage: true,
            template_kwargs,
            constraint_param,
            parallel_tool_calls,
            unset,
            n: 1,
            continue_final_message: false,
            add_generation_prompt: true,
            thinking_budget: None,
        };
        Ok(ResponsesCall { chat, echo, store: self.store.unwrap_or(true) })
    }
}

/// The input as a list of items: a string is one user message.
pub fn input_items(input: &Value) -> Result<Vec<Value>, ApiError> {
    match input {
        Value::String(s) => Ok(vec![serde_json::json!({"type": "message", "role": "user", "content": s})]),
        Value::Array(items) => Ok(items.clone()),
        _ => Err(ApiError::invalid("input", "must be a string or a list of items")),
    }
}

fn check_metadata(metadata: &Map<String, Value>) -> Result<(), ApiError> {
    if metadata.len() > MAX_METADATA_KEYS {
        return Err(ApiError::invalid("metadata", format!("at most {MAX_METADATA_KEYS} keys are allowed")));
    }
    for (k, v) in metadata {
        let ok = k.len() <= MAX_METADATA_KEY && v.as_str().is_some_and(|s| s.len() <= MAX_METADATA_VALUE);
        if !ok {
            return Err(ApiError::invalid(
                &format!("metadata.{k}"),
                format!(
                    "keys are at most {MAX_METADATA_KEY} characters, values strings of at most {MAX_METADATA_VALUE}"
                ),
            ));
        }
    }
    Ok(())
}

fn str_field<'a>(v: &'a Value, key: &str, at: &str) -> Result<&'a str, ApiError> {
    match v.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(ApiError::invalid(&format!("{at}.{key}"), "must be a string")),
        None => Err(ApiError::invalid(&format!("{at}.{key}"), "is required")),
    }
}

fn add_item(i: usize, item: &Value, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let at = format!("input[{i}]");
    if !item.is_object() {
        return Err(ApiError::invalid(&at, "must be an item object"));
    }
    // A message may leave out its type (the "easy" input message).
    let kind = match item.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(_) => return Err(ApiError::invalid(&format!("{at}.type"), "must be a string")),
        None if item.get("role").is_some() => "message",
        None => return Err(ApiError::invalid(&format!("{at}.type"), "is required")),
    };
    match kind {
        "message" => {
            let role = match str_field(item, "role", &at)? {
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "system" => Role::System,
                "developer" => Role::Developer,
                other => {
                    return Err(ApiError::invalid(
                        &format!("{at}.role"),
                        format!("`{other}` is not one of `user`, `assistant`, `system`, `developer`"),
                    ))
                }
            };
            let content = message_content(item.get("content"), &at)?;
            out.push(ChatMessage {
                role,
                content: Some(content),
                reasoning_content: None,
                tool_calls: Vec::new(),
                tool_call_id: None,
                name: None,
            });
        }
        "function_call" => {
            let call = WireToolCall {
                id: str_field(item, "call_id", &at)?.to_owned(),
                kind: "function".into(),
                function: WireFunctionCall {
                    name: str_field(item, "name", &at)?.to_owned(),
                    arguments: str_field(item, "arguments", &at)?.to_owned(),
                },
            };
            match out.last_mut() {
                // The calls of one turn stay one assistant message (its text, then its calls).
                Some(last) if last.role == Role::Assistant => last.tool_calls.push(call),
                _ => out.push(ChatMessage {
                    role: Role::Assistant,
                    content: None,
                    reasoning_content: None,
                    tool_calls: vec![call],
                    tool_call_id: None,
                    name: None,
                }),
            }
        }
        "function_call_output" => {
            let call_id = str_field(item, "call_id", &at)?.to_owned();
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(v @ Value::Array(_)) => match message_content(Some(v), &format!("{at}.output"))? {
                    MessageContent::Text(t) => t,
                    MessageContent::Parts(_) => {
                        return Err(ApiError::invalid(&format!("{at}.output"), "images in a tool's output are not supported"))
                    }
                },
                Some(_) => return Err(ApiError::invalid(&format!("{at}.output"), "must be a string or a list of parts")),
                None => return Err(ApiError::invalid(&format!("{at}.output"), "is required")),
            };
            let mut m = ChatMessage::text(Role::Tool, output);
            m.tool_call_id = Some(call_id);
            out.push(m);
        }
        // The model's own reasoning from an earlier turn: nothing a template shows again.
        "reasoning" => {}
        other => {
            return Err(ApiError::invalid(
                &format!("{at}.type"),
                format!(
                    "`{other}` items are not supported here; use `message`, `function_call`, `function_call_output` or `reasoning`"
                ),
            ))
        }
    }
    Ok(())
}

/// A message's content: a string, or parts (`input_text`, `output_text`, `refusal`,
/// `input_image`); parts that are all text are one text.
fn message_content(content: Option<&Value>, at: &str) -> Result<MessageContent, ApiError> {
    let parts = match content {
        Some(Value::String(s)) => return Ok(MessageContent::Text(s.clone())),
        Some(Value::Array(parts)) => parts,
        Some(_) => return Err(ApiError::invalid(&format!("{at}.content"), "must be a string or a list of parts")),
        None => return Err(ApiError::invalid(&format!("{at}.content"), "is required")),
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let kind = match p.get("type") {
            Some(Value::String(t)) => t.as_str(),
            _ => return Err(ApiError::invalid(&format!("{at}.type"), "is required")),
        };
        out.push(match kind {
            "input_text" | "output_text" | "text" => MessagePart::Text { text: str_field(p, "text", &at)?.to_owned() },
            "refusal" => MessagePart::Text { text: str_field(p, "refusal", &at)?.to_owned() },
            "input_image" => match p.get("image_url") {
                Some(Value::String(url)) => MessagePart::ImageUrl { image_url: WireImageUrl { url: url.clone() } },
                _ => {
                    return Err(ApiError::invalid(
                        &format!("{at}.image_url"),
                        "is required (images by `file_id` are not supported here)",
                    ))
                }
            },
            other => {
                return Err(ApiError::invalid(
                    &format!("{at}.type"),
                    format!("`{other}` parts are not supported here; use `input_text` or `input_image`"),
                ))
            }
        });
    }
    Ok(MessageContent::from_parts(out))
}

fn function_tool(i: usize, t: &Value) -> Result<FunctionTool, ApiError> {
    let at = format!("tools[{i}]");
    match t.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => {
            return Err(ApiError::invalid(
                &format!("{at}.type"),
                format!("`{other}` (a hosted tool) is not supported; use `function` tools"),
            ))
        }
        None => return Err(ApiError::invalid(&format!("{at}.type"), "is required")),
    }
    let name = str_field(t, "name", &at)?;
    if name.trim().is_empty() {
        return Err(ApiError::invalid(&format!("{at}.name"), "must not be empty"));
    }
    let parameters = t.get("parameters").filter(|p| !p.is_null()).cloned();
    if parameters.as_ref().is_some_and(|p| !p.is_object()) {
        return Err(ApiError::invalid(&format!("{at}.parameters"), "must be a JSON Schema object"));
    }
    let strict = match t.get("strict") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid(&format!("{at}.strict"), "must be a boolean")),
    };
    Ok(FunctionTool {
        name: name.to_owned(),
        description: t.get("description").and_then(Value::as_str).map(str::to_owned),
        parameters,
        strict,
    })
}

/// A function tool as the response object lists it (every field present).
fn echoed_tool(raw: &Value, t: &FunctionTool) -> Value {
    serde_json::json!({
        "type": "function",
        "name": t.name,
        "description": t.description,
        "parameters": t.parameters,
        "strict": raw.get("strict").and_then(Value::as_bool),
    })
}

fn tool_choice(choice: Option<&Value>, tools: &[FunctionTool]) -> Result<ToolChoice, ApiError> {
    let mode = match choice {
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Value::String(m)) => match m.as_str() {
            "none" => ToolChoice::None,
            "auto" if tools.is_empty() => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`{other}` is not one of `none`, `auto`, `required` or a function"),
                ))
            }
        },
        Some(v @ Value::Object(_)) => match v.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = str_field(v, "name", "tool_choice")?;
                if !tools.iter().any(|t| t.name == name) {
                    return Err(ApiError::invalid(
                        "tool_choice.name",
                        format!("`{name}` is not one of the request's tools"),
                    ));
                }
                ToolChoice::Function(name.to_owned())
            }
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice.type",
                    "only `function` choices are supported (hosted tools are not)",
                ))
            }
        },
        Some(_) => return Err(ApiError::invalid("tool_choice", "must be a string or an object")),
    };
    if tools.is_empty() && mode.forces_call() {
        return Err(ApiError::invalid("tool_choice", "requires `tools`"));
    }
    Ok(mode)
}

/// `text.format`: free text, any JSON object, or a JSON schema (`name`, `schema`, `strict`).
fn text_format(text: &Value) -> Result<(Option<Constraint>, &'static str), ApiError> {
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok((None, "text.format"));
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok((None, "text.format")),
        Some("json_object") => {
            Ok((Some(checked_schema(&serde_json::json!({"type": "object"}), "text.format")?), "text.format"))
        }
        Some("json_schema") => match format.get("schema") {
            Some(schema) => Ok((Some(checked_schema(schema, "text.format.schema")?), "text.format.schema")),
            None => Err(ApiError::invalid("text.format.schema", "is required when `type` is `json_schema`")),
        },
        Some(other) => Err(ApiError::invalid(
            "text.format.type",
            format!("`{other}` is not one of `text`, `json_object`, `json_schema`"),
        )),
        None => Err(ApiError::invalid("text.format.type", "is required")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_body;

    fn call(json: &str) -> Result<ResponsesCall, ApiError> {
        parse_body::<ResponsesRequest>(json.as_bytes())?.validate()
    }

    #[test]
    fn items_become_one_conversation() {
        let c = call(
            r#"{"model":"m","instructions":"be brief","max_output_tokens":50,"input":[
            {"role":"user","content":"weather in Paris?"},
            {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Checking.","annotations":[]}]},
            {"type":"function_call","call_id":"c1","name":"weather","arguments":"{\"city\":\"Paris\"}"},
            {"type":"function_call","call_id":"c2","name":"weather","arguments":"{\"city\":\"Lyon\"}"},
            {"type":"reasoning","id":"rs_1","summary":[]},
            {"type":"function_call_output","call_id":"c1","output":"21C"},
            {"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"19C"}]}],
            "tools":[{"type":"function","name":"weather","parameters":{"type":"object"},"strict":true}],
            "metadata":{"k":"v"},"store":false}"#,
        )
        .unwrap();
        let roles: Vec<Role> = c.chat.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::System, Role::User, Role::Assistant, Role::Tool, Role::Tool]);
        let turn = &c.chat.messages[2];
        assert_eq!(turn.content, Some(MessageContent::Text("Checking.".into())));
        assert_eq!(turn.tool_calls.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["c1", "c2"]);
        assert_eq!(c.chat.messages[4].content, Some(MessageContent::Text("19C".into())));
        assert_eq!(c.chat.tool_choice, ToolChoice::Auto);
        assert_eq!((c.chat.sampling.max_tokens, c.store), (Some(50), false));
        assert_eq!(c.echo.instructions.as_deref(), Some("be brief"));
        assert_eq!(c.echo.tool_choice, "auto");
    }

    #[test]
    fn a_string_input_is_a_user_message_and_formats_constrain() {
        let c = call(
            r#"{"model":"m","input":"hi","text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"}}}}"#,
        )
        .unwrap();
        assert_eq!(c.chat.messages.len(), 1);
        assert_eq!(c.chat.messages[0].role, Role::User);
        assert!(matches!(c.chat.sampling.constraint, Some(Constraint::JsonSchema(_))));
        assert_eq!(c.chat.constraint_param, "text.format.schema");
        assert!(c.store);
    }

    #[test]
    fn invalid_requests_name_the_field() {
        let cases = [
            (r#"{"model":"m","input":[]}"#, "input"),
            (r#"{"model":"m","input":3}"#, "input"),
            (r#"{"model":"m","input":[{"type":"item_reference","id":"x"}]}"#, "input[0].type"),
            (
                r#"{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}"#,
                "input[0].content[0].type",
            ),
            (r#"{"model":"m","input":[{"role":"robot","content":"x"}]}"#, "input[0].role"),
            (r#"{"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}"}]}"#, "input[0].call_id"),
            (r#"{"model":"m","input":"x","tools":[{"type":"web_search"}]}"#, "tools[0].type"),
            (r#"{"model":"m","input":"x","tool_choice":"required"}"#, "tool_choice"),
            (
                r#"{"model":"m","input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"g"}}"#,
                "tool_choice.name",
            ),
            (r#"{"model":"m","input":"x","text":{"format":{"type":"yaml"}}}"#, "text.format.type"),
            (r#"{"model":"m","input":"x","max_output_tokens":0}"#, "max_output_tokens"),
            (r#"{"model":"m","input":"x","temperature":9}"#, "temperature"),
            (r#"{"model":"m","input":"x","background":true}"#, "background"),
            (r#"{"model":"m","input":"x","truncation":"auto"}"#, "truncation"),
            (r#"{"model":"m","input":"x","metadata":{"k":3}}"#, "metadata.k"),
        ];
        for (json, param) in cases {
            let e = call(json).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{json}: {}", e.message);
        }
    }
}
