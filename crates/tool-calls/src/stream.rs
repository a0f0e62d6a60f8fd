//! The streaming parser: one state machine that every format (and [`ToolCallFormat::parse`]) runs.
//!
//! The parser keeps the text it has not decided yet (`pending`). After each piece it decides as
//! much of it as it can: content that cannot start a call is released, a complete call is emitted,
//! framing around calls (markers, separators, the whitespace next to a call) is dropped, and the
//! rest waits. A decision never depends on where the text was split, which is what makes streaming
//! and [`ToolCallFormat::parse`] agree.

use serde_json::Value;

use crate::call::{self, Allowed, Framing};
use crate::format::marker::{
    FENCE, HERMES_CLOSE, HERMES_OPEN, MISTRAL_ARGS, MISTRAL_CALL_ID, MISTRAL_OPEN, PYTHON_TAG,
};
use crate::json_scan::{JsonScanner, Scan};
use crate::partial::partial_suffix;
use crate::{ParsedCall, StreamEvent, ToolCallFormat};

/// Parses tool calls out of generated text as it streams; see the crate documentation.
#[derive(Debug)]
pub struct StreamParser {
    allowed: Allowed,
    state: State,
    /// Text received and not decided yet; state offsets point into it.
    pending: String,
    /// Calls emitted so far (the next call's index).
    calls: usize,
    /// Events decided by the prefill, returned with the next `push` or `finish`.
    queued: Vec<StreamEvent>,
}

impl StreamParser {
    /// A parser for `format`; `allowed` lists the tool names offered (a call to another name is
    /// content; an empty list accepts every name).
    pub fn new(format: ToolCallFormat, allowed: Vec<String>) -> Self {
        let state = match format {
            ToolCallFormat::Hermes => State::HermesStart,
            ToolCallFormat::Mistral | ToolCallFormat::MistralArgs => {
                State::Search { marker: Marker::Mistral, after_call: false }
            }
            // Harmony answers are read by `HarmonyParser`; as bare text, a call is bare JSON.
            ToolCallFormat::Llama3 | ToolCallFormat::PlainJson | ToolCallFormat::Harmony => State::Start,
        };
        Self { allowed: Allowed::new(allowed), state, pending: String::new(), calls: 0, queued: Vec::new() }
    }

    /// Tells the parser that generation continues from `prefill`, text appended to the prompt (see
    /// [`ToolCallFormat::forced_prefix`]). Call it before the first [`push`](Self::push). The prefill
    /// is read as if the model had written it: it is part of the call it opens, and if that call
    /// turns out invalid it is part of the content returned instead.
    pub fn with_prefill(mut self, prefill: &str) -> Self {
        let events = self.push(prefill);
        self.queued.extend(events);
        self
    }

    /// Adds a piece of generated text and returns the events it decided. Content that cannot start
    /// a call is returned at once (whitespace that may come just before a call waits for the text
    /// after it, since it is dropped before a call); text that may open a call waits until that is
    /// decided; a call is returned whole, as one event, once complete.
    pub fn push(&mut self, piece: &str) -> Vec<StreamEvent> {
        self.pending.push_str(piece);
        self.run(false)
    }

    /// Ends the generation: everything still held is decided. A call complete but for its closing
    /// marker is a call; anything unterminated or invalid is returned as content, so no text is lost.
    pub fn finish(&mut self) -> Vec<StreamEvent> {
        self.run(true)
    }

    /// Decides as much of `pending` as possible; `end`: no more text will come.
    fn run(&mut self, end: bool) -> Vec<StreamEvent> {
        let mut events = std::mem::take(&mut self.queued);
        loop {
            let state = std::mem::replace(&mut self.state, State::Text);
            let (taken, next) = match decide(state, &self.pending, &self.allowed, end) {
                Step::Wait(state) => {
                    self.state = state;
                    return events;
                }
                Step::Content(n, next) => {
                    push_content(&mut events, &self.pending[..n]);
                    (n, next)
                }
                Step::Drop(n, next) => (n, next),
                Step::Calls(calls, n, next) => {
                    for call in calls {
                        events.push(StreamEvent::Call { index: self.calls, call });
                        self.calls += 1;
                    }
                    (n, next)
                }
            };
            self.pending.drain(..taken);
            self.state = next;
        }
    }
}

