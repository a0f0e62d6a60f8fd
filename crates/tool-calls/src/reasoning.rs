//! A reasoning model's thinking, split from its answer: `<think>...</think>` (Qwen3, QwQ,
//! DeepSeek-R1 and its distills, SmolLM3, ...).
//!
//! Whether a model reasons this way is read from its chat template (it writes `</think>`), and
//! whether the answer starts inside the thinking from the end of the rendered prompt:
//! DeepSeek-R1's templates open `<think>` in the generation prompt, and Qwen3's close an empty one
//! when thinking is off. Otherwise the model opens `<think>` itself, only at the very start of its answer
//! (after whitespace). Thinking is reported without the tags and the whitespace around it; what
//! follows `</think>` is the answer, whose leading whitespace is dropped. An answer cut inside
//! its thinking is all thinking. As with tool calls, the split never depends on how the text was
//! cut into pieces.

use crate::partial::partial_suffix;

/// The markers around a model's thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningFormat {
    pub open: &'static str,
    pub close: &'static str,
    /// What is written after thinking cut short (a thinking budget), for the answer to follow.
    pub resume: &'static str,
}

impl ReasoningFormat {
    pub const THINK: ReasoningFormat = ReasoningFormat { open: "<think>", close: "</think>", resume: "\n</think>\n\n" };

    /// gpt-oss's harmony: thinking is the `analysis` channel's message (its answers are read by
    /// [`HarmonyParser`](crate::HarmonyParser), not [`ReasoningSplitter`]).
    pub const HARMONY: ReasoningFormat = ReasoningFormat {
        open: "<|channel|>analysis<|message|>",
        close: "<|end|>",
        resume: "<|end|><|start|>assistant<|channel|>final<|message|>",
    };

    /// The format a chat template teaches, if it has one.
    pub fn detect(template_source: &str) -> Option<ReasoningFormat> {
        if crate::is_harmony(template_source) {
            return Some(Self::HARMONY);
        }
        template_source.contains(Self::THINK.close).then_some(Self::THINK)
    }

    pub fn is_harmony(&self) -> bool {
        *self == Self::HARMONY
    }

    /// What a thinking budget writes after thinking cut short when the answer is held to a call's
    /// grammar: harmony's next message opens without a header, which the grammar writes (a call
    /// or the final message); elsewhere the same as [`resume`](Self::resume).
    pub fn resume_for_calls(&self) -> &'static str {
        if self.is_harmony() {
            "<|end|><|start|>assistant"
        } else {
            self.resume
        }
    }

    /// Whether a prompt leaves the model inside its thinking: the generation prompt ends with the
    /// open marker (a `<think>` that a user wrote earlier in the conversation does not count).
    pub fn starts_inside(&self, prompt: &str) -> bool {
        prompt.trim_end().ends_with(self.open)
    }
}

/// What a constrained answer must be once the thinking is over.
#[derive(Debug, Clone, Copy)]
pub enum AnswerGrammar<'a> {
    /// A JSON schema (its text).
    JsonSchema(&'a str),
    /// A regular expression (the `regex` crate's syntax).
    Regex(&'a str),
    /// A Lark grammar whose first line is its `start` rule (the forced-call grammars).
    Lark(&'a str),
}

impl ReasoningFormat {
    /// A Lark grammar (llguidance's) that lets the model think first and then holds the answer
    /// to `answer`: free text up to the close marker (required when the prompt opened the
    /// thinking, optional otherwise), whitespace, then the answer. `None` for a Lark grammar that
    /// does not start with its `start` rule.
    pub fn then(&self, inside: bool, answer: AnswerGrammar<'_>) -> Option<String> {
        if self.is_harmony() {
            return harmony_then(answer);
        }
        let open = lark_string(self.open);
        let head =
            if inside { "start: thinking answer\n".to_owned() } else { format!("start: ({open} thinking)? answer\n") };
        let thinking = format!("thinking[stop={}]: /(?s:.*)/\n", lark_string(self.close));
        let answer = match answer {
            AnswerGrammar::JsonSchema(schema) => format!("answer: /[ \\t\\r\\n]*/ %json {schema}\n"),
            AnswerGrammar::Regex(regex) => {
                format!("answer: /[ \\t\\r\\n]*/ ANSWER\nANSWER: /{}/\n", escape_slashes(regex))
            }
            AnswerGrammar::Lark(grammar) => {
                let rest = grammar.strip_prefix("start:")?;
                format!("answer: /[ \\t\\r\\n]*/ answer_body\nanswer_body:{rest}")
            }
        };
        Some(format!("{head}{thinking}{answer}"))
    }
}

/// [`ReasoningFormat::then`] for harmony, whose markers are control tokens (named as such in
/// the grammar): an optional `analysis` message, then the answer as the `final` message. A Lark
/// answer (a forced call's grammar) writes its own message header.
fn harmony_then(answer: AnswerGrammar<'_>) -> Option<String> {
    let head = "start: thinking? answer\n\
                thinking: <|channel|> \"analysis\" <|message|> THINKING <|end|> <|start|> \"assistant\"\n\
                THINKING: /(?s:.*)/\n";
    let answer = match answer {
        AnswerGrammar::JsonSchema(schema) => format!("answer: <|channel|> \"final\" <|message|> %json {schema}\n"),
        AnswerGrammar::Regex(regex) => {
            format!("answer: <|channel|> \"final\" <|message|> ANSWER\nANSWER: /{}/\n", escape_slashes(regex))
        }
        AnswerGrammar::Lark(grammar) => format!("answer: answer_body\nanswer_body:{}", grammar.strip_prefix("start:")?),
    };
    Some(format!("{head}{answer}"))
}

/// A Lark string literal.
fn lark_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// A regex inside Lark's `/.../`: its unescaped slashes escaped.
fn escape_slashes(regex: &str) -> String {
    let mut out = String::with_capacity(regex.len());
    let mut escaped = false;
    for c in regex.chars() {
        if c == '/' && !escaped {
            out.push('\\');
        }
        escaped = c == '\\' && !escaped;
        out.push(c);
    }
    out
}

/// A piece of the answer, on one side of the split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Split {
    Reasoning(String),
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: the model may still open its thinking.
    Start,
    /// Inside the thinking; `fresh` until its first non-whitespace text.
    Thinking { fresh: bool },
    /// After the thinking; `fresh` until the answer's first non-whitespace text.
    Answer { fresh: bool },
}

/// Splits a streamed answer into thinking and content.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    format: ReasoningFormat,
    state: State,
    /// Text held back: what may be the start of a marker, or whitespace that may end the thinking.
    held: String,
}

