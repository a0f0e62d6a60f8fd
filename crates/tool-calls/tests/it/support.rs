//! Helpers: expected outputs, and the check that streaming agrees with `parse` however the text is split.

use llmr_tool_calls::{ParsedCall, ParsedOutput, StreamEvent, StreamParser, ToolCallFormat};

pub const TOOLS: &[&str] = &["get_weather", "get_time"];

pub fn call(name: &str, arguments: &str) -> ParsedCall {
    ParsedCall { name: name.to_owned(), arguments: arguments.to_owned() }
}

pub fn output(content: &str, calls: Vec<ParsedCall>) -> ParsedOutput {
    ParsedOutput { content: content.to_owned(), calls }
}

/// Only content: the text comes back unchanged.
pub fn text_only(text: &str) -> ParsedOutput {
    output(text, Vec::new())
}

/// Asserts that `parse` gives `expected`, and so does streaming the text in any of many splits.
pub fn check(format: ToolCallFormat, text: &str, expected: &ParsedOutput) {
    check_with(format, TOOLS, "", text, expected);
}

/// [`check`] with the tools offered and a prefill.
pub fn check_with(format: ToolCallFormat, allowed: &[&str], prefill: &str, text: &str, expected: &ParsedOutput) {
    let parsed = format.parse_with_prefill(prefill, text, allowed);
    assert_eq!(&parsed, expected, "parse ({format:?}) of {text:?}");
    let chars = text.char_indices().map(|(at, c)| &text[at..at + c.len_utf8()]).collect();
    let mut splits = vec![("characters", chars), ("tokens", tokens(text))];
    for at in (1..text.len()).filter(|&at| text.is_char_boundary(at)) {
        splits.push(("two pieces", vec![&text[..at], &text[at..]]));
    }
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for _ in 0..20 {
        splits.push(("random pieces", random_pieces(text, &mut seed)));
    }
    for (how, pieces) in splits {
        let events = stream(format, allowed, prefill, &pieces);
        let streamed: ParsedOutput = events.iter().cloned().collect();
        assert_eq!(&streamed, expected, "{format:?} streamed as {how}: {pieces:?}");
    }
}

/// Streams `pieces` and returns every event, checking the events' own invariants on the way.
pub fn stream(format: ToolCallFormat, allowed: &[&str], prefill: &str, pieces: &[&str]) -> Vec<StreamEvent> {
    let allowed = allowed.iter().map(|name| (*name).to_owned()).collect();
    let mut parser = StreamParser::new(format, allowed).with_prefill(prefill);
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(parser.push(piece));
    }
    events.extend(parser.finish());
    let mut next_index = 0;
    for event in &events {
        match event {
            StreamEvent::Content(content) => assert!(!content.is_empty(), "empty content event in {events:?}"),
            StreamEvent::Call { index, .. } => {
                assert_eq!(*index, next_index, "call indices count from 0: {events:?}");
                next_index += 1;
            }
        }
    }
    events
}

/// Splits like a BPE tokenizer roughly does: special markers whole, words with their leading space,
/// runs of whitespace, and punctuation one or two characters at a time.
pub fn tokens(text: &str) -> Vec<&str> {
    const SPECIAL: &[&str] =
        &["<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_tag|>", "```"];
    let mut pieces = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let len = if let Some(special) = SPECIAL.iter().find(|s| rest.starts_with(**s)) {
            special.len()
        } else {
            let first = rest.chars().next().unwrap();
            let word = |c: char| c.is_alphanumeric() || c == '_';
            if first.is_whitespace() && !rest[first.len_utf8()..].starts_with(word) {
                rest.find(|c: char| !c.is_whitespace()).unwrap_or(rest.len())
            } else if word(first) || first == ' ' {
                let from = first.len_utf8();
                from + rest[from..].find(|c: char| !word(c)).unwrap_or(rest.len() - from)
            } else {
                rest.char_indices().nth(2).map_or(rest.len(), |(at, _)| at)
            }
        };
        pieces.push(&rest[..len]);
        rest = &rest[len..];
    }
    pieces
}

/// Pieces of 1 to 6 characters, from a simple deterministic generator.
fn random_pieces<'a>(text: &'a str, seed: &mut u64) -> Vec<&'a str> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let chars = 1 + (*seed % 6) as usize;
        let len = rest.char_indices().nth(chars).map_or(rest.len(), |(at, _)| at);
        pieces.push(&rest[..len]);
        rest = &rest[len..];
    }
    pieces
}