/// Appends content, merging it into a content event just before.
fn push_content(events: &mut Vec<StreamEvent>, text: &str) {
    if text.is_empty() {
        return;
    }
    match events.last_mut() {
        Some(StreamEvent::Content(content)) => content.push_str(text),
        _ => events.push(StreamEvent::Content(text.to_owned())),
    }
}

/// Where the parser is. Offsets count bytes from the start of `pending`.
#[derive(Debug)]
enum State {
    /// Bare-JSON formats before anything is decided: whitespace and an opener (`<|python_tag|>`, a
    /// ```` ``` ```` fence, `<tool_call>`) may come before a call, which must open the answer.
    Start,
    /// Hermes before anything is decided: Qwen2.5 models often answer with the bare JSON call and
    /// no `<tool_call>` block, so the answer is first read as bare JSON, then searched for blocks.
    HermesStart,
    /// Content that may contain `marker`; `after_call`: just after a call (trailing whitespace is framing).
    Search { marker: Marker, after_call: bool },
    /// `pending` holds (whitespace and) the marker; what follows it starts at `body`.
    Opened { marker: Marker, body: usize },
    /// Mistral's `name[ARGS]{...}`: the name starts at `name`.
    MistralName { name: usize },
    /// A JSON value starting at `start`, framed by `frame`.
    Json { frame: Frame, start: usize, scanner: JsonScanner },
    /// After bare-JSON calls: another call may follow (after `;` or whitespace), else content (trailing
    /// whitespace is framing).
    AfterBare,
    /// No call can follow: everything is content.
    Text,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marker {
    /// `<tool_call>`
    Hermes,
    /// `[TOOL_CALLS]`
    Mistral,
}

impl Marker {
    fn text(self) -> &'static str {
        match self {
            Marker::Hermes => HERMES_OPEN,
            Marker::Mistral => MISTRAL_OPEN,
        }
    }
}

/// What surrounds a JSON value, which decides what it must hold and what may follow it.
#[derive(Debug)]
enum Frame {
    /// Inside `<tool_call>`: one call, then `</tool_call>`.
    Hermes,
    /// After `[TOOL_CALLS]`: an array of calls, or one call.
    MistralList,
    /// After `name[ARGS]`: the arguments.
    MistralArgs { name: String },
    /// The answer itself: calls, then a closing fence if `fenced`.
    Bare { fenced: bool },
}

/// The decision on the front of `pending`.
enum Step {
    /// Nothing more can be decided before more text arrives.
    Wait(State),
    /// `pending[..n]` is content.
    Content(usize, State),
    /// `pending[..n]` is framing, dropped (`n` may be 0: a change of state only).
    Drop(usize, State),
    /// `pending[..n]` made these calls.
    Calls(Vec<ParsedCall>, usize, State),
}