impl ReasoningSplitter {
    /// `inside`: the prompt already opened the thinking ([`ReasoningFormat::starts_inside`]).
    pub fn new(format: ReasoningFormat, inside: bool) -> Self {
        let state = if inside { State::Thinking { fresh: true } } else { State::Start };
        ReasoningSplitter { format, state, held: String::new() }
    }

    pub fn push(&mut self, text: &str) -> Vec<Split> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.held.trim_start();
                    if trimmed.is_empty() {
                        return out;
                    }
                    if let Some(rest) = trimmed.strip_prefix(self.format.open) {
                        self.held = rest.to_owned();
                        self.state = State::Thinking { fresh: true };
                    } else if self.format.open.starts_with(trimmed) {
                        return out; // maybe the marker, cut short
                    } else {
                        self.state = State::Answer { fresh: false };
                    }
                }
                State::Thinking { fresh } => {
                    if fresh {
                        let trimmed = self.held.trim_start().len();
                        self.held.drain(..self.held.len() - trimmed);
                        if self.held.is_empty() {
                            return out;
                        }
                        self.state = State::Thinking { fresh: false };
                    }
                    match self.held.find(self.format.close) {
                        Some(at) => {
                            let thought = self.held[..at].trim_end().to_owned();
                            emit(&mut out, Split::Reasoning(thought));
                            self.held.drain(..at + self.format.close.len());
                            self.state = State::Answer { fresh: true };
                        }
                        None => {
                            // Keep back a possible start of the close marker, and trailing
                            // whitespace (it is dropped if the marker follows).
                            let keep = partial_suffix(&self.held, self.format.close);
                            let body = &self.held[..self.held.len() - keep];
                            let ready = body.trim_end().len();
                            emit(&mut out, Split::Reasoning(self.held[..ready].to_owned()));
                            self.held.drain(..ready);
                            return out;
                        }
                    }
                }
                State::Answer { fresh } => {
                    if fresh {
                        let trimmed = self.held.trim_start().len();
                        self.held.drain(..self.held.len() - trimmed);
                        if self.held.is_empty() {
                            return out;
                        }
                        self.state = State::Answer { fresh: false };
                    }
                    emit(&mut out, Split::Content(std::mem::take(&mut self.held)));
                    return out;
                }
            }
        }
    }

    /// The end of the answer: what is held is released (thinking cut short stays thinking).
    pub fn finish(&mut self) -> Vec<Split> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.state {
            State::Start => emit(&mut out, Split::Content(held)),
            State::Thinking { .. } => emit(&mut out, Split::Reasoning(held.trim_end().to_owned())),
            State::Answer { fresh } => {
                emit(&mut out, Split::Content(if fresh { held.trim_start().to_owned() } else { held }))
            }
        }
        out
    }

    /// A whole answer split at once: (thinking, content).
    pub fn split(format: ReasoningFormat, inside: bool, text: &str) -> (String, String) {
        let mut s = ReasoningSplitter::new(format, inside);
        let mut parts = s.push(text);
        parts.extend(s.finish());
        let (mut reasoning, mut content) = (String::new(), String::new());
        for p in parts {
            match p {
                Split::Reasoning(t) => reasoning.push_str(&t),
                Split::Content(t) => content.push_str(&t),
            }
        }
        (reasoning, content)
    }
}

