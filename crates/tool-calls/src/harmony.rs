//! gpt-oss's harmony format: an answer is a series of messages, each a header and a body in
//! control tokens, which the engine writes as their text when asked (ABI minor 5,
//! `LLMR_INFER_SPECIAL_TEXT`):
//!
//! ```text
//! <|channel|>analysis<|message|>thinking<|end|><|start|>assistant<|channel|>final<|message|>answer
//! <|channel|>analysis<|message|>thinking<|end|><|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"a": 1}
//! ```
//!
//! (the prompt ends with `<|start|>assistant`; `<|return|>` and `<|call|>` end the generation and
//! are not written). The `analysis` channel is the model's thinking; `final` is the answer; a
//! `commentary` message addressed to `functions.NAME` is a call of that tool with its body as the
//! arguments, and one with no recipient (a preamble before calls) is shown as content, as vLLM and
//! llama-server show it. Headers and markers are framing and never reach the client. A call to a
//! tool the request did not offer, or whose body is not JSON, is content, so no text is lost.
//! As with the other readers, the result never depends on how the text was cut into pieces.

use crate::call::{named_call, Allowed};
use crate::partial::partial_suffix;
use crate::ParsedCall;
use serde_json::Value;

/// The control tokens of the format, as text.
pub(crate) mod marker {
    pub(crate) const START: &str = "<|start|>";
    pub(crate) const CHANNEL: &str = "<|channel|>";
    pub(crate) const MESSAGE: &str = "<|message|>";
    pub(crate) const END: &str = "<|end|>";
    pub(crate) const CONSTRAIN: &str = "<|constrain|>";
    pub(crate) const RETURN: &str = "<|return|>";
    pub(crate) const CALL: &str = "<|call|>";
}

use marker::{CALL, CHANNEL, CONSTRAIN, END, MESSAGE, RETURN, START};

/// Whether a chat template writes harmony (gpt-oss's).
pub fn is_harmony(template_source: &str) -> bool {
    template_source.contains(CHANNEL) && template_source.contains(MESSAGE)
}

/// What a piece of a harmony answer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HarmonyEvent {
    Reasoning(String),
    Content(String),
    Call { index: usize, call: ParsedCall },
}

/// What the body of the current message is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    /// A call of this function: its arguments are held until the message ends.
    Call(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Reading a message's header, up to `<|message|>`.
    Header,
    /// Reading a message's body, up to a marker that ends it.
    Body(Body),
}

/// A header that never reaches `<|message|>` within this many bytes is not one: the text is the
/// answer as it is.
const MAX_HEADER: usize = 512;

/// Splits a streamed harmony answer into thinking, content and calls.
#[derive(Debug)]
pub struct HarmonyParser {
    allowed: Allowed,
    state: State,
    /// Text received and not decided yet.
    held: String,
    /// A call's body so far.
    arguments: String,
    calls: usize,
}

impl HarmonyParser {
    /// `allowed`: the tools the request offered (a call to another is content; with none offered,
    /// every call is content).
    pub fn new(allowed: Vec<String>) -> Self {
        // `Allowed` takes an empty list as "any name"; with no tools offered, none is.
        let allowed = if allowed.is_empty() { Allowed::none() } else { Allowed::new(allowed) };
        HarmonyParser { allowed, state: State::Header, held: String::new(), arguments: String::new(), calls: 0 }
    }

    /// Tells the parser that generation continues from `prefill`, text appended to the prompt
    /// (a forced call's opening, [`ToolCallFormat::forced_prefix`](crate::ToolCallFormat::forced_prefix)):
    /// it is read as if the model had written it. Its events come with the first push.
    pub fn with_prefill(mut self, prefill: &str) -> Self {
        self.held.push_str(prefill);
        self
    }

    pub fn push(&mut self, text: &str) -> Vec<HarmonyEvent> {
        self.held.push_str(text);
        let mut out = Vec::new();
        self.run(false, &mut out);
        out
    }

    /// The end of the answer (`<|return|>` or `<|call|>`, which are not written, or the length
    /// limit): a call's body complete as JSON is the call.
    pub fn finish(&mut self) -> Vec<HarmonyEvent> {
        let mut out = Vec::new();
        self.run(true, &mut out);
        out
    }

