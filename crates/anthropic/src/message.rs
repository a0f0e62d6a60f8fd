//! The answer: a `message` with content blocks, or its stream of events
//! (`message_start`, `content_block_start` / `_delta` / `_stop` per block, `message_delta` with the
//! stop reason and usage, `message_stop`), each sent as `event: NAME` + `data: JSON`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Message {
    pub id: String,
    /// `message`
    #[serde(rename = "type")]
    pub kind: String,
    /// `assistant`
    pub role: String,
    pub model: String,
    pub content: Vec<ContentBlock>,
    pub stop_reason: Option<StopReason>,
    pub stop_sequence: Option<String>,
    pub usage: Usage,
}

impl Message {
    /// A message with no content yet (the `message_start` event's).
    pub fn new(id: String, model: String, usage: Usage) -> Message {
        Message {
            id,
            kind: "message".into(),
            role: "assistant".into(),
            model,
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    /// A reasoning model's thinking. `signature` is Anthropic's proof of origin; this server
    /// signs nothing and sends it empty.
    Thinking {
        thinking: String,
        signature: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    MaxTokens,
    StopSequence,
    ToolUse,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Prompt tokens served from the prefix cache.
    #[serde(default)]
    pub cache_read_input_tokens: u32,
    #[serde(default)]
    pub cache_creation_input_tokens: u32,
}

/// `/v1/messages/count_tokens`' answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenCount {
    pub input_tokens: u32,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    MessageStart { message: Message },
    ContentBlockStart { index: usize, content_block: ContentBlock },
    ContentBlockDelta { index: usize, delta: BlockDelta },
    ContentBlockStop { index: usize },
    MessageDelta { delta: MessageDelta, usage: Usage },
    MessageStop,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    TextDelta { text: String },
    ThinkingDelta { thinking: String },
    InputJsonDelta { partial_json: String },
}

#[derive(Debug, Clone, Serialize)]
pub struct MessageDelta {
    pub stop_reason: StopReason,
    pub stop_sequence: Option<String>,
}

impl StreamEvent {
    fn name(&self) -> &'static str {
        match self {
            StreamEvent::MessageStart { .. } => "message_start",
            StreamEvent::ContentBlockStart { .. } => "content_block_start",
            StreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            StreamEvent::ContentBlockStop { .. } => "content_block_stop",
            StreamEvent::MessageDelta { .. } => "message_delta",
            StreamEvent::MessageStop => "message_stop",
        }
    }

    /// The event as SSE: `event: NAME`, then its JSON.
    pub fn sse(&self) -> String {
        format!("event: {}\ndata: {}\n\n", self.name(), serde_json::to_string(self).expect("events serialize"))
    }
}

/// The content blocks of a streamed message, opened and closed in order: thinking and text go
/// into the open block of their kind (one is opened when needed, closing the other), a tool call
/// is a block of its own whose input arrives as one `input_json_delta`.
#[derive(Debug, Default)]
pub struct BlockWriter {
    /// Index of the next block.
    next: usize,
    /// The thinking or text block that is open, and its index.
    open: Option<(Open, usize)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
}

impl BlockWriter {
    pub fn text(&mut self, text: String, out: &mut Vec<String>) {
        if text.is_empty() {
            return;
        }
        let index = self.open_block(Open::Text, out);
        out.push(StreamEvent::ContentBlockDelta { index, delta: BlockDelta::TextDelta { text } }.sse());
    }

    pub fn thinking(&mut self, thinking: String, out: &mut Vec<String>) {
        if thinking.is_empty() {
            return;
        }
        let index = self.open_block(Open::Thinking, out);
        out.push(StreamEvent::ContentBlockDelta { index, delta: BlockDelta::ThinkingDelta { thinking } }.sse());
    }