fn emit(out: &mut Vec<Split>, split: Split) {
    match &split {
        Split::Reasoning(t) | Split::Content(t) if t.is_empty() => {}
        _ => out.push(split),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: ReasoningFormat = ReasoningFormat::THINK;

    /// Every way of cutting `text` in two, and one piece per character, gives the same split.
    fn same_split_however_cut(inside: bool, text: &str) -> (String, String) {
        let whole = ReasoningSplitter::split(F, inside, text);
        let cuts: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        for &i in &cuts {
            let mut s = ReasoningSplitter::new(F, inside);
            let mut parts = s.push(&text[..i]);
            parts.extend(s.push(&text[i..]));
            parts.extend(s.finish());
            assert_eq!(join(parts), whole, "cut at {i} of {text:?}");
        }
        let mut s = ReasoningSplitter::new(F, inside);
        let mut parts = Vec::new();
        for c in text.chars() {
            parts.extend(s.push(&c.to_string()));
        }
        parts.extend(s.finish());
        assert_eq!(join(parts), whole, "char by char: {text:?}");
        whole
    }

    fn join(parts: Vec<Split>) -> (String, String) {
        let (mut r, mut c) = (String::new(), String::new());
        for p in parts {
            match p {
                Split::Reasoning(t) => r.push_str(&t),
                Split::Content(t) => c.push_str(&t),
            }
        }
        (r, c)
    }

    fn pair(r: &str, c: &str) -> (String, String) {
        (r.to_owned(), c.to_owned())
    }

    #[test]
    fn thinking_is_split_from_the_answer() {
        assert_eq!(
            same_split_however_cut(false, "<think>\nLet me see.\n</think>\n\nParis."),
            pair("Let me see.", "Paris.")
        );
        assert_eq!(same_split_however_cut(false, "  <think>a < b</think>yes"), pair("a < b", "yes"));
        // Opened by the prompt (DeepSeek-R1): the answer starts inside.
        assert_eq!(same_split_however_cut(true, "First, 2+2.\n\n</think>\n\n4"), pair("First, 2+2.", "4"));
        // No thinking at all.
        assert_eq!(
            same_split_however_cut(false, "Just an answer, with <think> inside."),
            pair("", "Just an answer, with <think> inside.")
        );
        assert_eq!(same_split_however_cut(false, "<thin"), pair("", "<thin"));
        // Cut by the length limit inside the thinking.
        assert_eq!(same_split_however_cut(true, "still thinking about é  "), pair("still thinking about é", ""));
        assert_eq!(same_split_however_cut(false, "<think>a</think>"), pair("a", ""));
        assert_eq!(same_split_however_cut(false, ""), pair("", ""));
    }

    #[test]
    fn constrained_answers_come_after_the_thinking() {
        let g = F.then(true, AnswerGrammar::JsonSchema(r#"{"type":"boolean"}"#)).unwrap();
        assert!(g.starts_with("start: thinking answer\nthinking[stop=\"</think>\"]"), "{g}");
        assert!(g.ends_with("%json {\"type\":\"boolean\"}\n"), "{g}");
        let g = F.then(false, AnswerGrammar::Regex("a/b\\/c")).unwrap();
        assert!(g.starts_with("start: (\"<think>\" thinking)? answer\n") && g.contains(r"ANSWER: /a\/b\/c/"), "{g}");
        let g = F.then(true, AnswerGrammar::Lark("start: call\ncall: %json {}\n")).unwrap();
        assert!(g.contains("answer_body: call\ncall: %json {}\n"), "{g}");
        assert!(F.then(true, AnswerGrammar::Lark("// a comment\nstart: x")).is_none());
    }

    #[test]
    fn prompts_and_templates_say_where_the_answer_starts() {
        assert_eq!(ReasoningFormat::detect("{{ '<think>' }}...{{ '</think>' }}"), Some(F));
        assert_eq!(ReasoningFormat::detect("<|im_start|>assistant"), None);
        assert!(F.starts_inside("<|im_start|>assistant\n<think>\n"));
        assert!(!F.starts_inside("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "thinking turned off");
        assert!(!F.starts_inside("<|im_start|>assistant\n"));
        assert!(!F.starts_inside("<|im_start|>user\nwhat does <think> do?<|im_end|>\n<|im_start|>assistant\n"));
    }
}
