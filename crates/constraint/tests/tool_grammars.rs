//! The tool-call grammars of `llmr-tool-calls`, compiled for real: strict tools under
//! `tool_choice: auto` (free text, then calls under their schemas wherever the model opens one)
//! and gpt-oss's harmony messages, whose markers are control tokens.

use llmr_constraint::{Constraint, TokenBytes, TokenMask, Vocabulary};
use llmr_tool_calls::{AnswerGrammar, ReasoningFormat, ToolCallFormat, ToolSchema};
use serde_json::{json, Value};

const HARMONY: [&str; 5] = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"];

/// Every byte, harmony's control tokens, and the end token (last).
fn vocabulary() -> (Vocabulary, Vec<TokenBytes>) {
    let mut tokens: Vec<TokenBytes> = (0..=255u8).map(|b| TokenBytes::Text(vec![b])).collect();
    for s in HARMONY {
        tokens.push(TokenBytes::Special(s.into()));
    }
    tokens.push(TokenBytes::Special("<|return|>".into()));
    let end = tokens.len() as u32 - 1;
    (Vocabulary::new(tokens.clone(), &[end]).unwrap(), tokens)
}

fn special(name: &str) -> u32 {
    256 + HARMONY.iter().position(|s| *s == name).unwrap() as u32
}

fn end_id(tokens: &[TokenBytes]) -> u32 {
    tokens.len() as u32 - 1
}

/// The allowed tokens now.
fn allowed(mask: &mut TokenMask, n: usize) -> Vec<u32> {
    let mut logits = Vec::new();
    mask.apply(&vec![0.0; n], &mut logits).unwrap();
    (0..n as u32).filter(|&i| logits[i as usize].is_finite()).collect()
}

/// Writes `text` (control tokens as `<|...|>`, everything else byte by byte); how many bytes
/// of it the grammar took before refusing a token (all of it: `text.len()`).
fn write(mask: &mut TokenMask, tokens: &[TokenBytes], text: &str) -> usize {
    let mut at = 0;
    while at < text.len() {
        let (token, len) = match HARMONY.iter().find(|s| text[at..].starts_with(**s)) {
            Some(s) => (special(s), s.len()),
            None => (text.as_bytes()[at] as u32, 1),
        };
        if !allowed(mask, tokens.len()).contains(&token) {
            return at;
        }
        mask.accept(token).unwrap();
        at += len;
    }
    at
}

/// Whether the grammar takes the whole of `text` and may end there.
fn takes_and_ends(grammar: &str, text: &str) -> bool {
    let (vocab, tokens) = vocabulary();
    let mut mask = vocab.compile(&Constraint::Lark(grammar.into())).unwrap_or_else(|e| panic!("{e}\n{grammar}"));
    write(&mut mask, &tokens, text) == text.len() && allowed(&mut mask, tokens.len()).contains(&end_id(&tokens))
}

/// How much of `text` the grammar takes.
fn taken(grammar: &str, text: &str) -> usize {
    let (vocab, tokens) = vocabulary();
    let mut mask = vocab.compile(&Constraint::Lark(grammar.into())).unwrap();
    write(&mut mask, &tokens, text)
}

fn weather() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false})
}

