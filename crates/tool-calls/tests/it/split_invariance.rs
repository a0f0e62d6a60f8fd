//! Generated texts mixing markers, JSON and prose: however they are split, streaming gives what
//! `parse` gives (and nothing panics).

use llmr_tool_calls::ParsedOutput;
use llmr_tool_calls::ToolCallFormat::{Hermes, Llama3, Mistral, MistralArgs, PlainJson};

use crate::support::{stream, tokens, TOOLS};

const FRAGMENTS: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]x1",
    "<|python_tag|>",
    "```json",
    "```",
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
    "{\"name\": \"get_time\", \"parameters\": {}}",
    "{\"name\": \"nope\", \"arguments\": {}}",
    "{\"name\": ",
    "\"get_time\"",
    "get_weather",
    "{",
    "}",
    "[",
    "]",
    ";",
    ",",
    "\"",
    "\\",
    " ",
    "\n",
    "<",
    "Hello",
    "é日🎉",
];

#[test]
fn streaming_agrees_with_parse_on_generated_texts() {
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut calls_seen = 0;
    for _ in 0..1500 {
        let count = 1 + next() % 12;
        let text: String = (0..count).map(|_| FRAGMENTS[(next() % FRAGMENTS.len() as u64) as usize]).collect();
        for format in [Hermes, Llama3, Mistral, MistralArgs, PlainJson] {
            let parsed = format.parse(&text, TOOLS);
            calls_seen += parsed.calls.len();
            let chars: Vec<&str> = text.char_indices().map(|(at, c)| &text[at..at + c.len_utf8()]).collect();
            for pieces in [chars, tokens(&text)] {
                let streamed: ParsedOutput = stream(format, TOOLS, "", &pieces).into_iter().collect();
                assert_eq!(streamed, parsed, "{format:?} on {text:?} split as {pieces:?}");
            }
        }
    }
    // The generator must reach calls, not only content.
    assert!(calls_seen > 150, "only {calls_seen} calls in the generated texts");
}