/// Decides the front of `pending` in `state`; `end`: no more text will come, so every state must
/// then make progress.
fn decide(state: State, pending: &str, allowed: &Allowed, end: bool) -> Step {
    if pending.is_empty() {
        return Step::Wait(state);
    }
    // What to do when the text so far cannot decide: wait, or at the end give it back as content.
    let undecided = |state| if end { Step::Content(pending.len(), State::Text) } else { Step::Wait(state) };
    match state {
        State::Text => Step::Content(pending.len(), State::Text),
        State::Start => start(pending, end),
        State::HermesStart => match start(pending, end) {
            Step::Content(_, State::Text) => Step::Drop(0, State::Search { marker: Marker::Hermes, after_call: false }),
            Step::Wait(State::Start) => Step::Wait(State::HermesStart),
            step => step,
        },
        // Whitespace after a call is dropped if nothing else follows; before content it is content,
        // before another call it is dropped with that call.
        State::Search { after_call: true, .. } if pending.trim_start().is_empty() => {
            if end {
                Step::Drop(pending.len(), State::Text)
            } else {
                Step::Wait(state)
            }
        }
        State::Search { marker, after_call: true } => Step::Drop(0, State::Search { marker, after_call: false }),
        State::Search { marker, after_call: false } => search(marker, pending, end),
        State::Opened { marker, body } => {
            let start = body + ws_len(&pending[body..]);
            match (marker, pending[start..].chars().next()) {
                (_, None) => undecided(state),
                (Marker::Hermes, Some('{')) => json(Frame::Hermes, start),
                (Marker::Hermes, Some(_)) => hermes_invalid(pending, body, end, state),
                (Marker::Mistral, Some('[' | '{')) => json(Frame::MistralList, start),
                (Marker::Mistral, Some(c)) if is_name_char(c) => Step::Drop(0, State::MistralName { name: start }),
                (Marker::Mistral, Some(_)) => Step::Content(start, mistral_search()),
            }
        }
        State::MistralName { name } => mistral_name(pending, name, end, state),
        State::Json { frame, start, mut scanner } => match scanner.scan(&pending[start..]) {
            Scan::Incomplete => undecided(State::Json { frame, start, scanner }),
            Scan::Invalid(at) => match frame {
                Frame::Hermes => hermes_invalid(pending, start, end, State::Json { frame, start, scanner }),
                Frame::MistralList | Frame::MistralArgs { .. } => Step::Content(start + at, mistral_search()),
                Frame::Bare { .. } => Step::Content(pending.len(), State::Text),
            },
            Scan::Complete(len) => {
                let value_end = start + len;
                let value = serde_json::from_str::<Value>(&pending[start..value_end]).ok();
                json_done(State::Json { frame, start, scanner }, value.as_ref(), value_end, pending, allowed, end)
            }
        },
        State::AfterBare => {
            let n = ws_len(pending);
            match pending[n..].chars().next() {
                None if end => Step::Drop(pending.len(), State::Text),
                None => Step::Wait(State::AfterBare),
                Some('{' | '[') => Step::Drop(n, json_state(Frame::Bare { fenced: false }, 0)),
                Some(';') => {
                    let next = n + 1 + ws_len(&pending[n + 1..]);
                    match pending[next..].chars().next() {
                        // A trailing separator is framing too.
                        None if end => Step::Drop(pending.len(), State::Text),
                        None => Step::Wait(State::AfterBare),
                        Some('{' | '[') => Step::Drop(next, json_state(Frame::Bare { fenced: false }, 0)),
                        Some(_) => Step::Content(pending.len(), State::Text),
                    }
                }
                Some(_) => Step::Drop(0, State::Text),
            }
        }
    }
}

/// The start of a bare-JSON answer: `ws* (<|python_tag|> ws* | ```json? ws*)? ({ | [)`, or a
/// Hermes block. Anything else makes the whole answer content.
fn start(pending: &str, end: bool) -> Step {
    let undecided = || if end { Step::Content(pending.len(), State::Text) } else { Step::Wait(State::Start) };
    let text_only = Step::Content(pending.len(), State::Text);
    // The call's value must start at `at`, after an opener.
    let value_at = |at: usize, fenced: bool| match pending[at..].chars().next() {
        None => undecided(),
        Some('{' | '[') => json(Frame::Bare { fenced }, at),
        Some(_) => Step::Content(pending.len(), State::Text),
    };
    let n = ws_len(pending);
    let rest = &pending[n..];
    match rest.chars().next() {
        None => undecided(),
        Some('{' | '[') => json(Frame::Bare { fenced: false }, n),
        Some('<') => match (literal(rest, HERMES_OPEN), literal(rest, PYTHON_TAG)) {
            (Literal::Full, _) => Step::Drop(0, State::Opened { marker: Marker::Hermes, body: n + HERMES_OPEN.len() }),
            (_, Literal::Full) => {
                let at = n + PYTHON_TAG.len();
                value_at(at + ws_len(&pending[at..]), false)
            }
            (Literal::Partial, _) | (_, Literal::Partial) => undecided(),
            (Literal::No, Literal::No) => text_only,
        },
        Some('`') => match literal(rest, FENCE) {
            Literal::Partial => undecided(),
            Literal::No => text_only,
            Literal::Full => {
                let tag = &pending[n + FENCE.len()..];
                let tag_len = if tag.get(..4).is_some_and(|t| t.eq_ignore_ascii_case("json")) { 4 } else { 0 };
                if tag_len == 0 && tag.len() < 4 && "json".get(..tag.len()).is_some_and(|p| p.eq_ignore_ascii_case(tag))
                {
                    return undecided();
                }
                let at = n + FENCE.len() + tag_len;
                value_at(at + ws_len(&pending[at..]), true)
            }
        },
        Some(_) => text_only,
    }
}

