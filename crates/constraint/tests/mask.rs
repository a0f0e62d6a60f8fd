//! The masks of real grammars over a small byte-level vocabulary, followed by random draws: what
//! comes out is always in the grammar, and ends only where the grammar does.

use llmr_constraint::{Constraint, TokenBytes, TokenMask, Vocabulary};

/// Every byte, a few multi-byte tokens that cross JSON's structure, one special token that no
/// grammar names, and the end token (last).
fn vocabulary() -> (Vocabulary, Vec<TokenBytes>) {
    let mut tokens: Vec<TokenBytes> = (0..=255u8).map(|b| TokenBytes::Text(vec![b])).collect();
    for w in ["{\"", "\": ", "\", \"", "true", "false", "null", "name", "age", "12", "\"}", "yes", "no", " "] {
        tokens.push(TokenBytes::Text(w.as_bytes().to_vec()));
    }
    tokens.push(TokenBytes::Special("<|tool|>".into()));
    tokens.push(TokenBytes::Unused);
    tokens.push(TokenBytes::Special("<|end|>".into()));
    let end = tokens.len() as u32 - 1;
    (Vocabulary::new(tokens.clone(), &[end]).unwrap(), tokens)
}

fn end_id(tokens: &[TokenBytes]) -> u32 {
    tokens.len() as u32 - 1
}

/// Draws from random logits under the mask until an end token or `limit` tokens; returns the
/// text and whether it ended.
fn generate(mask: &mut TokenMask, tokens: &[TokenBytes], rng: &mut fastrand::Rng, limit: usize) -> (String, bool) {
    let mut out = Vec::new();
    for _ in 0..limit {
        let raw: Vec<f32> = (0..tokens.len()).map(|_| rng.f32() * 8.0).collect();
        let mut logits = Vec::new();
        mask.apply(&raw, &mut logits).unwrap();
        assert!(logits.iter().zip(&raw).all(|(m, r)| m == r || *m == f32::NEG_INFINITY), "kept logits are unchanged");
        let allowed: Vec<usize> = (0..logits.len()).filter(|&i| logits[i].is_finite()).collect();
        assert!(!allowed.is_empty(), "the mask left no token after {:?}", String::from_utf8_lossy(&out));
        let token = allowed[rng.usize(..allowed.len())] as u32;
        mask.accept(token).unwrap();
        match &tokens[token as usize] {
            TokenBytes::Text(b) => out.extend_from_slice(b),
            TokenBytes::Special(_) if token == end_id(tokens) => return (String::from_utf8(out).unwrap(), true),
            other => panic!("the mask allowed {other:?}"),
        }
    }
    (String::from_utf8(out).unwrap(), false)
}

#[test]
fn random_draws_under_a_json_schema_give_valid_documents() {
    let (vocab, tokens) = vocabulary();
    let schema = r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 150}, "ok": {"type": "boolean"}}, "required": ["name", "age", "ok"],
        "additionalProperties": false}"#;
    let mut rng = fastrand::Rng::with_seed(7);
    let mut ended = 0;
    for _ in 0..30 {
        let mut mask = vocab.compile(&Constraint::JsonSchema(schema.into())).unwrap();
        let (text, end) = generate(&mut mask, &tokens, &mut rng, 400);
        if !end {
            continue;
        }
        ended += 1;
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 3, "{text}");
        assert!(o["name"].as_str().unwrap().chars().count() <= 6, "{text}");
        assert!(o["age"].as_u64().is_some_and(|a| a <= 150), "{text}");
        assert!(o["ok"].is_boolean(), "{text}");
        // llmr's layout: one line, Python's separators.
        assert!(text.starts_with("{\"") && text.contains("\": ") && !text.contains('\n'), "{text}");
    }
    // Random integers and strings can run long; most draws still end within 400 tokens.
    assert!(ended >= 20, "only {ended} of 30 documents ended");
}

#[test]
fn a_regex_allows_only_its_words_then_only_the_end() {
    let (vocab, tokens) = vocabulary();
    let mut rng = fastrand::Rng::with_seed(3);
    for _ in 0..20 {
        let mut mask = vocab.compile(&Constraint::Regex("(yes|no)".into())).unwrap();
        let (text, end) = generate(&mut mask, &tokens, &mut rng, 10);
        assert!(end && (text == "yes" || text == "no"), "{text:?}");
    }
    let mut mask = vocab.compile(&Constraint::Regex("yes".into())).unwrap();
    let yes = tokens.iter().position(|t| *t == TokenBytes::Text(b"yes".to_vec())).unwrap() as u32;
    mask.accept(yes).unwrap();
    assert!(mask.is_complete() && mask.is_finished());
    let mut logits = Vec::new();
    mask.apply(&vec![1.0; tokens.len()], &mut logits).unwrap();
    let left: Vec<usize> = (0..logits.len()).filter(|&i| logits[i].is_finite()).collect();
    assert_eq!(left, vec![end_id(&tokens) as usize]);
    assert!(mask.accept(yes).is_err(), "a token past the grammar's end is refused");
}

#[test]
fn a_choice_regex_and_an_llguidance_marked_grammar_compile() {
    let (vocab, tokens) = vocabulary();
    let mut rng = fastrand::Rng::with_seed(5);
    // What `guided_choice: ["yes", "no (maybe)"]` becomes, and llama-server's `%llguidance` form.
    for grammar in [
        Constraint::Regex(r"(yes|no \(maybe\))".into()),
        Constraint::Lark("%llguidance {}\nstart: \"yes\" | \"no\"".into()),
    ] {
        let mut mask = vocab.compile(&grammar).unwrap();
        let (text, end) = generate(&mut mask, &tokens, &mut rng, 12);
        assert!(end && ["yes", "no", "no (maybe)"].contains(&text.as_str()), "{grammar:?}: {text:?}");
    }
}