#[test]
fn strict_hermes_calls_under_auto_leave_text_free_and_hold_calls_to_their_schema() {
    let params = weather();
    let tools =
        [ToolSchema { name: "get_weather", parameters: Some(&params) }, ToolSchema { name: "ping", parameters: None }];
    let single = ToolCallFormat::Hermes.auto_call_grammar(&tools, false).unwrap();
    let parallel = ToolCallFormat::Hermes.auto_call_grammar(&tools, true).unwrap();
    let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    for g in [&single, &parallel] {
        assert!(takes_and_ends(g, "Paris is sunny today, {probably} <b>warm</b>."), "{g}");
        assert!(takes_and_ends(g, ""), "an empty answer");
        assert!(takes_and_ends(g, call), "{g}");
        assert!(takes_and_ends(g, &format!("Let me check.\n{call}\nDone.")), "{g}");
        assert!(takes_and_ends(g, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {\"any\": [1]}}\n</tool_call>"));
        // Once opened, a call holds to the offered names and to the tool's schema.
        let open = "Sure <tool_call>\n{\"name\": \"";
        assert_eq!(taken(g, &format!("{open}nope")), open.len());
        let args = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"";
        assert_eq!(taken(g, &format!("{args}town\": 1}}")), args.len());
    }
    // Qwen2.5 often writes a bare JSON call: an answer that opens as an object is one.
    let bare = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}";
    assert!(takes_and_ends(&single, bare), "{single}");
    assert_eq!(taken(&single, "{\"answer\": 1}"), 2);
    // One call when calls are not parallel; several when they are.
    assert!(takes_and_ends(&parallel, &format!("{call}\n{call}")));
    assert!(!takes_and_ends(&single, &format!("{call}\n{call}")));
    assert_eq!(ToolCallFormat::Mistral.auto_call_grammar(&tools, true), None);
}

#[test]
fn strict_bare_json_calls_under_auto_are_the_whole_answer_or_nothing() {
    let params = weather();
    let tools = [ToolSchema { name: "get_weather", parameters: Some(&params) }];
    let plain = ToolCallFormat::PlainJson.auto_call_grammar(&tools, true).unwrap();
    assert!(takes_and_ends(&plain, "The weather is fine."));
    assert!(takes_and_ends(&plain, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}"));
    // An answer that opens as a call is one.
    assert_eq!(taken(&plain, "{\"answer\": 1}"), 2);
    assert!(!takes_and_ends(&plain, "  {\"answer\": 1}"));
    let llama = ToolCallFormat::Llama3.auto_call_grammar(&tools, true).unwrap();
    let call = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}";
    assert!(takes_and_ends(&llama, &format!("{call}; {call}")));
}

#[test]
fn harmony_calls_are_commentary_messages_after_optional_thinking() {
    let params = weather();
    let tools =
        [ToolSchema { name: "get_weather", parameters: Some(&params) }, ToolSchema { name: "ping", parameters: None }];
    let wrap = |g: String| ReasoningFormat::HARMONY.then(false, AnswerGrammar::Lark(&g)).unwrap();
    let forced = wrap(ToolCallFormat::Harmony.forced_call_grammar(&tools, None, true).unwrap());
    let call = " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}";
    let thinking = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant";
    assert!(takes_and_ends(&forced, call), "{forced}");
    assert!(takes_and_ends(&forced, &format!("{thinking}{call}")), "{forced}");
    assert!(!takes_and_ends(&forced, "<|channel|>final<|message|>It is sunny."), "a forced call is a call");
    let named = wrap(ToolCallFormat::Harmony.forced_call_grammar(&tools, Some("ping"), true).unwrap());
    assert!(!takes_and_ends(&named, call));

    let auto = wrap(ToolCallFormat::Harmony.auto_call_grammar(&tools, true).unwrap());
    assert!(takes_and_ends(&auto, &format!("{thinking}<|channel|>final<|message|>It is sunny.")));
    assert!(takes_and_ends(&auto, &format!("{thinking}{call}")));
    let bad = " to=functions.get_weather<|channel|>commentary json<|message|>{\"";
    assert_eq!(taken(&auto, &format!("{bad}town\": 1}}")), bad.len());
}

#[test]
fn a_harmony_answer_under_a_schema_is_the_final_message() {
    let g = ReasoningFormat::HARMONY.then(false, AnswerGrammar::JsonSchema(r#"{"type":"boolean"}"#)).unwrap();
    assert!(takes_and_ends(&g, "<|channel|>final<|message|>true"), "{g}");
    assert!(takes_and_ends(
        &g,
        "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final<|message|>false"
    ));
    assert!(!takes_and_ends(&g, "<|channel|>final<|message|>yes"));
    let g = ReasoningFormat::HARMONY.then(false, AnswerGrammar::Regex("[0-9]{2}")).unwrap();
    assert!(takes_and_ends(&g, "<|channel|>final<|message|>42"));
}
