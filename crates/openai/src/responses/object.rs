//! The response object, its output items, and the typed stream events that build it
//! (`response.created`, `response.output_item.added`, `response.output_text.delta`, ...,
//! `response.completed`), each sent as `event: TYPE` + `data: JSON` with a `sequence_number`.

use super::ResponseEcho;
use crate::ApiError;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResponseObject {
    pub id: String,
    /// `response`
    pub object: String,
    pub created_at: u64,
    pub completed_at: Option<u64>,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: String,
    pub error: Option<Value>,
    pub incomplete_details: Option<Value>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: Value,
    pub store: bool,
    pub temperature: Option<f64>,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub top_p: Option<f64>,
    pub truncation: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ResponseUsage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    pub metadata: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// A reasoning model's thinking, as text (no summary is made).
    Reasoning {
        id: String,
        summary: Vec<Value>,
        content: Vec<ReasoningText>,
        status: String,
    },
    Message {
        id: String,
        status: String,
        role: String,
        content: Vec<OutputText>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputText {
    /// `output_text`
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
    pub annotations: Vec<Value>,
    pub logprobs: Vec<Value>,
}

impl OutputText {
    pub fn new(text: String) -> Self {
        OutputText { kind: "output_text".into(), text, annotations: Vec::new(), logprobs: Vec::new() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReasoningText {
    /// `reasoning_text`
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseUsage {
    pub input_tokens: u32,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u32,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputTokensDetails {
    pub cached_tokens: u32,
    pub cache_write_tokens: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u32,
}

impl ResponseUsage {
    pub fn new(input_tokens: u32, output_tokens: u32, cached_tokens: u32) -> Self {
        ResponseUsage {
            input_tokens,
            input_tokens_details: InputTokensDetails { cached_tokens, cache_write_tokens: 0 },
            output_tokens,
            output_tokens_details: OutputTokensDetails { reasoning_tokens: 0 },
            total_tokens: input_tokens + output_tokens,
        }
    }
}

/// How a generation ended, as the response object says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Completed,
    /// Cut by `max_output_tokens` (or the context).
    Incomplete,
}

impl ResponseObject {
    /// The response as it starts: in progress, no output yet.
    pub fn in_progress(id: String, model: String, created_at: u64, echo: &ResponseEcho, store: bool) -> Self {
        ResponseObject {
            id,
            object: "response".into(),
            created_at,
            completed_at: None,
            status: "in_progress".into(),
            error: None,
            incomplete_details: None,
            instructions: echo.instructions.clone(),
            max_output_tokens: echo.max_output_tokens,
            model,
            output: Vec::new(),
            parallel_tool_calls: echo.parallel_tool_calls,
            previous_response_id: echo.previous_response_id.clone(),
            reasoning: echo.reasoning.clone(),
            store,
            temperature: echo.temperature,
            text: echo.text.clone(),
            tool_choice: echo.tool_choice.clone(),
            tools: echo.tools.clone(),
            top_p: echo.top_p,
            truncation: "disabled".into(),
            usage: None,
            user: echo.user.clone(),
            metadata: echo.metadata.clone(),
        }
    }

    /// The finished response: its output, usage and status.
    pub fn finish(&mut self, output: Vec<OutputItem>, usage: ResponseUsage, ending: Ending, now: u64) {
        self.output = output;
        self.usage = Some(usage);
        self.completed_at = Some(now);
        match ending {
            Ending::Completed => self.status = "completed".into(),
            Ending::Incomplete => {
                self.status = "incomplete".into();
                self.incomplete_details = Some(json!({"reason": "max_output_tokens"}));
            }
        }
    }

    /// All the text of the output's messages (the SDKs' `output_text`).
    pub fn output_text(&self) -> String {
        self.output
            .iter()
            .filter_map(|item| match item {
                OutputItem::Message { content, .. } => {
                    Some(content.iter().map(|c| c.text.as_str()).collect::<String>())
                }
                OutputItem::Reasoning { .. } | OutputItem::FunctionCall { .. } => None,
            })
            .collect()
    }
}

/// `DELETE /v1/responses/{id}`'s answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeletedResponse {
    pub id: String,
    /// `response.deleted`
    pub object: String,
    pub deleted: bool,
}

/// Writes a response's stream: the events in order with their sequence numbers, and the output
/// items as they end up in the final object. Thinking goes into the open reasoning item and
/// text into the open message item (one is opened when needed, closing the other); a function
/// call is an item of its own, its arguments in one delta.
#[derive(Debug)]
pub struct ResponseStream {
    response: ResponseObject,
    sequence: u64,
    items: Vec<OutputItem>,
    /// The item being written: its kind, output index and text so far.
    open: Option<(Open, usize, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning,
    Message,
}

impl ResponseStream {
    pub fn new(response: ResponseObject) -> Self {
        ResponseStream { response, sequence: 0, items: Vec::new(), open: None }
    }

    pub fn id(&self) -> &str {
        &self.response.id
    }

    /// The response object as the events so far built it.
    pub fn into_response_object(self) -> ResponseObject {
        self.response
    }

    fn event(&mut self, kind: &str, mut body: Value) -> String {
        body["type"] = Value::String(kind.to_owned());
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        format!("event: {kind}\ndata: {body}\n\n")
    }

    fn item_id_for(&self, prefix: &str) -> String {
        format!("{prefix}_{}_{}", self.response.id.trim_start_matches("resp_"), self.items.len())
    }

    /// `response.created` and `response.in_progress`.
    pub fn open(&mut self, out: &mut Vec<String>) {
        let snapshot = serde_json::to_value(&self.response).expect("responses serialize");
        out.push(self.event("response.created", json!({ "response": snapshot })));
        out.push(self.event("response.in_progress", json!({ "response": snapshot })));
    }

    pub fn text(&mut self, delta: String, out: &mut Vec<String>) {
        if delta.is_empty() {
            return;
        }
        let index = self.open_item(Open::Message, out);
        let id = self.item_id(index);
        if let Some((_, _, text)) = self.open.as_mut() {
            text.push_str(&delta);
        }
        out.push(self.event(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta, "logprobs": []}),
        ));
    }

    /// A piece of the model's thinking.
    pub fn reasoning(&mut self, delta: String, out: &mut Vec<String>) {
        if delta.is_empty() {
            return;
        }
        let index = self.open_item(Open::Reasoning, out);
        let id = self.item_id(index);
        if let Some((_, _, text)) = self.open.as_mut() {
            text.push_str(&delta);
        }
        out.push(self.event(
            "response.reasoning_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta}),
        ));
    }

    /// The output index of the open item of `kind`, opening one (closing the other) if needed.
    fn open_item(&mut self, kind: Open, out: &mut Vec<String>) -> usize {
        if let Some((open, index, _)) = &self.open {
            if *open == kind {
                return *index;
            }
        }
        self.close("completed", out);
        let index = self.items.len();
        let item = match kind {
            Open::Message => OutputItem::Message {
                id: self.item_id_for("msg"),
                status: "in_progress".into(),
                role: "assistant".into(),
                content: Vec::new(),
            },
            Open::Reasoning => OutputItem::Reasoning {
                id: self.item_id_for("rs"),
                summary: Vec::new(),
                content: Vec::new(),
                status: "in_progress".into(),
            },
        };
        out.push(self.event("response.output_item.added", json!({"output_index": index, "item": item})));
        self.items.push(item);
        if kind == Open::Message {
            let id = self.item_id(index);
            let part = OutputText::new(String::new());
            out.push(self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            ));
        }
        self.open = Some((kind, index, String::new()));
        index
    }

    fn item_id(&self, index: usize) -> String {
        match &self.items[index] {
            OutputItem::Reasoning { id, .. } | OutputItem::Message { id, .. } | OutputItem::FunctionCall { id, .. } => {
                id.clone()
            }
        }
    }

    /// Closes the open item, if any.
    fn close(&mut self, status: &str, out: &mut Vec<String>) {
        let Some((kind, index, text)) = self.open.take() else { return };
        let id = self.item_id(index);
        if kind == Open::Reasoning {
            out.push(self.event(
                "response.reasoning_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
            ));
            let item = OutputItem::Reasoning {
                id,
                summary: Vec::new(),
                content: vec![ReasoningText { kind: "reasoning_text".into(), text }],
                status: status.into(),
            };
            out.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
            self.items[index] = item;
            return;
        }
        let part = OutputText::new(text.clone());
        out.push(self.event(
            "response.output_text.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
        ));
        out.push(self.event(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        ));
        let item = OutputItem::Message { id, status: status.into(), role: "assistant".into(), content: vec![part] };
        out.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
        self.items[index] = item;
    }

    /// A whole function call.
    pub fn function_call(&mut self, call_id: String, name: String, arguments: String, out: &mut Vec<String>) {
        self.close("completed", out);
        let index = self.items.len();
        let id = format!("fc_{}", call_id.trim_start_matches("call_"));
        let added = OutputItem::FunctionCall {
            id: id.clone(),
            call_id: call_id.clone(),
            name: name.clone(),
            arguments: String::new(),
            status: "in_progress".into(),
        };
        out.push(self.event("response.output_item.added", json!({"output_index": index, "item": added})));
        out.push(self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": arguments}),
        ));
        out.push(self.event(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "name": name, "arguments": arguments}),
        ));
        let done = OutputItem::FunctionCall { id, call_id, name, arguments, status: "completed".into() };
        out.push(self.event("response.output_item.done", json!({"output_index": index, "item": done})));
        self.items.push(done);
    }

    /// The last event: `response.completed`, or `response.incomplete` when cut.
    pub fn finish(&mut self, usage: ResponseUsage, ending: Ending, now: u64, out: &mut Vec<String>) {
        let item_status = if ending == Ending::Completed { "completed" } else { "incomplete" };
        self.close(item_status, out);
        let items = std::mem::take(&mut self.items);
        self.response.finish(items, usage, ending, now);
        let kind = if ending == Ending::Completed { "response.completed" } else { "response.incomplete" };
        let snapshot = serde_json::to_value(&self.response).expect("responses serialize");
        out.push(self.event(kind, json!({ "response": snapshot })));
    }

    /// A failure after the stream started: an `error` event, then `response.failed`.
    pub fn fail(&mut self, e: &ApiError, out: &mut Vec<String>) {
        let code = e.code.clone().unwrap_or_else(|| e.kind.to_owned());
        out.push(self.event("error", json!({"code": code, "message": e.message, "param": e.param})));
        self.response.status = "failed".into();
        self.response.error = Some(json!({"code": "server_error", "message": e.message}));
        let snapshot = serde_json::to_value(&self.response).expect("responses serialize");
        out.push(self.event("response.failed", json!({ "response": snapshot })));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo() -> ResponseEcho {
        ResponseEcho {
            instructions: None,
            max_output_tokens: Some(5),
            metadata: Map::new(),
            parallel_tool_calls: true,
            previous_response_id: None,
            temperature: None,
            top_p: None,
            tool_choice: json!("auto"),
            tools: Vec::new(),
            text: json!({"format": {"type": "text"}}),
            reasoning: Value::Null,
            user: None,
        }
    }

    fn parse(out: &[String]) -> Vec<Value> {
        out.iter()
            .map(|e| {
                let (head, data) = e.split_once('\n').unwrap();
                let v: Value = serde_json::from_str(data.trim_start_matches("data: ").trim()).unwrap();
                assert_eq!(head.trim_start_matches("event: "), v["type"]);
                v
            })
            .collect()
    }

    #[test]
    fn a_stream_builds_the_final_object() {
        let start = ResponseObject::in_progress("resp_1".into(), "m".into(), 10, &echo(), true);
        let mut s = ResponseStream::new(start);
        let mut out = Vec::new();
        s.open(&mut out);
        s.reasoning("Think.".into(), &mut out);
        s.text("Hel".into(), &mut out);
        s.text("lo".into(), &mut out);
        s.function_call("call_1_0".into(), "f".into(), r#"{"a":1}"#.into(), &mut out);
        s.finish(ResponseUsage::new(7, 3, 0), Ending::Completed, 11, &mut out);
        let events = parse(&out);
        let seq: Vec<u64> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
        assert_eq!(seq, (0..events.len() as u64).collect::<Vec<_>>());
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let last: ResponseObject = serde_json::from_value(events.last().unwrap()["response"].clone()).unwrap();
        assert_eq!((last.status.as_str(), last.output_text()), ("completed", "Hello".to_owned()));
        assert_eq!(last.output.len(), 3);
        assert!(matches!(&last.output[0], OutputItem::Reasoning { content, .. } if content[0].text == "Think."));
        assert!(matches!(&last.output[2], OutputItem::FunctionCall { call_id, .. } if call_id == "call_1_0"));
        assert_eq!(last.usage.unwrap().total_tokens, 10);
    }

    #[test]
    fn a_cut_answer_is_incomplete() {
        let mut r = ResponseObject::in_progress("resp_2".into(), "m".into(), 10, &echo(), false);
        r.finish(vec![], ResponseUsage::new(1, 5, 0), Ending::Incomplete, 12);
        assert_eq!(r.status, "incomplete");
        assert_eq!(r.incomplete_details, Some(json!({"reason": "max_output_tokens"})));
    }
}
