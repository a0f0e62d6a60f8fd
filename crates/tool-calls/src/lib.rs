//! Finds tool calls in the text a model generates, so that the node can answer with `tool_calls`
//! (finish reason `tool_calls`), streamed or not, and (`reasoning.rs`) a reasoning model's
//! thinking, split from its answer. Plain domain types only: the OpenAI wire types live in the
//! `openai` crate.
//!
//! # Formats
//! Models write calls in the format their chat template teaches; [`ToolCallFormat::detect`] reads it
//! from the template source:
//! - [`Hermes`](ToolCallFormat::Hermes) (Qwen2.5+, Hermes, GLM, Granite, ...): content, then one or
//!   more `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks;
//! - [`Llama3`](ToolCallFormat::Llama3): the whole answer is `{"name": ..., "parameters": {...}}`,
//!   optionally after `<|python_tag|>`, several separated by `;`;
//! - [`Mistral`](ToolCallFormat::Mistral) / [`MistralArgs`](ToolCallFormat::MistralArgs): content, then
//!   `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` or `[TOOL_CALLS]name[ARGS]{...}` (both are
//!   read either way);
//! - [`Harmony`](ToolCallFormat::Harmony) (gpt-oss): a `commentary` message `to=functions.NAME`,
//!   read with the thinking and the answer by [`HarmonyParser`] (`harmony.rs`);
//! - [`PlainJson`](ToolCallFormat::PlainJson), when the template gives no hint: the whole answer
//!   (optionally in a ```` ```json ```` fence) is a call object, an array of them, or
//!   `{"tool_calls": [...]}`.
//!
//! A call is kept only if its JSON is valid, it names a tool offered with the request, and (for bare
//! JSON, which could be an ordinary answer) it has `arguments` or `parameters`. Anything else stays
//! content: no text is ever dropped, except the framing of accepted calls (markers, separators and
//! the whitespace next to them). Arguments are returned as compact JSON text in the model's key order.
//!
//! # Streaming
//! A [`StreamParser`] is fed the generated pieces with [`push`](StreamParser::push) and returns
//! [`StreamEvent`]s. Content that cannot be the start of a call is released at once (plain chat still
//! streams token by token; only whitespace that might precede a call waits for the next piece); text
//! that might open a call is held until decided; a call is released whole, as one
//! [`StreamEvent::Call`], once complete. [`finish`](StreamParser::finish) flushes what is held: an
//! unterminated or invalid call becomes content. The result never depends on how the text was split:
//! [`ToolCallFormat::parse`] is the same machine fed the whole text at once.
//!
//! # Forcing a call, enforcing a schema
//! For `tool_choice` `"required"` or a named function, an engine with constrained decoding runs
//! [`ToolCallFormat::forced_call_grammar`]; for `strict` tools under `auto`,
//! [`ToolCallFormat::auto_call_grammar`] (free text until a call opens, then its schema). Where the
//! engine cannot, [`ToolCallFormat::forced_prefix`] gives the text to append to the prompt so that
//! the model can only continue a call; the parser must be told ([`StreamParser::with_prefill`],
//! [`ToolCallFormat::parse_with_prefill`]).
#![forbid(unsafe_code)]

mod call;
mod format;
mod grammar;
mod harmony;
mod json_scan;
mod partial;
mod reasoning;
mod stream;

pub use format::ToolCallFormat;
pub use grammar::ToolSchema;
pub use harmony::{is_harmony, HarmonyEvent, HarmonyParser};
pub use reasoning::{AnswerGrammar, ReasoningFormat, ReasoningSplitter, Split};
pub use stream::StreamParser;

/// A tool call found in the generated text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function's name, one of the offered tools.
    pub name: String,
    /// The arguments as compact JSON text (normally an object), as OpenAI's `arguments` carries them.
    pub arguments: String,
}

/// A whole generation split into content and calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedOutput {
    /// Everything that is not a call, in order (empty when the answer is only calls).
    pub content: String,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
}

/// What a [`StreamParser`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// Content to send now.
    Content(String),
    /// A complete call; `index` counts calls from 0 in the order they were made.
    Call { index: usize, call: ParsedCall },
}

/// Collects a stream's events into the whole output.
impl FromIterator<StreamEvent> for ParsedOutput {
    fn from_iter<I: IntoIterator<Item = StreamEvent>>(events: I) -> Self {
        let mut output = ParsedOutput::default();
        for event in events {
            match event {
                StreamEvent::Content(content) => output.content.push_str(&content),
                StreamEvent::Call { call, .. } => output.calls.push(call),
            }
        }
        output
    }
}
