//! SmolLM2-135M-Instruct and Gemma 3 270M in Hugging Face layout (bf16, converted from the GGUF
//! test models by `scripts/convert_gguf_hf.py`): real weights through the whole plugin.

use crate::support::{cached_model, engine, spec};
use llmr_engine_host::{Constraint, EmbedInputs, EngineInstance, FinishReason, InferParams, InferResult, Sampling};
use std::sync::OnceLock;

const CHAT: &str = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";

/// An engine with SmolLM2 loaded as `smollm2`.
fn smollm2(slots: u32) -> EngineInstance {
    let e = engine(slots);
    e.load_model(&spec("smollm2", &cached_model("smollm2-hf"))).unwrap();
    e
}

/// The instance the tests that do not read instance-wide state share.
fn shared() -> &'static EngineInstance {
    static E: OnceLock<EngineInstance> = OnceLock::new();
    E.get_or_init(|| smollm2(4))
}

fn greedy<'a>(id: u64, prompt: &'a str, max: u32) -> InferParams<'a> {
    InferParams::new(id, "smollm2", prompt, Sampling { max_tokens: Some(max), ..Sampling::greedy() })
}

fn run(engine: &EngineInstance, p: &InferParams<'_>) -> (String, Vec<String>, InferResult) {
    let mut pieces = Vec::new();
    let res = engine
        .infer(p, |t| {
            pieces.push(t.text.to_string());
            true
        })
        .unwrap();
    (pieces.concat(), pieces, res)
}

#[test]
fn the_chat_answer_is_right_and_greedy_decoding_repeats_it() {
    let e = shared();
    let (a, pieces, res) = run(e, &greedy(1, CHAT, 24));
    let (b, _, _) = run(e, &greedy(2, CHAT, 24));
    assert!(a.contains("Paris"), "{a:?}");
    assert_eq!(a, b);
    assert_eq!(res.finish_reason, FinishReason::Stop, "the model ends its short answer itself: {a:?}");
    assert_eq!(pieces.len() as u32, res.completion_tokens, "one callback per sampled token");
    let exact = e.tokenize("smollm2", CHAT, true, true).unwrap().len() as u32;
    assert_eq!(res.prompt_tokens, exact, "usage comes from the tokenizer");
    let info = e.model_info("smollm2").unwrap();
    assert!(info.chat_template.as_deref().is_some_and(|t| t.contains("<|im_start|>")), "{info:?}");
    assert_eq!(info.architecture.as_deref(), Some("llama"));
}

/// `special_text` (ABI minor 5): control tokens the model generates are written as their text.
/// Past its answer (end of generation ignored) SmolLM2 writes `<|im_end|>` and a new turn.
#[test]
fn control_tokens_are_written_as_text_only_when_asked() {
    let e = shared();
    let past_the_end = |id, special_text| {
        let mut p = greedy(id, CHAT, 24);
        p.ignore_eos = true;
        p.special_text = special_text;
        run(e, &p)
    };
    let (plain, plain_pieces, _) = past_the_end(31, false);
    let (marked, marked_pieces, _) = past_the_end(32, true);
    assert!(marked.contains("Paris") && marked.contains("<|im_end|>"), "{marked:?}");
    assert!(!plain.contains("<|im_"), "{plain:?}");
    // The same tokens, written differently: only the control tokens' pieces differ.
    assert_eq!(plain_pieces.len(), marked_pieces.len());
    for (a, b) in plain_pieces.iter().zip(&marked_pieces) {
        assert!(a == b || (a.is_empty() && b.starts_with("<|") && b.ends_with("|>")), "{a:?} / {b:?}");
    }
}

/// One token of an answer as the engine streamed it: log-probabilities as bits, to compare
/// them exactly.
#[derive(Debug, PartialEq)]
struct Streamed {
    id: i32,
    text: String,
    logprob: u32,
    top: Vec<(i32, u32)>,
}

fn transcript(engine: &EngineInstance, p: &InferParams<'_>) -> Vec<Streamed> {
    let mut tokens = Vec::new();
    engine
        .infer(p, |t| {
            let top = t.top.iter().map(|a| (a.token_id, a.logprob.to_bits())).collect();
            tokens.push(Streamed { id: t.token_id, text: t.text.to_string(), logprob: t.logprob.to_bits(), top });
            true
        })
        .unwrap();
    tokens
}