/// Content watched for `marker`: what precedes it (less the whitespace just before it) or what
/// cannot be its start is released.
fn search(marker: Marker, pending: &str, end: bool) -> Step {
    let open = marker.text();
    let same = State::Search { marker, after_call: false };
    if let Some(at) = pending.find(open) {
        return match pending[..at].trim_end().len() {
            0 => Step::Drop(0, State::Opened { marker, body: at + open.len() }),
            content => Step::Content(content, same),
        };
    }
    if end {
        return Step::Content(pending.len(), State::Text);
    }
    let held = partial_suffix(pending, open);
    match pending[..pending.len() - held].trim_end().len() {
        0 => Step::Wait(same),
        content => Step::Content(content, same),
    }
}

/// A `<tool_call>` block that is not a call: content up to its `</tool_call>` (searched from `from`),
/// waiting for it if needed.
fn hermes_invalid(pending: &str, from: usize, end: bool, state: State) -> Step {
    match pending[from..].find(HERMES_CLOSE) {
        Some(at) => {
            Step::Content(from + at + HERMES_CLOSE.len(), State::Search { marker: Marker::Hermes, after_call: false })
        }
        None if end => Step::Content(pending.len(), State::Text),
        None => Step::Wait(state),
    }
}

/// After `[TOOL_CALLS]`, a name: `name([CALL_ID]id)?[ARGS]{...}`.
fn mistral_name(pending: &str, name: usize, end: bool, state: State) -> Step {
    let undecided = |state| if end { Step::Content(pending.len(), State::Text) } else { Step::Wait(state) };
    let name_end = name + pending[name..].find(|c| !is_name_char(c)).unwrap_or(pending.len() - name);
    let mut at = name_end;
    match literal(&pending[at..], MISTRAL_CALL_ID) {
        Literal::Full => {
            at += MISTRAL_CALL_ID.len();
            at += pending[at..].find(|c: char| !c.is_ascii_alphanumeric()).unwrap_or(pending.len() - at);
        }
        Literal::Partial => return undecided(state),
        Literal::No => {}
    }
    match literal(&pending[at..], MISTRAL_ARGS) {
        Literal::Partial => undecided(state),
        Literal::No => Step::Content(at, mistral_search()),
        Literal::Full => {
            let args = at + MISTRAL_ARGS.len();
            let start = args + ws_len(&pending[args..]);
            match pending[start..].chars().next() {
                None => undecided(state),
                Some('{') => json(Frame::MistralArgs { name: pending[name..name_end].to_owned() }, start),
                Some(_) => Step::Content(args, mistral_search()),
            }
        }
    }
}

