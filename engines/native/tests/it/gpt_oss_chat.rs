//! gpt-oss's chat format (harmony) on the engine side. No gpt-oss checkpoint or tokenizer is
//! reachable, so the golden `gpt_oss` checkpoint gets a tokenizer with harmony's special tokens
//! and gpt-oss's own chat template (`chat_template.jinja`, the copy the chat-template crate's
//! conformance suite checks against transformers); the engine must hand the template over,
//! read the specials the template writes as single tokens, and stop on `<|return|>` and
//! `<|call|>` (generation_config.json's eos ids, as gpt-oss ships them).

use crate::random_checkpoint::{golden_checkpoint_in_temp, tokenizer_json};
use crate::support::{engine, spec};
use llmr_chat_template::{ChatTemplate, Message, RenderInput, SpecialTokens};
use llmr_engine_host::{FinishReason, InferParams, Sampling};
use serde_json::{json, Value};

const TEMPLATE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../crates/chat-template/tests/conformance/templates/openai-gpt-oss-120b.jinja"
);
/// Harmony's special tokens, given the last ids of the golden's 256-token vocabulary.
const SPECIALS: [&str; 7] =
    ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"];

fn id_of(special: &str) -> u32 {
    249 + SPECIALS.iter().position(|s| *s == special).unwrap() as u32
}

/// The golden tokenizer with ids 249..=255 turned into harmony's special tokens.
fn harmony_tokenizer() -> Value {
    let mut t = tokenizer_json(256);
    let vocab = t["model"]["vocab"].as_object_mut().unwrap();
    let mut added = Vec::new();
    for s in SPECIALS {
        let id = id_of(s);
        vocab.remove(&format!("t{id}"));
        vocab.insert(s.to_string(), json!(id));
        added.push(json!({"id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
            "normalized": false, "special": true}));
    }
    t["added_tokens"] = Value::Array(added);
    t
}

#[test]
fn the_harmony_template_renders_to_special_tokens_and_its_end_tokens_stop_generation() {
    let dir = golden_checkpoint_in_temp("gpt_oss");
    let template = std::fs::read_to_string(TEMPLATE).unwrap();
    std::fs::write(dir.join("tokenizer.json"), harmony_tokenizer().to_string()).unwrap();
    std::fs::write(dir.join("chat_template.jinja"), &template).unwrap();
    let ends = [id_of("<|return|>"), id_of("<|call|>")];
    std::fs::write(dir.join("generation_config.json"), json!({"eos_token_id": ends}).to_string()).unwrap();
    let e = engine(1);
    e.load_model(&spec("oss", &dir)).unwrap();
    let info = e.model_info("oss").unwrap();
    assert_eq!(info.architecture.as_deref(), Some("gpt_oss"));
    assert_eq!(info.chat_template.as_deref(), Some(template.as_str()));

    let chat = ChatTemplate::new(&template, SpecialTokens::default()).unwrap();
    let messages = [Message::user("t5 t6 t7")];
    let prompt = chat.render(&RenderInput::new(&messages, true)).unwrap();
    assert!(prompt.ends_with("<|start|>assistant"), "{prompt}");
    let ids = e.tokenize("oss", &prompt, false, true).unwrap();
    let count = |s: &str| ids.iter().filter(|&&i| i as u32 == id_of(s)).count();
    // The template's system turn, the user's turn and the assistant's header.
    assert_eq!((count("<|start|>"), count("<|message|>"), count("<|end|>")), (3, 2, 2), "{ids:?}");
    assert!(ids.windows(3).any(|w| w == [5, 6, 7]), "the user's words are their tokens: {ids:?}");
    // As text (parse_special off) the markers are not special tokens.
    let plain = e.tokenize("oss", &prompt, false, false).unwrap();
    assert!(plain.iter().all(|&i| !(249..256).contains(&(i as u32))), "{plain:?}");

    // generation_config.json's end ids end a generation (gpt-oss's config.json names only one of
    // them). The random model is unlikely to pick `<|return|>` itself, so a second copy also
    // ends on the fourth token it does pick.
    let greedy = |model: &str| {
        let mut params = InferParams::new(1, model, &prompt, Sampling { max_tokens: Some(16), ..Sampling::greedy() });
        params.add_bos = false;
        let mut generated = Vec::new();
        let res = e
            .infer(&params, |t| {
                generated.push(t.token_id as u32);
                true
            })
            .unwrap();
        (generated, res.finish_reason)
    };
    let (free, reason) = greedy("oss");
    if let Some(at) = free.iter().position(|t| ends.contains(t)) {
        assert_eq!((reason, free.len()), (FinishReason::Stop, at + 1), "{free:?}");
    } else {
        assert_eq!((reason, free.len()), (FinishReason::Length, 16), "{free:?}");
        let ends = [ends[0], ends[1], free[3]];
        std::fs::write(dir.join("generation_config.json"), json!({"eos_token_id": ends}).to_string()).unwrap();
        e.load_model(&spec("oss-ends", &dir)).unwrap();
        let (cut, reason) = greedy("oss-ends");
        assert_eq!((reason, &cut[..]), (FinishReason::Stop, &free[..4]));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
