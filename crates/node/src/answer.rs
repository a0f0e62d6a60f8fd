//! Reading an answer as it is generated: a reasoning model's thinking is split off first, then
//! tool calls are read out of the rest (thinking never reaches the call parser or the content).
//! A harmony answer (gpt-oss) says itself which message is which, and one parser reads all three.
//! The chat, Messages and Responses encoders all read answers through this, streamed or whole.

use crate::prompt::ToolParsing;
use llmr_tool_calls::{
    HarmonyEvent, HarmonyParser, ParsedCall, ReasoningFormat, ReasoningSplitter, Split, StreamEvent, StreamParser,
};

/// How to read a request's answer, decided when its prompt was rendered.
#[derive(Clone, Debug, Default)]
pub struct Reading {
    /// The offered tools, when calls are read back.
    pub tools: Option<ToolParsing>,
    /// The model's thinking markers, and whether the prompt left it inside its thinking.
    pub reasoning: Option<(ReasoningFormat, bool)>,
}

impl Reading {
    /// Nothing to read out: the answer is its text.
    pub fn is_plain(&self) -> bool {
        self.tools.is_none() && self.reasoning.is_none()
    }

    /// A reader for a streamed answer.
    pub fn reader(&self) -> AnswerReader {
        if self.reasoning.is_some_and(|(format, _)| format.is_harmony()) {
            let (allowed, prefill) =
                self.tools.as_ref().map(|t| (t.allowed.clone(), t.prefill.as_str())).unwrap_or_default();
            return AnswerReader {
                splitter: None,
                calls: None,
                harmony: Some(HarmonyParser::new(allowed).with_prefill(prefill)),
            };
        }
        AnswerReader {
            splitter: self.reasoning.map(|(format, inside)| ReasoningSplitter::new(format, inside)),
            calls: self.tools.as_ref().map(ToolParsing::stream_parser),
            harmony: None,
        }
    }

    /// A whole answer read at once (the same machine as the stream's).
    pub fn read(&self, text: &str) -> Answer {
        let mut reader = self.reader();
        let mut events = reader.push(text);
        events.extend(reader.finish());
        let mut answer = Answer::default();
        for ev in events {
            match ev {
                AnswerEvent::Reasoning(t) => answer.reasoning.push_str(&t),
                AnswerEvent::Content(t) => answer.content.push_str(&t),
                AnswerEvent::Call { call, .. } => answer.calls.push(call),
            }
        }
        answer
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnswerEvent {
    Reasoning(String),
    Content(String),
    Call { index: usize, call: ParsedCall },
}

/// A whole answer, read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<ParsedCall>,
}

pub struct AnswerReader {
    splitter: Option<ReasoningSplitter>,
    calls: Option<StreamParser>,
    harmony: Option<HarmonyParser>,
}

impl AnswerReader {
    pub fn push(&mut self, text: &str) -> Vec<AnswerEvent> {
        if let Some(harmony) = self.harmony.as_mut() {
            return harmony.push(text).into_iter().map(from_harmony_event).collect();
        }
        let mut out = Vec::new();
        match self.splitter.as_mut() {
            Some(splitter) => {
                let splits = splitter.push(text);
                self.splits(splits, &mut out);
            }
            None => self.content(text, &mut out),
        }
        out
    }

    pub fn finish(&mut self) -> Vec<AnswerEvent> {
        if let Some(harmony) = self.harmony.as_mut() {
            return harmony.finish().into_iter().map(from_harmony_event).collect();
        }
        let mut out = Vec::new();
        if let Some(splitter) = self.splitter.as_mut() {
            let splits = splitter.finish();
            self.splits(splits, &mut out);
        }
        if let Some(calls) = self.calls.as_mut() {
            out.extend(calls.finish().into_iter().map(from_call_event));
        }
        out.retain(|ev| !matches!(ev, AnswerEvent::Content(t) | AnswerEvent::Reasoning(t) if t.is_empty()));
        out
    }

    fn splits(&mut self, splits: Vec<Split>, out: &mut Vec<AnswerEvent>) {
        for split in splits {
            match split {
                Split::Reasoning(t) => out.push(AnswerEvent::Reasoning(t)),
                Split::Content(t) => self.content(&t, out),
            }
        }
    }

    fn content(&mut self, text: &str, out: &mut Vec<AnswerEvent>) {
        match self.calls.as_mut() {
            Some(calls) => out.extend(calls.push(text).into_iter().map(from_call_event)),
            None => out.push(AnswerEvent::Content(text.to_owned())),
        }
        out.retain(|ev| !matches!(ev, AnswerEvent::Content(t) if t.is_empty()));
    }
}

fn from_harmony_event(ev: HarmonyEvent) -> AnswerEvent {
    match ev {
        HarmonyEvent::Reasoning(t) => AnswerEvent::Reasoning(t),
        HarmonyEvent::Content(t) => AnswerEvent::Content(t),
        HarmonyEvent::Call { index, call } => AnswerEvent::Call { index, call },
    }
}

fn from_call_event(ev: StreamEvent) -> AnswerEvent {
    match ev {
        StreamEvent::Content(t) => AnswerEvent::Content(t),
        StreamEvent::Call { index, call } => AnswerEvent::Call { index, call },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmr_tool_calls::ToolCallFormat;

    fn reading() -> Reading {
        Reading {
            tools: Some(ToolParsing {
                format: ToolCallFormat::Hermes,
                allowed: vec!["f".into()],
                prefill: String::new(),
            }),
            reasoning: Some((ReasoningFormat::THINK, false)),
        }
    }

    #[test]
    fn thinking_never_reaches_content_or_calls() {
        let text = "<think>maybe call <tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>?</think>\n\nOk.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let whole = reading().read(text);
        assert_eq!(whole.reasoning, "maybe call <tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>?");
        assert_eq!(whole.content.trim(), "Ok.");
        assert_eq!(whole.calls, vec![ParsedCall { name: "f".into(), arguments: r#"{"a":1}"#.into() }]);
        // Streamed in small pieces, the same answer.
        let mut reader = reading().reader();
        let mut events = Vec::new();
        for chunk in text.as_bytes().chunks(3) {
            events.extend(reader.push(std::str::from_utf8(chunk).unwrap()));
        }
        events.extend(reader.finish());
        let mut streamed = Answer::default();
        for ev in events {
            match ev {
                AnswerEvent::Reasoning(t) => streamed.reasoning.push_str(&t),
                AnswerEvent::Content(t) => streamed.content.push_str(&t),
                AnswerEvent::Call { call, .. } => streamed.calls.push(call),
            }
        }
        assert_eq!(streamed, whole);
    }
}
