//! Constrained decoding on real models: SmolLM2 (byte-level BPE) and Gemma 3 (SentencePiece with
//! byte fallback) confined to JSON schemas and a regex, greedy and sampled.

use crate::support::{cached_model, engine, spec};
use llmr_engine_host::{Constraint, EngineInstance, EngineStatus, FinishReason, InferParams, InferResult, Sampling};
use serde_json::Value;
use std::sync::OnceLock;

const ASK: &str =
    "<|im_start|>user\nDescribe a person who lives in a European capital, as JSON.<|im_end|>\n<|im_start|>assistant\n";

/// Bounded, so that every draw can end well within the token budget.
const PERSON: &str = r#"{"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"enum": ["Paris", "Berlin", "Rome", "Madrid"]},
    "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}},
  "required": ["name", "age", "city", "languages"], "additionalProperties": false}"#;

fn smollm2() -> &'static EngineInstance {
    static E: OnceLock<EngineInstance> = OnceLock::new();
    E.get_or_init(|| {
        let e = engine(4);
        e.load_model(&spec("smollm2", &cached_model("smollm2-hf"))).unwrap();
        e
    })
}

fn params(id: u64, model: &'static str, prompt: &'static str, sampling: Sampling) -> InferParams<'static> {
    InferParams::new(id, model, prompt, sampling)
}

fn run(e: &EngineInstance, p: &InferParams<'_>) -> (String, InferResult) {
    let mut text = String::new();
    let res = e.infer(p, |t| {
        text.push_str(&t.text);
        true
    });
    (text, res.unwrap())
}

fn schema() -> Option<Constraint> {
    Some(Constraint::JsonSchema(PERSON.into()))
}

/// The document parses and every field is what the schema says.
fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?} does not parse: {e}"));
    let o = v.as_object().unwrap_or_else(|| panic!("{text:?}"));
    assert_eq!(o.len(), 4, "{text}");
    assert!(o["name"].as_str().is_some_and(|n| n.chars().count() <= 24), "{text}");
    assert!(o["age"].as_u64().is_some_and(|a| a <= 120), "{text}");
    assert!(["Paris", "Berlin", "Rome", "Madrid"].contains(&o["city"].as_str().unwrap_or_default()), "{text}");
    let langs = o["languages"].as_array().unwrap_or_else(|| panic!("{text}"));
    assert!(langs.len() <= 3 && langs.iter().all(|l| l.is_string()), "{text}");
}

#[test]
fn greedy_and_sampled_answers_follow_the_schema_and_end_where_it_does() {
    let e = smollm2();
    let greedy = Sampling { max_tokens: Some(160), constraint: schema(), ..Sampling::greedy() };
    let (text, res) = run(e, &params(1, "smollm2", ASK, greedy));
    check_person(&text);
    assert_eq!(res.finish_reason, FinishReason::Stop, "{text}");
    // A hot temperature is where unconstrained small models stop writing JSON.
    for seed in 0..6 {
        let hot = Sampling {
            max_tokens: Some(160),
            temperature: 1.5,
            seed: Some(seed),
            constraint: schema(),
            ..Sampling::default()
        };
        let (text, res) = run(e, &params(10 + seed, "smollm2", ASK, hot));
        assert_eq!(res.finish_reason, FinishReason::Stop, "seed {seed}: {text}");
        check_person(&text);
    }
}

#[test]
fn a_regex_confines_the_answer_and_a_cut_answer_says_length() {
    let e = smollm2();
    let prompt =
        "<|im_start|>user\nIs Paris the capital of France? Answer yes or no.<|im_end|>\n<|im_start|>assistant\n";
    let yes_no =
        Sampling { max_tokens: Some(8), constraint: Some(Constraint::Regex("(yes|no)".into())), ..Sampling::greedy() };
    let (text, res) = run(e, &params(30, "smollm2", prompt, yes_no));
    assert!(text == "yes" || text == "no", "{text:?}");
    assert_eq!(res.finish_reason, FinishReason::Stop);
    let cut = Sampling { max_tokens: Some(3), constraint: schema(), ..Sampling::greedy() };
    let (text, res) = run(e, &params(31, "smollm2", ASK, cut));
    assert_eq!((res.finish_reason, res.completion_tokens), (FinishReason::Length, 3), "{text}");
    assert!(text.starts_with('{'), "{text:?}");
}

#[test]
fn a_grammar_that_does_not_compile_is_unsupported_and_says_why() {
    let e = smollm2();
    let bad =
        Sampling { constraint: Some(Constraint::JsonSchema(r#"{"type": "nonsense"}"#.into())), ..Sampling::greedy() };
    let err = e.infer(&params(40, "smollm2", ASK, bad), |_| true).unwrap_err();
    assert_eq!(err.status, EngineStatus::Unsupported);
    assert!(err.message.contains("nonsense"), "{}", err.message);
    // The model still serves.
    let ok = Sampling { max_tokens: Some(4), ..Sampling::greedy() };
    assert_eq!(run(e, &params(41, "smollm2", ASK, ok)).1.completion_tokens, 4);
}

#[test]
fn a_constrained_neighbour_leaves_a_free_sequence_unchanged() {
    let e = smollm2();
    let story = "Once upon a time, in a small village,";
    let free = || Sampling { max_tokens: Some(24), ..Sampling::greedy() };
    let (alone, _) = run(e, &params(50, "smollm2", story, free()));
    let (together, json) = std::thread::scope(|s| {
        let a = s.spawn(|| run(e, &params(51, "smollm2", story, free())).0);
        let b = s.spawn(|| {
            let c = Sampling { max_tokens: Some(160), constraint: schema(), ..Sampling::greedy() };
            run(e, &params(52, "smollm2", ASK, c)).0
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(alone, together);
    check_person(&json);
}

#[test]
fn gemma3_byte_fallback_vocabulary_writes_valid_json() {
    let e = engine(2);
    e.load_model(&spec("gemma3", &cached_model("gemma3-hf"))).unwrap();
    let prompt = "A person, described as JSON:\n";
    for (i, temperature) in [0.0f32, 1.2].into_iter().enumerate() {
        let s =
            Sampling { max_tokens: Some(160), temperature, seed: Some(7), constraint: schema(), ..Sampling::default() };
        let (text, res) = run(&e, &params(60 + i as u64, "gemma3", prompt, s));
        assert_eq!(res.finish_reason, FinishReason::Stop, "{text}");
        check_person(&text);
    }
}