#[test]
fn a_lark_grammar_can_name_a_special_token() {
    let (vocab, tokens) = vocabulary();
    let mut mask = vocab.compile(&Constraint::Lark("start: <|tool|> \"yes\"".into())).unwrap();
    let mut logits = Vec::new();
    mask.apply(&vec![0.0; tokens.len()], &mut logits).unwrap();
    let left: Vec<usize> = (0..logits.len()).filter(|&i| logits[i].is_finite()).collect();
    assert_eq!(left, vec![tokens.len() - 3], "only <|tool|> may start");
}

#[test]
fn bad_grammars_are_errors_that_say_what_is_wrong() {
    let (vocab, _) = vocabulary();
    let not_json = vocab.compile(&Constraint::JsonSchema("{\"type\": ".into())).err().unwrap();
    assert!(not_json.0.contains("not JSON"), "{not_json}");
    let bad_type = vocab.compile(&Constraint::JsonSchema(r#"{"type": "nonsense"}"#.into())).err().unwrap();
    assert!(bad_type.0.contains("nonsense"), "{bad_type}");
    assert!(vocab.compile(&Constraint::Regex("(unclosed".into())).is_err());
    assert!(vocab.compile(&Constraint::Lark("start: missing_rule".into())).is_err());
}

#[test]
fn a_vocabulary_needs_an_end_token_within_it() {
    let tokens = vec![TokenBytes::Text(b"a".to_vec()), TokenBytes::Text(b"b".to_vec())];
    assert!(Vocabulary::new(tokens.clone(), &[]).is_err());
    assert!(Vocabulary::new(tokens, &[5]).is_err());
}

#[test]
fn a_schema_that_admits_nothing_is_refused_when_compiled() {
    let (vocab, _) = vocabulary();
    for schema in [
        r#"{"type": "string", "minLength": 5, "maxLength": 2}"#,
        r#"{"type": "integer", "minimum": 10, "maximum": 3}"#,
        r#"{"allOf": [{"type": "string"}, {"type": "integer"}]}"#,
        "false",
    ] {
        let err = vocab.compile(&Constraint::JsonSchema(schema.into())).err();
        assert!(err.is_some(), "{schema} compiled");
    }
}

#[test]
fn a_regex_feature_the_engine_lacks_is_an_error_not_a_hang() {
    let (vocab, _) = vocabulary();
    // Look-around and back-references have no finite-automaton form.
    for schema in [r#"{"type": "string", "pattern": "(?=a)b"}"#, r#"{"type": "string", "pattern": "(a)\\1"}"#] {
        let err = vocab.compile(&Constraint::JsonSchema(schema.into())).err();
        assert!(err.is_some(), "{schema} compiled");
    }
    assert!(vocab.compile(&Constraint::Regex("(?<=a)b".into())).is_err());
}

/// A reasoning model thinks first, then answers under the constraint: the grammar of
/// `ReasoningFormat::then` over a vocabulary with the think markers as tokens, with draws that
/// prefer letters and take `</think>` now and then.
#[test]
fn a_constrained_answer_follows_the_thinking() {
    use llmr_tool_calls::{AnswerGrammar, ReasoningFormat, ReasoningSplitter};
    let mut tokens: Vec<TokenBytes> = (0..=255u8).map(|b| TokenBytes::Text(vec![b])).collect();
    for w in ["<think>", "</think>", "true", "false"] {
        tokens.push(TokenBytes::Text(w.as_bytes().to_vec()));
    }
    tokens.push(TokenBytes::Special("<|end|>".into()));
    let (open, close, end) = (256u32, 257u32, tokens.len() as u32 - 1);
    let vocab = Vocabulary::new(tokens.clone(), &[end]).unwrap();
    let format = ReasoningFormat::THINK;
    let mut rng = fastrand::Rng::with_seed(11);
    for inside in [true, false] {
        let grammar = format.then(inside, AnswerGrammar::JsonSchema(r#"{"type":"boolean"}"#)).unwrap();
        for round in 0..10 {
            let mut mask = vocab.compile(&Constraint::Lark(grammar.clone())).unwrap();
            let mut out = Vec::new();
            let mut ended = false;
            for step in 0..200 {
                let mut logits = Vec::new();
                mask.apply(&vec![0.0; tokens.len()], &mut logits).unwrap();
                let allowed: Vec<u32> = (0..tokens.len() as u32).filter(|&i| logits[i as usize].is_finite()).collect();
                let pick = |t: u32| allowed.contains(&t);
                let letters: Vec<u32> =
                    allowed.iter().copied().filter(|&t| (97..123).contains(&t) || t > close).collect();
                let token = if !inside && step == 0 && round % 2 == 0 && pick(open) {
                    open
                } else if pick(close) && step > 3 && rng.f32() < 0.3 {
                    close
                } else if letters.is_empty() {
                    allowed[rng.usize(..allowed.len())]
                } else {
                    letters[rng.usize(..letters.len())]
                };
                mask.accept(token).unwrap();
                if token == end {
                    ended = true;
                    break;
                }
                if let TokenBytes::Text(b) = &tokens[token as usize] {
                    out.extend_from_slice(b);
                }
            }
            let text = String::from_utf8(out).unwrap();
            assert!(ended, "{text:?}");
            let (thought, answer) = ReasoningSplitter::split(format, inside, &text);
            assert!(answer == "true" || answer == "false", "inside {inside}: {text:?} -> {thought:?} / {answer:?}");
        }
    }
}