fn text_of(tokens: &[Streamed]) -> String {
    tokens.iter().map(|t| t.text.as_str()).collect()
}

/// The answers to `n` requests (`request(id, i)` the `i`-th), as transcripts: each alone on an
/// engine with one slot (ids from `base`), then all sent at once to an engine with a slot each
/// (ids from `base + 100`), so that they decode batched together.
fn alone_and_together<'a>(
    n: usize,
    base: u64,
    request: impl Fn(u64, usize) -> InferParams<'a> + Sync,
) -> (Vec<Vec<Streamed>>, Vec<Vec<Streamed>>) {
    let alone = {
        let e = smollm2(1);
        (0..n).map(|i| transcript(&e, &request(base + i as u64, i))).collect()
    };
    let e = smollm2(n as u32);
    let together = std::thread::scope(|s| {
        let (e, request) = (&e, &request);
        let handles: Vec<_> =
            (0..n).map(|i| s.spawn(move || transcript(e, &request(base + 100 + i as u64, i)))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (alone, together)
}

#[test]
fn sequences_batched_together_answer_exactly_as_they_do_alone() {
    let prompts = [
        "Once upon a time, in a small village,",
        "The three primary colors are",
        "def fibonacci(n):",
        "List of European capitals: Paris, Berlin,",
    ];
    let (alone, together) = alone_and_together(prompts.len(), 100, |id, i| greedy(id, prompts[i], 24));
    assert_eq!(alone, together);
    assert!(alone.iter().all(|t| !t.is_empty()));
}

/// Seeded draws give the same answers whether a sequence samples alone (on the scheduler's
/// thread) or among others (every sequence drawing on the model's threads at once): the OpenAI
/// defaults (temperature 1), top-p with min-p, a top-k chain with penalties, and draws under a
/// grammar and with log-probabilities, greedy and at temperature 1.
#[test]
fn seeded_draws_answer_the_same_alone_and_batched_together() {
    let prompts = [
        "Once upon a time,",
        "My favourite food is",
        "The weather today",
        "A poem about the sea:",
        "Is Paris in France? Answer:",
        "A colour, as JSON:",
    ];
    // Fewer prompt tokens together than `GEMM_MIN_ROWS` (64): every row of every step gets the
    // bits it gets alone.
    let sampled = |id: u64, i: usize| {
        let mut p = greedy(id, prompts[i], 20);
        p.sampling.temperature = 1.0;
        p.sampling.seed = Some(40 + i as u64);
        // No drafts: they add rows to a step (`speculation_keeps_the_output_...` checks them).
        p.sampling.speculative = false;
        match i {
            1 => (p.sampling.top_p, p.sampling.min_p) = (0.9, 0.05),
            2 => (p.sampling.top_k, p.sampling.repeat_penalty) = (Some(20), 1.3),
            3 => p.sampling.logprobs = Some(3),
            4 => {
                p.sampling.constraint = Some(Constraint::Regex("(yes|no)[.!]? [A-Z][a-z ]{0,40}\\.".into()));
                p.sampling.logprobs = Some(2);
            }
            5 => {
                p.sampling.temperature = 0.0;
                p.sampling.constraint = Some(Constraint::JsonSchema(
                    r#"{"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}}, "required": ["colour"]}"#.into(),
                ));
            }
            _ => {}
        }
        p
    };
    let (alone, together) = alone_and_together(prompts.len(), 700, sampled);
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert!(!a.is_empty(), "request {i} answered nothing");
        assert_eq!(a, t, "request {i}");
    }
    assert!(alone[3].iter().all(|t| t.top.len() == 3), "logprobs were asked for: {:?}", alone[3]);
    let (answer, document) = (text_of(&alone[4]), text_of(&alone[5]));
    assert!(answer.starts_with("yes") || answer.starts_with("no"), "{answer:?}");
    assert!(
        serde_json::from_str::<serde_json::Value>(&document).is_ok_and(|v| v["colour"].is_string()),
        "{document:?}"
    );
}

#[test]
fn a_shared_prefix_is_reused_and_gives_the_same_answer() {
    let system = "<|im_start|>system\nYou are a meticulous assistant who answers in one short sentence, \
                  names sources when it can, and never invents facts it does not know.<|im_end|>\n";
    let first = format!("{system}<|im_start|>user\nWhat is the capital of Italy?<|im_end|>\n<|im_start|>assistant\n");
    let second = format!("{system}<|im_start|>user\nWhat is the capital of Spain?<|im_end|>\n<|im_start|>assistant\n");
    let fresh = {
        let e = smollm2(1);
        run(&e, &greedy(300, &second, 16))
    };
    let e = smollm2(1);
    let (_, _, a) = run(&e, &greedy(301, &first, 16));
    assert_eq!(a.cached_tokens, 0);
    let (text, _, b) = run(&e, &greedy(302, &second, 16));
    // Whole blocks are shared, and the one the prompts part in (the first answer filled it)
    // lends a copy of its shared positions: the second starts at the first token that differs.
    let (x, y) =
        (e.tokenize("smollm2", &first, true, true).unwrap(), e.tokenize("smollm2", &second, true, true).unwrap());
    let common = x.iter().zip(&y).take_while(|(a, b)| a == b).count();
    let system_tokens = e.tokenize("smollm2", system, true, true).unwrap().len();
    assert!(common > system_tokens && common % 16 != 0, "the test needs a parting inside a block: {common}");
    assert_eq!(b.cached_tokens as usize, common, "{b:?}");
    assert_eq!(text, fresh.0, "a reused prefix must not change the answer");
}

/// A chat's next turn sends the conversation with the answer in it: the answer's last, partial
/// block is still there, so the turn starts where the answer ended (token for token, as
/// llama-server's slots do), not at the last full block, and answers as a fresh engine does.
#[test]
fn the_next_turn_starts_where_the_answer_ended_not_at_its_last_full_block() {
    let first = "<|im_start|>user\nName three rivers of Europe.<|im_end|>\n<|im_start|>assistant\n";
    let e = smollm2(1);
    let (mut ids, mut answer) = (Vec::new(), String::new());
    let a = e
        .infer(&greedy(400, first, 13), |t| {
            ids.push(t.token_id);
            answer.push_str(&t.text);
            true
        })
        .unwrap();
    let second =
        format!("{first}{answer}<|im_end|>\n<|im_start|>user\nAnd two of Asia?<|im_end|>\n<|im_start|>assistant\n");
    // What the cache holds: the prompt and every generated token but the last (never fed).
    let prompt = e.tokenize("smollm2", first, true, true).unwrap();
    assert_eq!((prompt.len(), ids.len()), (a.prompt_tokens as usize, 13));
    let held: Vec<i32> = prompt.into_iter().chain(ids[..12].iter().copied()).collect();
    let wanted = e.tokenize("smollm2", &second, true, true).unwrap();
    let expected = held.iter().zip(&wanted).take_while(|(a, b)| a == b).count();
    assert!(expected % 16 != 0 && expected > 16, "the test needs a partial block to reuse: {expected}");
    let (text, _, b) = run(&e, &greedy(401, &second, 8));
    assert_eq!(b.cached_tokens as usize, expected, "{b:?}");
    let fresh = run(&smollm2(1), &greedy(402, &second, 8)).0;
    assert_eq!(text, fresh, "a reused partial block must not change the answer");
}

#[test]
fn a_regenerated_answer_computes_only_the_prompts_last_token() {
    let e = smollm2(1);
    let (first, _, a) = run(&e, &greedy(410, CHAT, 24));
    let n = a.prompt_tokens as usize;
    assert!(n > 16 && n % 16 > 1, "the test needs the prompt to end inside a block after a full one: {n}");
    // The answer filled the block the prompt ended in; the same prompt again starts on a copy
    // of that block's prompt positions, not on the full blocks before it.
    let (again, _, b) = run(&e, &greedy(411, CHAT, 24));
    assert_eq!(b.cached_tokens as usize, n - 1, "{b:?}");
    assert_eq!(again, first, "the copied positions must not change the answer");
}

#[test]
fn stop_sequences_max_tokens_and_cancellation_end_a_generation() {
    let e = shared();
    let prompt = "Once upon a time, in a small village,";
    let (full, _, res) = run(e, &greedy(400, prompt, 32));
    assert_eq!((res.finish_reason, res.completion_tokens), (FinishReason::Length, 32));
    let words: Vec<&str> = full.split(' ').collect();
    assert!(words.len() > 8, "{full:?}");
    let stop = format!("{} {}", words[5], words[6]);
    let cut = full.find(&stop).unwrap();
    let mut p = greedy(401, prompt, 32);
    p.sampling.stop = vec![stop.clone()];
    let (text, _, res) = run(e, &p);
    assert_eq!(res.finish_reason, FinishReason::Stop);
    assert_eq!(text, full[..cut], "stop {stop:?}");
    // The host says stop after the third token: the engine stops and reports it.
    let mut n = 0;
    let res = e
        .infer(&greedy(402, prompt, 32), |_| {
            n += 1;
            n < 3
        })
        .unwrap();
    assert_eq!(res.finish_reason, FinishReason::Cancelled);
    assert_eq!(n, 3, "no token after the one refused");
}

#[test]
fn seeds_repeat_samples_and_logprobs_are_log_probabilities() {
    let e = shared();
    let mut p = InferParams::greedy(500, "smollm2", "Write a word:");
    p.sampling.temperature = 0.9;
    p.sampling.top_k = Some(40);
    p.sampling.seed = Some(7);
    p.sampling.max_tokens = Some(16);
    let (a, _, _) = run(e, &p);
    let (b, _, _) = run(e, &InferParams { request_id: 501, ..p.clone() });
    assert_eq!(a, b);
    let outputs: std::collections::HashSet<String> = (0..4)
        .map(|i| {
            let mut q = InferParams { request_id: 502 + i, ..p.clone() };
            q.sampling.seed = Some(i);
            run(e, &q).0
        })
        .collect();
    assert!(outputs.len() > 1, "different seeds should differ: {outputs:?}");
    let mut g = greedy(510, CHAT, 4);
    g.sampling.logprobs = Some(3);
    let mut seen = Vec::new();
    e.infer(&g, |t| {
        seen.push((t.token_id, t.logprob, t.top.clone()));
        true
    })
    .unwrap();
    assert!(!seen.is_empty());
    for (id, lp, top) in &seen {
        assert!(*lp <= 0.0 && lp.is_finite());
        assert_eq!(top.len(), 3);
        assert_eq!(top[0].token_id, *id, "greedy picks the most likely token");
        assert!(top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
    }
}

/// Gemma 3 270M (gemma3_text: sliding-window layers, 262,144-token SentencePiece vocabulary).
/// Its folder has no chat template and ends generations only at `<eos>` (id 1): plain text.
/// llama.cpp (`llama-completion`, the F16 GGUF of the same weights) answers these prompts with
/// " Paris" first, as the engine must.
#[test]
fn gemma3_completes_plain_text_sensibly_and_adds_bos_when_asked() {
    let e = engine(2);
    e.load_model(&spec("gemma3", &cached_model("gemma3-hf"))).unwrap();
    let info = e.model_info("gemma3").unwrap();
    assert_eq!(info.architecture.as_deref(), Some("gemma3_text"));
    assert_eq!((info.bos_token.as_deref(), info.eos_token.as_deref()), (Some("<bos>"), Some("<eos>")));
    assert!(info.chat_template.is_none(), "{info:?}");
    // BOS (id 2) leads when the host asks for special tokens (tokenizer_config's
    // add_bos_token), as llama.cpp's tokenizer gives it: `llama-tokenize` says
    // 2 818 5279 529 7001 563 for this text.
    let text = "The capital of France is";
    assert_eq!(e.tokenize("gemma3", text, true, true).unwrap(), [2, 818, 5279, 529, 7001, 563]);
    assert_eq!(e.tokenize("gemma3", text, false, true).unwrap(), [818, 5279, 529, 7001, 563]);
    let ask = |id: u64, prompt: &str, max: u32| {
        let p = InferParams::new(id, "gemma3", prompt, Sampling { max_tokens: Some(max), ..Sampling::greedy() });
        run(&e, &p)
    };
    let (answer, _, res) = ask(600, "Question: What is the capital of France?\nAnswer:", 8);
    assert!(answer.starts_with(" Paris"), "{answer:?}");
    assert_eq!(res.prompt_tokens, 13, "BOS and the 12 tokens of the question");
    let (answer, _, _) = ask(601, "The Eiffel Tower is located in the city of", 6);
    assert!(answer.starts_with(" Paris"), "{answer:?}");
    let (answer, _, _) = ask(602, "The capital of France is Paris. The capital of Germany is", 4);
    assert!(answer.starts_with(" Berlin"), "{answer:?}");
    // Two sequences batched together answer as each does alone.
    let prompts = ["Once upon a time, in a small village,", "def fibonacci(n):"];
    let alone: Vec<String> = prompts.iter().enumerate().map(|(i, p)| ask(610 + i as u64, p, 16).0).collect();
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> =
            prompts.iter().enumerate().map(|(i, p)| s.spawn(move || ask(620 + i as u64, p, 16).0)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(alone, together);
}

#[test]
fn prompts_and_embedding_inputs_given_as_token_ids_read_as_their_text_does() {
    let e = shared();
    let ids = e.tokenize("smollm2", CHAT, true, true).unwrap();
    let (from_text, _, _) = run(e, &greedy(700, CHAT, 12));
    let mut p = greedy(701, "", 12);
    p.prompt_tokens = Some(&ids);
    let (from_ids, _, res) = run(e, &p);
    assert_eq!((from_ids.as_str(), res.prompt_tokens as usize), (from_text.as_str(), ids.len()));
    let vocab = e.model_info("smollm2").unwrap().vocab_size.unwrap() as i32;
    let outside = [ids[0], vocab];
    p.prompt_tokens = Some(&outside);
    let err = e.infer(&p, |_| true).unwrap_err();
    assert_eq!(err.status, llmr_engine_host::EngineStatus::Unsupported);
    assert!(err.message.contains("prompt_tokens[1]"), "{}", err.message);

    let text = "The capital of France is Paris.";
    let ids = e.tokenize("smollm2", text, true, false).unwrap();
    let mut by_text = Vec::new();
    e.embed(702, "smollm2", &[text], true, |_, v| {
        by_text = v.to_vec();
        true
    })
    .unwrap();
    let mut by_ids = Vec::new();
    let counted = e
        .embed_inputs(703, "smollm2", EmbedInputs::Tokens(&[&ids]), true, |_, v| {
            by_ids = v.to_vec();
            true
        })
        .unwrap();
    assert_eq!(counted as usize, ids.len());
    assert_eq!(by_text, by_ids, "the same tokens, the same vector");
}

/// Gemma 3 (sliding layers of 512 positions): the cache gives back each sequence's sliding-layer
/// blocks once no query still to come sees them, which changes no output (the same greedy tokens
/// as with every position kept, `swa_full`) and holds much less; a turn that parts from the
/// conversation just after its last prompt starts on that prompt (the window before its end is
/// kept), and one that goes on from the whole conversation starts past it.
#[test]
fn gemma3_sliding_layers_hold_the_window_and_prefixes_stay_usable() {
    let hamlet = std::fs::read_to_string(cached_model("corpus/hamlet_gut.txt")).unwrap();
    let words: Vec<&str> = hamlet.split_whitespace().collect();
    let turn = |user: &str| format!("<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n");
    let first = turn(&format!("{}\n\nWho speaks first?", words[3000..3900].join(" ")));
    let e = engine(1);
    let dir = cached_model("gemma3-hf");
    e.load_model(&spec("windowed", &dir)).unwrap();
    let mut full = spec("full", &dir);
    full.options = Some(serde_json::json!({"swa_full": true}));
    e.load_model(&full).unwrap();
    let greedy = |model: &'static str, id: u64, prompt: &str| {
        let p = InferParams::new(id, model, prompt, Sampling { max_tokens: Some(16), ..Sampling::greedy() });
        let (mut ids, mut text) = (Vec::new(), String::new());
        let res = e
            .infer(&p, |t| {
                ids.push(t.token_id);
                text.push_str(&t.text);
                true
            })
            .unwrap();
        (ids, text, res)
    };
    let kv_bytes = |model: &str| {
        let m = e.metrics().unwrap();
        m["models"].as_array().unwrap().iter().find(|x| x["model"] == model).unwrap()["kv_bytes"].as_u64().unwrap()
    };
    let (windowed, answer, res) = greedy("windowed", 1, &first);
    let (kept, _, _) = greedy("full", 2, &first);
    assert!(res.prompt_tokens > 1200, "a prompt past the window: {} tokens", res.prompt_tokens);
    assert_eq!(windowed, kept, "the same greedy tokens");
    let (w, f) = (kv_bytes("windowed"), kv_bytes("full"));
    eprintln!("Gemma 3, {} positions: KV {w} bytes with the window, {f} with every position", res.prompt_tokens + 16);
    // 15 of the 18 layers slide: they hold the last 512 positions and the windows before the
    // prompt's last 256 (800 of 1,302), the other 3 every position: about 0.68 of the full cache.
    assert!(w * 100 < f * 70, "windowed {w}, full {f}");

    // A turn that keeps only the first prompt (another answer in its place: a template that drops
    // the answer's thinking) starts on it: the window before the prompt's end was kept.
    let other = format!("{first}Hamlet.<end_of_turn>\n{}", turn("Summarise it."));
    let (_, _, res2) = greedy("windowed", 3, &other);
    assert!(
        res2.cached_tokens + 16 > res.prompt_tokens,
        "a turn parting after the prompt reused {}",
        res2.cached_tokens
    );
    // Turn 2 on the whole conversation starts past the first prompt.
    let second = format!("{first}{answer}<end_of_turn>\n{}", turn("And who speaks last?"));
    let (_, _, res3) = greedy("windowed", 4, &second);
    assert!(res3.cached_tokens > res.prompt_tokens, "turn 2 reused {} of {}", res3.cached_tokens, res.prompt_tokens);
    // A prompt parting from the first about 80 tokens before its end (the passage's last lines
    // changed) starts where it parts: the windows before the first prompt's last 256 positions
    // are still held. It starts on the whole blocks before the parting point and a copy of the
    // shared positions of the block it parts in.
    let parted = turn(&format!("{} Exeunt all but one.\n\nWho speaks first?", words[3000..3840].join(" ")));
    let (a, b) =
        (e.tokenize("windowed", &first, true, true).unwrap(), e.tokenize("windowed", &parted, true, true).unwrap());
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!((res.prompt_tokens as usize - 256..res.prompt_tokens as usize - 32).contains(&common), "parts at {common}");
    let (_, _, res4) = greedy("windowed", 5, &parted);
    assert_eq!(res4.cached_tokens as usize, common, "a prompt parting at {common}");
}

/// An engine with SmolLM2 that drafts as deep as allowed whenever the text matches, whatever a
/// token costs on this machine.
fn speculating_smollm2() -> EngineInstance {
    let e = engine(2);
    let mut s = spec("smollm2", &cached_model("smollm2-hf"));
    s.options = Some(serde_json::json!({"speculative_threshold": 0.0}));
    e.load_model(&s).unwrap();
    e
}

/// The model's decode steps, draft tokens fed and draft tokens kept so far.
fn draft_counters(e: &EngineInstance) -> (u64, u64, u64) {
    let m = e.metrics().unwrap()["models"][0].clone();
    let n = |k: &str| m[k].as_u64().unwrap();
    (n("decode_steps_total"), n("draft_tokens_total"), n("draft_accepted_total"))
}

/// Two sequences drafting in the same steps (each draws on the model's threads at once, and the
/// drafts each did not keep leave its table after both drew) answer token for token as each
/// does alone without drafts; the cache they leave is exact.
#[test]
fn sequences_drafting_together_keep_their_outputs() {
    let passage = "It was the best of times, it was the worst of times, it was the age of wisdom, it was the \
                   age of foolishness, it was the epoch of belief, it was the epoch of incredulity.";
    let prompt =
        format!("<|im_start|>user\nRepeat this text word for word: {passage}<|im_end|>\n<|im_start|>assistant\n");
    let e = speculating_smollm2();
    let drafts = |e: &EngineInstance| {
        let (_, drafted, kept) = draft_counters(e);
        (drafted, kept)
    };
    // Both runs of each case read the prompt from the same cached blocks (see
    // `speculation_keeps_the_output_...`).
    ids(&e, &InferParams::new(700, "smollm2", &prompt, Sampling { max_tokens: Some(1), ..Sampling::greedy() }));
    let cases = [
        Sampling { max_tokens: Some(40), logprobs: Some(2), ..Sampling::greedy() },
        Sampling { max_tokens: Some(40), temperature: 0.8, seed: Some(11), ..Sampling::default() },
    ];
    let plain: Vec<_> = (0..2)
        .map(|i| {
            ids(
                &e,
                &InferParams::new(
                    710 + i,
                    "smollm2",
                    &prompt,
                    Sampling { speculative: false, ..cases[i as usize].clone() },
                ),
            )
            .0
        })
        .collect();
    let before = drafts(&e);
    let together: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|i| {
                let (e, prompt, sampling) = (&e, &prompt, cases[i].clone());
                s.spawn(move || ids(e, &InferParams::new(720 + i as u64, "smollm2", prompt, sampling)).0)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let after = drafts(&e);
    assert!(after.1 > before.1, "the copies kept drafts: {before:?} -> {after:?}");
    assert!(after.0 - before.0 > after.1 - before.1, "and some drafts were not kept: {before:?} -> {after:?}");
    assert_eq!(together, plain);
    // Every table was cut back to what its sequence kept: a request reusing the cache answers
    // as a fresh instance does.
    let follow =
        format!("{prompt}{passage}<|im_end|>\n<|im_start|>user\nAgain, please.<|im_end|>\n<|im_start|>assistant\n");
    let off = Sampling { max_tokens: Some(16), speculative: false, ..Sampling::greedy() };
    let (reused, _, res) = run(&e, &InferParams::new(730, "smollm2", &follow, off.clone()));
    assert!(res.cached_tokens > 0, "{res:?}");
    assert_eq!(reused, run(&smollm2(1), &InferParams::new(731, "smollm2", &follow, off)).0);
}

/// `prefill_chunk` raised after load past what the cache's budget was sized for (Gemma 3's
/// sliding layers budgeted for about two windows and one chunk): a lone long prompt still goes
/// through, in pieces that fit, where it used to end at once with `length` and no tokens.
#[test]
fn a_prefill_chunk_raised_after_load_still_reads_a_long_prompt() {
    let hamlet = std::fs::read_to_string(cached_model("corpus/hamlet_gut.txt")).unwrap();
    let words: Vec<&str> = hamlet.split_whitespace().collect();
    let e = engine(1);
    e.load_model(&spec("gemma3", &cached_model("gemma3-hf"))).unwrap();
    e.set_config(Some("gemma3"), "prefill_chunk", &serde_json::json!(2048)).unwrap();
    let prompt = words[3000..4300].join(" ");
    let p = InferParams::new(1, "gemma3", &prompt, Sampling { max_tokens: Some(4), ..Sampling::greedy() });
    let res = e.infer(&p, |_| true).unwrap();
    assert!((1800..2040).contains(&res.prompt_tokens), "{} prompt tokens in a context of 2048", res.prompt_tokens);
    assert_eq!((res.finish_reason, res.completion_tokens), (FinishReason::Length, 4), "{res:?}");
}

/// The token ids of a generation, its text, and whether each token was its logits' argmax (the
/// request must ask for logprobs).
fn ids(e: &EngineInstance, p: &InferParams<'_>) -> (Vec<i32>, String, Vec<bool>) {
    let (mut ids, mut text, mut argmax) = (Vec::new(), String::new(), Vec::new());
    e.infer(p, |t| {
        ids.push(t.token_id);
        text.push_str(&t.text);
        argmax.push(t.top.first().is_some_and(|a| a.token_id == t.token_id));
        true
    })
    .unwrap();
    (ids, text, argmax)
}

/// Prompt lookup drafts from the prompt when the answer copies it. The sampler keeps a draft
/// token only when it drew that token itself, so with speculation on and off the output is the
/// same token for token (greedy, or sampled with a seed), and a copying answer takes fewer
/// steps than tokens; rejected drafts leave no trace in the cache (a later request reusing the
/// prefix answers as a fresh one does).
///
/// Token for token, not up to a near tie: below `GEMM_MIN_ROWS` input rows the linear kernels
/// give each row the bits it gets alone (`kernels/linear.rs`), and attention is per row, so a
/// step of a token and its draft computes each position as a step of one does. Both runs start
/// from the same cached prompt, read up to the same point (a whole prompt is read through the
/// GEMM path, whose bits differ).
#[test]
fn speculation_keeps_the_output_and_saves_steps_when_the_answer_copies_the_prompt() {
    let passage = "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of \
                   times, it was the age of wisdom, it was the age of foolishness, it was the epoch of belief.";
    let prompt =
        format!("<|im_start|>user\nRepeat this text word for word: {passage}<|im_end|>\n<|im_start|>assistant\n");
    let e = speculating_smollm2();
    let stats = draft_counters;
    // The prompt's full blocks in the cache, as both runs of every case will find them.
    let warm = Sampling { max_tokens: Some(1), ..Sampling::greedy() };
    ids(&e, &InferParams::new(399, "smollm2", &prompt, warm));
    let mut sampled_kept = 0;
    for (i, sampling) in [
        Sampling { max_tokens: Some(48), ..Sampling::greedy() },
        Sampling { max_tokens: Some(48), temperature: 0.7, seed: Some(7), ..Sampling::default() },
        Sampling { max_tokens: Some(48), temperature: 1.0, top_k: Some(40), seed: Some(3), ..Sampling::default() },
    ]
    .into_iter()
    .enumerate()
    {
        let sampling = Sampling { logprobs: Some(2), ..sampling };
        let off = Sampling { speculative: false, ..sampling.clone() };
        let before = stats(&e);
        let (plain, plain_text, _) = ids(&e, &InferParams::new(400 + i as u64, "smollm2", &prompt, off));
        let between = stats(&e);
        assert_eq!(between.1, before.1, "speculative: false drafts nothing");
        // The first step reads the prompt's last, partial block and samples the first token.
        assert_eq!(between.0 - before.0, plain.len() as u64, "one step per token without drafts");
        let (fast, fast_text, fast_argmax) =
            ids(&e, &InferParams::new(500 + i as u64, "smollm2", &prompt, sampling.clone()));
        let after = stats(&e);
        assert_eq!(fast, plain, "case {i}: {fast_text:?} vs {plain_text:?}");
        if sampling.temperature == 0.0 {
            assert!(fast_argmax.iter().all(|&a| a), "case {i}: every greedy token is its logits' argmax");
        }
        let (steps, drafted, accepted) = (after.0 - between.0, after.1 - between.1, after.2 - between.2);
        assert!(accepted <= drafted, "case {i}: {accepted} of {drafted} drafts kept");
        if sampling.temperature > 0.0 {
            sampled_kept += accepted;
        }
        assert_eq!(steps + accepted, fast.len() as u64, "case {i}: each step gives one token plus the drafts it kept");
        if i == 0 {
            assert!(accepted > 0, "the greedy copy keeps drafts");
            assert!(plain_text.contains("best of times"), "the greedy answer copies the passage: {plain_text:?}");
            assert!(
                steps * 2 <= fast.len() as u64,
                "a copied answer takes at most half the steps: {steps} for {}",
                fast.len()
            );
        }
    }
    assert!(sampled_kept > 0, "no draft kept under sampling");
    // Turned off live (`set_config`), as the llama.cpp plugin's: no drafts, one step per token.
    e.set_config(Some("smollm2"), "speculative_draft_max", &serde_json::json!(0)).unwrap();
    let bad = e.set_config(Some("smollm2"), "speculative_threshold", &serde_json::json!(2)).unwrap_err();
    assert!(bad.message.contains("speculative_threshold"), "{}", bad.message);
    let before = stats(&e);
    let (off, ..) =
        ids(&e, &InferParams::new(450, "smollm2", &prompt, Sampling { max_tokens: Some(48), ..Sampling::greedy() }));
    let after = stats(&e);
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (off.len() as u64, 0),
        "speculative_draft_max 0 drafts nothing"
    );
    e.set_config(Some("smollm2"), "speculative_draft_max", &serde_json::json!(8)).unwrap();
    // The cache now holds blocks of answers whose rejected drafts were cut off; a request reusing
    // the whole conversation answers as a fresh instance does.
    let (_, greedy_text, ..) = ids(
        &e,
        &InferParams::new(
            600,
            "smollm2",
            &prompt,
            Sampling { max_tokens: Some(48), logprobs: Some(2), ..Sampling::greedy() },
        ),
    );
    let follow = format!(
        "{prompt}{greedy_text}<|im_end|>\n<|im_start|>user\nNow say it again.<|im_end|>\n<|im_start|>assistant\n"
    );
    let off = Sampling { max_tokens: Some(24), speculative: false, ..Sampling::greedy() };
    let (reused, _, res) = run(&e, &InferParams::new(601, "smollm2", &follow, off.clone()));
    assert!(res.cached_tokens > 0, "the follow-up reuses the conversation: {res:?}");
    let (alone, _, _) = run(&smollm2(1), &InferParams::new(602, "smollm2", &follow, off));
    assert_eq!(reused, alone, "cached blocks of a speculating answer are exact");
}