    /// The index of the open block of `kind`, opening one (and closing the other kind) if needed.
    fn open_block(&mut self, kind: Open, out: &mut Vec<String>) -> usize {
        match self.open {
            Some((open, index)) if open == kind => index,
            _ => {
                self.close(out);
                let index = self.next;
                self.next += 1;
                self.open = Some((kind, index));
                let start = match kind {
                    Open::Text => ContentBlock::Text { text: String::new() },
                    Open::Thinking => ContentBlock::Thinking { thinking: String::new(), signature: String::new() },
                };
                out.push(StreamEvent::ContentBlockStart { index, content_block: start }.sse());
                index
            }
        }
    }

    /// A whole tool call: `input` is its arguments' JSON text.
    pub fn tool_use(&mut self, id: String, name: String, input: String, out: &mut Vec<String>) {
        self.close(out);
        let index = self.next;
        self.next += 1;
        let start = ContentBlock::ToolUse { id, name, input: Value::Object(Default::default()) };
        out.push(StreamEvent::ContentBlockStart { index, content_block: start }.sse());
        out.push(
            StreamEvent::ContentBlockDelta { index, delta: BlockDelta::InputJsonDelta { partial_json: input } }.sse(),
        );
        out.push(StreamEvent::ContentBlockStop { index }.sse());
    }

    /// Closes the open thinking or text block, if any.
    pub fn close(&mut self, out: &mut Vec<String>) {
        if let Some((_, index)) = self.open.take() {
            out.push(StreamEvent::ContentBlockStop { index }.sse());
        }
    }
}

/// A tool call's input as a JSON object: arguments that do not parse (a model's call cut short)
/// are kept as text under `_raw` rather than lost.
pub fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => serde_json::json!({ "_raw": arguments }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(out: &[String]) -> Vec<Value> {
        out.iter()
            .map(|e| {
                let (head, data) = e.split_once('\n').unwrap();
                let v: Value = serde_json::from_str(data.trim_start_matches("data: ").trim()).unwrap();
                assert_eq!(head.trim_start_matches("event: "), v["type"], "the event's name is its type");
                v
            })
            .collect()
    }

    #[test]
    fn blocks_open_and_close_in_order() {
        let mut w = BlockWriter::default();
        let mut out = Vec::new();
        w.thinking("Hmm.".into(), &mut out);
        w.text("Let me ".into(), &mut out);
        w.text("check.".into(), &mut out);
        w.tool_use("toolu_1".into(), "weather".into(), r#"{"city":"Paris"}"#.into(), &mut out);
        w.text("Done.".into(), &mut out);
        w.close(&mut out);
        let types: Vec<(String, u64)> = events(&out)
            .iter()
            .map(|v| (v["type"].as_str().unwrap().to_owned(), v["index"].as_u64().unwrap()))
            .collect();
        let want = [
            ("content_block_start", 0),
            ("content_block_delta", 0),
            ("content_block_stop", 0),
            ("content_block_start", 1),
            ("content_block_delta", 1),
            ("content_block_delta", 1),
            ("content_block_stop", 1),
            ("content_block_start", 2),
            ("content_block_delta", 2),
            ("content_block_stop", 2),
            ("content_block_start", 3),
            ("content_block_delta", 3),
            ("content_block_stop", 3),
        ];
        assert_eq!(types, want.map(|(t, i)| (t.to_owned(), i)));
        let v = events(&out);
        assert_eq!(v[0]["content_block"]["type"], "thinking");
        assert_eq!(v[1]["delta"], serde_json::json!({"type": "thinking_delta", "thinking": "Hmm."}));
        assert_eq!(v[7]["content_block"]["input"], serde_json::json!({}));
        assert_eq!(v[8]["delta"]["partial_json"], r#"{"city":"Paris"}"#);
    }

    #[test]
    fn unparsable_arguments_are_kept() {
        assert_eq!(tool_input(r#"{"a":1}"#), serde_json::json!({"a": 1}));
        assert_eq!(tool_input(r#"{"a":"#), serde_json::json!({"_raw": r#"{"a":"#}));
    }
}
