//! The conversation as chat templates see it: the shape of Hugging Face's message dicts.
//!
//! These are the crate's input types, not wire types: the OpenAI layer converts into them with
//! the constructors below. They serialize into exactly the dicts that `transformers` hands its
//! templates, so optional fields are left out rather than set to `null` (templates test
//! `message.tool_calls is defined`).

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

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

/// A message body: plain text, or a list of parts (multimodal requests).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a multimodal message, as the templates test it (`part.type == 'text'`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text {
        text: String,
    },
    /// A placeholder where the template should put an image token; the pixels travel elsewhere.
    Image {},
    ImageUrl {
        image_url: ImageUrl,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageUrl {
    pub url: String,
}

/// A function call made by the assistant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Always `"function"`; kept so templates that read `tool_call.type` see it.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// Usually a JSON object: templates receive a dict (transformers' convention), and many of
    /// them `tojson` it. A string is kept only when it was not valid JSON.
    pub arguments: serde_json::Value,
}

/// A tool the model may call, in the OpenAI `tools` shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of the arguments, key order preserved (templates print it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<serde_json::Value>,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Message {
    pub role: Role,
    #[serde(default)]
    pub content: Option<Content>,
    /// The model's reasoning ("thinking") for an assistant turn.
    #[serde(default, alias = "reasoning", alias = "thinking")]
    pub reasoning_content: Option<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

/// OpenAI clients send `"tool_calls": null` as often as they leave it out.
fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<ToolCall>, D::Error> {
    Ok(Option::<Vec<ToolCall>>::deserialize(d)?.unwrap_or_default())
}

fn function_kind() -> String {
    "function".to_owned()
}

impl Message {
    fn with_text(role: Role, text: impl Into<String>) -> Self {
        Message {
            role,
            content: Some(Content::Text(text.into())),
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }

    pub fn system(text: impl Into<String>) -> Self {
        Self::with_text(Role::System, text)
    }

    pub fn user(text: impl Into<String>) -> Self {
        Self::with_text(Role::User, text)
    }

    pub fn assistant(text: impl Into<String>) -> Self {
        Self::with_text(Role::Assistant, text)
    }

    /// A message whose content is a list of parts.
    pub fn with_parts(role: Role, parts: Vec<ContentPart>) -> Self {
        Message { content: Some(Content::Parts(parts)), ..Self::with_text(role, "") }
    }

    /// An assistant turn that calls tools; `content` is often empty in that case.
    pub fn assistant_tool_calls(content: Option<String>, tool_calls: Vec<ToolCall>) -> Self {
        Message { content: content.map(Content::Text), tool_calls, ..Self::with_text(Role::Assistant, "") }
    }

    /// The result of a tool call, answering the call with id `tool_call_id`.
    pub fn tool_result(tool_call_id: impl Into<String>, name: Option<String>, content: impl Into<String>) -> Self {
        Message { tool_call_id: Some(tool_call_id.into()), name, ..Self::with_text(Role::Tool, content) }
    }

    pub fn with_reasoning(mut self, reasoning: impl Into<String>) -> Self {
        self.reasoning_content = Some(reasoning.into());
        self
    }
}

impl ToolCall {
    /// A call whose arguments arrive as an OpenAI JSON string; they are parsed into an object
    /// because that is what templates expect (a string that is not JSON is passed through).
    pub fn from_json_arguments(id: Option<String>, name: impl Into<String>, arguments: &str) -> Self {
        let arguments = serde_json::from_str(arguments).unwrap_or_else(|_| serde_json::Value::from(arguments));
        ToolCall { id, kind: function_kind(), function: FunctionCall { name: name.into(), arguments } }
    }
}

impl Tool {
    pub fn function(
        name: impl Into<String>,
        description: Option<String>,
        parameters: Option<serde_json::Value>,
    ) -> Self {
        Tool { kind: function_kind(), function: FunctionDef { name: name.into(), description, parameters } }
    }
}

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        // transformers also exposes the reasoning as `thinking` (first key) for templates, such as
        // gpt-oss, that read that name.
        if let Some(reasoning) = &self.reasoning_content {
            map.serialize_entry("thinking", reasoning)?;
        }
        map.serialize_entry("role", &self.role)?;
        if let Some(content) = &self.content {
            map.serialize_entry("content", content)?;
        }
        if let Some(reasoning) = &self.reasoning_content {
            map.serialize_entry("reasoning_content", reasoning)?;
        }
        if !self.tool_calls.is_empty() {
            map.serialize_entry("tool_calls", &self.tool_calls)?;
        }
        if let Some(id) = &self.tool_call_id {
            map.serialize_entry("tool_call_id", id)?;
        }
        if let Some(name) = &self.name {
            map.serialize_entry("name", name)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn absent_fields_are_left_out() {
        let v = serde_json::to_value(Message::user("hi")).unwrap();
        assert_eq!(v, json!({"role": "user", "content": "hi"}));
    }

    #[test]
    fn reasoning_is_aliased_as_thinking_first() {
        let m = Message::assistant("4").with_reasoning("2+2");
        let s = serde_json::to_string(&m).unwrap();
        assert_eq!(s, r#"{"thinking":"2+2","role":"assistant","content":"4","reasoning_content":"2+2"}"#);
    }

    #[test]
    fn tool_call_arguments_are_parsed_in_order() {
        let call = ToolCall::from_json_arguments(Some("c1".into()), "f", r#"{"b": 1, "a": 2}"#);
        let s = serde_json::to_string(&call).unwrap();
        assert_eq!(s, r#"{"id":"c1","type":"function","function":{"name":"f","arguments":{"b":1,"a":2}}}"#);
        let bad = ToolCall::from_json_arguments(None, "f", "not json");
        assert_eq!(bad.function.arguments, json!("not json"));
    }

    #[test]
    fn null_fields_deserialize_as_absent() {
        let m: Message =
            serde_json::from_value(json!({"role": "assistant", "content": null, "tool_calls": null})).unwrap();
        assert_eq!(serde_json::to_value(&m).unwrap(), json!({"role": "assistant"}));
    }

    #[test]
    fn content_parts_round_trip() {
        let m: Message = serde_json::from_value(json!({
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "image"}]
        }))
        .unwrap();
        assert_eq!(
            m.content,
            Some(Content::Parts(vec![ContentPart::Text { text: "hi".into() }, ContentPart::Image {}]))
        );
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]})
        );
    }
}