    fn run(&mut self, end: bool, out: &mut Vec<HarmonyEvent>) {
        loop {
            match self.state.clone() {
                State::Header => {
                    if let Some(at) = self.held.find(MESSAGE) {
                        let header = self.held[..at].to_owned();
                        self.held.drain(..at + MESSAGE.len());
                        self.state = State::Body(body_of(&header));
                        continue;
                    }
                    if !self.looks_like_header() {
                        // Not harmony after all: the rest is the answer as written.
                        self.state = State::Body(Body::Content);
                        continue;
                    }
                    if end {
                        // A header cut short is framing; text without a marker is the answer.
                        let held = std::mem::take(&mut self.held);
                        if !held.contains("<|") {
                            emit(out, HarmonyEvent::Content(held));
                        }
                    }
                    return;
                }
                State::Body(body) => {
                    let ended = [END, CALL, RETURN, START]
                        .iter()
                        .filter_map(|m| self.held.find(m).map(|at| (at, m.len())))
                        .min();
                    match ended {
                        Some((at, len)) => {
                            let text = self.held[..at].to_owned();
                            self.held.drain(..at + len);
                            self.body_text(&body, &text, out);
                            self.end_message(&body, out);
                            self.state = State::Header;
                        }
                        None if end => {
                            let text = std::mem::take(&mut self.held);
                            self.body_text(&body, &text, out);
                            self.end_message(&body, out);
                            self.state = State::Header;
                            return;
                        }
                        None => {
                            // Keep back what may be the start of a marker.
                            let keep = [END, CALL, RETURN, START]
                                .iter()
                                .map(|m| partial_suffix(&self.held, m))
                                .max()
                                .unwrap_or(0);
                            let ready = self.held.len() - keep;
                            let text: String = self.held.drain(..ready).collect();
                            self.body_text(&body, &text, out);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Whether the text held at a message's start can still be (the start of) a header.
    fn looks_like_header(&self) -> bool {
        let held = self.held.trim_start();
        if held.len() > MAX_HEADER {
            return false;
        }
        let opens = [START, CHANNEL, CONSTRAIN, "to="];
        held.is_empty()
            || opens.iter().any(|o| held.starts_with(o) || o.starts_with(held))
            || held.starts_with("assistant")
            || "assistant".starts_with(held)
    }

    fn body_text(&mut self, body: &Body, text: &str, out: &mut Vec<HarmonyEvent>) {
        if text.is_empty() {
            return;
        }
        match body {
            Body::Reasoning => emit(out, HarmonyEvent::Reasoning(text.to_owned())),
            Body::Content => emit(out, HarmonyEvent::Content(text.to_owned())),
            Body::Call(_) => self.arguments.push_str(text),
        }
    }

    /// A call message ended: its body is the call, or content when it is not one.
    fn end_message(&mut self, body: &Body, out: &mut Vec<HarmonyEvent>) {
        let Body::Call(name) = body else { return };
        let arguments = std::mem::take(&mut self.arguments);
        let call = serde_json::from_str::<Value>(arguments.trim())
            .ok()
            .and_then(|value| named_call(name, &value, &self.allowed));
        match call {
            Some(call) => {
                out.push(HarmonyEvent::Call { index: self.calls, call });
                self.calls += 1;
            }
            None => emit(out, HarmonyEvent::Content(arguments)),
        }
    }
}

/// What a message's header says its body is.
fn body_of(header: &str) -> Body {
    let header = header.trim_start().strip_prefix(START).unwrap_or(header);
    let channel = header
        .split(CHANNEL)
        .nth(1)
        .map(|rest| rest.split(|c: char| c.is_whitespace() || c == '<').next().unwrap_or_default())
        .unwrap_or_default();
    let recipient = header
        .split("to=")
        .nth(1)
        .map(|rest| rest.split(|c: char| c.is_whitespace() || c == '<').next().unwrap_or_default());
    match (channel, recipient) {
        ("analysis", None) => Body::Reasoning,
        (_, Some(to)) => match to.strip_prefix("functions.") {
            Some(name) if !name.is_empty() => Body::Call(name.to_owned()),
            // A built-in tool (`browser.search`, `python`) llmr does not run: shown as it is.
            _ => Body::Content,
        },
        _ => Body::Content,
    }
}

/// Appends text, merging it into an event of the same kind just before.
fn emit(out: &mut Vec<HarmonyEvent>, event: HarmonyEvent) {
    match (out.last_mut(), event) {
        (Some(HarmonyEvent::Reasoning(a)), HarmonyEvent::Reasoning(b)) => a.push_str(&b),
        (Some(HarmonyEvent::Content(a)), HarmonyEvent::Content(b)) => a.push_str(&b),
        (_, HarmonyEvent::Reasoning(t) | HarmonyEvent::Content(t)) if t.is_empty() => {}
        (_, event) => out.push(event),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole answer read at once: (thinking, content, calls).
    fn read(allowed: &[&str], pieces: &[&str]) -> (String, String, Vec<ParsedCall>) {
        let mut p = HarmonyParser::new(allowed.iter().map(|s| s.to_string()).collect());
        let mut events = Vec::new();
        for piece in pieces {
            events.extend(p.push(piece));
        }
        events.extend(p.finish());
        let (mut r, mut c, mut calls) = (String::new(), String::new(), Vec::new());
        for ev in events {
            match ev {
                HarmonyEvent::Reasoning(t) => r.push_str(&t),
                HarmonyEvent::Content(t) => c.push_str(&t),
                HarmonyEvent::Call { index, call } => {
                    assert_eq!(index, calls.len());
                    calls.push(call);
                }
            }
        }
        (r, c, calls)
    }

    /// Every cut in two, and one piece per character, reads the same as the whole.
    fn same_however_cut(allowed: &[&str], text: &str) -> (String, String, Vec<ParsedCall>) {
        let whole = read(allowed, &[text]);
        for i in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(read(allowed, &[&text[..i], &text[i..]]), whole, "cut at {i} of {text:?}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(read(allowed, &chars), whole, "char by char: {text:?}");
        whole
    }

    fn call(name: &str, arguments: &str) -> ParsedCall {
        ParsedCall { name: name.into(), arguments: arguments.into() }
    }

    #[test]
    fn analysis_is_thinking_and_final_is_the_answer() {
        let text = "<|channel|>analysis<|message|>User asks capital. Paris.<|end|><|start|>assistant<|channel|>final<|message|>The capital is Paris.";
        assert_eq!(
            same_however_cut(&[], text),
            ("User asks capital. Paris.".into(), "The capital is Paris.".into(), vec![])
        );
        // No thinking at all, and an answer that the length limit cut inside its thinking.
        assert_eq!(same_however_cut(&[], "<|channel|>final<|message|>Hi"), ("".into(), "Hi".into(), vec![]));
        assert_eq!(
            same_however_cut(&[], "<|channel|>analysis<|message|>still thin"),
            ("still thin".into(), "".into(), vec![])
        );
    }

    #[test]
    fn a_commentary_message_to_a_function_is_a_call() {
        // The template's form (recipient in the role part), ended by `<|call|>` which is not written.
        let text = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}";
        assert_eq!(
            same_however_cut(&["get_weather"], text),
            ("Need weather.".into(), "".into(), vec![call("get_weather", r#"{"city":"Paris"}"#)])
        );
        // OpenAI's documented form (recipient after the channel, `<|constrain|>`), and a preamble.
        let text = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>";
        assert_eq!(same_however_cut(&["f"], text), ("".into(), "Checking.".into(), vec![call("f", "{}")]));
    }

    #[test]
    fn what_is_not_a_valid_call_stays_content() {
        let to_g = "<|channel|>commentary to=functions.g json<|message|>{\"a\": 1}";
        assert_eq!(same_however_cut(&["f"], to_g), ("".into(), "{\"a\": 1}".into(), vec![]));
        assert_eq!(same_however_cut(&[], to_g), ("".into(), "{\"a\": 1}".into(), vec![]), "no tools offered");
        let cut = "<|channel|>commentary to=functions.f json<|message|>{\"a\": ";
        assert_eq!(same_however_cut(&["f"], cut), ("".into(), "{\"a\": ".into(), vec![]));
        let builtin = "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=browser.search<|channel|>commentary<|message|>q";
        assert_eq!(same_however_cut(&["f"], builtin), ("x".into(), "q".into(), vec![]));
    }

    #[test]
    fn text_that_is_not_harmony_is_the_answer() {
        assert_eq!(same_however_cut(&[], "Paris is the capital."), ("".into(), "Paris is the capital.".into(), vec![]));
        assert_eq!(same_however_cut(&[], "assistant"), ("".into(), "assistant".into(), vec![]));
        assert_eq!(same_however_cut(&[], "<|channel|>fin"), ("".into(), "".into(), vec![]), "a header cut short");
    }

    #[test]
    fn harmony_templates_are_recognised() {
        assert!(is_harmony("{{- \"<|start|>assistant<|channel|>final<|message|>\" }}"));
        assert!(!is_harmony("<|im_start|>assistant"));
    }
}