/// A complete JSON value ending at `value_end` (`value`: `None` if `serde_json` rejected it).
fn json_done(
    state: State,
    value: Option<&Value>,
    value_end: usize,
    pending: &str,
    allowed: &Allowed,
    end: bool,
) -> Step {
    let State::Json { frame, .. } = &state else { unreachable!("json_done is only called in State::Json") };
    match frame {
        Frame::Hermes => {
            let call = value.and_then(|value| call::call(value, Framing::Marked, allowed));
            let close = value_end + ws_len(&pending[value_end..]);
            let after_close = close + HERMES_CLOSE.len();
            let after_call = State::Search { marker: Marker::Hermes, after_call: true };
            match (literal(&pending[close..], HERMES_CLOSE), call) {
                (Literal::Full, Some(call)) => Step::Calls(vec![call], after_close, after_call),
                (Literal::Full, None) => {
                    Step::Content(after_close, State::Search { marker: Marker::Hermes, after_call: false })
                }
                (Literal::Partial, _) if !end => Step::Wait(state),
                // The generation ended before the closing marker.
                (Literal::Partial, Some(call)) => Step::Calls(vec![call], pending.len(), State::Text),
                (Literal::Partial, None) => Step::Content(pending.len(), State::Text),
                // No closing marker: a valid call still counts, and what follows is read afresh.
                (Literal::No, Some(call)) => Step::Calls(vec![call], value_end, after_call),
                (Literal::No, None) => hermes_invalid(pending, value_end, end, state),
            }
        }
        Frame::MistralList => {
            let calls = value.and_then(|value| match value {
                Value::Array(values) => call::all_calls(values, Framing::Marked, allowed),
                value => call::call(value, Framing::Marked, allowed).map(|call| vec![call]),
            });
            match calls {
                Some(calls) => {
                    Step::Calls(calls, value_end, State::Search { marker: Marker::Mistral, after_call: true })
                }
                None => Step::Content(value_end, mistral_search()),
            }
        }
        Frame::MistralArgs { name } => match value.and_then(|value| call::named_call(name, value, allowed)) {
            Some(call) => {
                Step::Calls(vec![call], value_end, State::Search { marker: Marker::Mistral, after_call: true })
            }
            None => Step::Content(value_end, mistral_search()),
        },
        Frame::Bare { fenced } => {
            let Some(calls) = value.and_then(|value| call::bare_calls(value, allowed)) else {
                return Step::Content(pending.len(), State::Text);
            };
            if !fenced {
                return Step::Calls(calls, value_end, State::AfterBare);
            }
            let fence = value_end + ws_len(&pending[value_end..]);
            match literal(&pending[fence..], FENCE) {
                Literal::Full => Step::Calls(calls, fence + FENCE.len(), State::AfterBare),
                Literal::Partial if !end => Step::Wait(state),
                Literal::Partial => Step::Calls(calls, pending.len(), State::Text),
                Literal::No => Step::Calls(calls, value_end, State::AfterBare),
            }
        }
    }
}

fn json(frame: Frame, start: usize) -> Step {
    Step::Drop(0, json_state(frame, start))
}

fn json_state(frame: Frame, start: usize) -> State {
    State::Json { frame, start, scanner: JsonScanner::new() }
}

fn mistral_search() -> State {
    State::Search { marker: Marker::Mistral, after_call: false }
}

/// Characters of a function name in Mistral's `name[ARGS]` form.
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// Bytes of leading whitespace.
fn ws_len(text: &str) -> usize {
    text.len() - text.trim_start().len()
}

enum Literal {
    /// The text starts with the literal.
    Full,
    /// The text is a proper prefix of the literal (possibly empty): more text may complete it.
    Partial,
    No,
}

fn literal(text: &str, literal: &str) -> Literal {
    if text.starts_with(literal) {
        Literal::Full
    } else if literal.starts_with(text) {
        Literal::Partial
    } else {
        Literal::No
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals() {
        assert!(matches!(literal("</tool_call> x", HERMES_CLOSE), Literal::Full));
        assert!(matches!(literal("</to", HERMES_CLOSE), Literal::Partial));
        assert!(matches!(literal("", HERMES_CLOSE), Literal::Partial));
        assert!(matches!(literal("</x", HERMES_CLOSE), Literal::No));
    }
}
