//! The native engine against llama.cpp on the same weights: SmolLM2 converted once into a bf16
//! safetensors folder and an F16 GGUF holding the identical values (`scripts/convert_gguf_hf.py`).
//! llama.cpp generates 64 greedy tokens for each of 50 prompts; the native engine reads each
//! prompt and that continuation in one forward pass, and its top-1 token at every position is
//! compared with llama.cpp's choice (teacher forcing, so one early near-tie does not decide the
//! rest). The two differ only in arithmetic (f16 vs f32 accumulation, kernel order).

use crate::support::{cached_model, instance, llama_plugin};
use llmr_engine_host::{Format, InferParams, ModelSpec, Sampling};
use llmr_native_engine::arch::{BatchToken, Model, Scratch};
use llmr_native_engine::checkpoint::Checkpoint;
use llmr_native_engine::config::ModelConfig;
use llmr_native_engine::kv_cache::{BlockTable, KvPool, Shape};
use llmr_native_engine::tokenizer::ModelTokenizer;

const GENERATED: usize = 64;

/// 50 prompts of different kinds: chat turns, prose, code, lists, facts.
fn prompts() -> Vec<String> {
    let topics = [
        "the ocean",
        "a bicycle",
        "the moon",
        "bread",
        "a library",
        "winter",
        "a violin",
        "volcanoes",
        "trains",
        "honey bees",
    ];
    let mut out = Vec::new();
    for t in topics {
        out.push(format!(
            "<|im_start|>user\nTell me something interesting about {t}.<|im_end|>\n<|im_start|>assistant\n"
        ));
        out.push(format!("Here is a short story about {t}. Once upon a time,"));
        out.push(format!("# Python: a class that models {t}\nclass "));
        out.push(format!("Five facts about {t}:\n1."));
        out.push(format!("<|im_start|>system\nYou answer in French.<|im_end|>\n<|im_start|>user\nDescribe {t}.<|im_end|>\n<|im_start|>assistant\n"));
    }
    out
}

#[test]
fn greedy_choices_agree_with_llama_cpp_on_the_same_weights() {
    let hf = cached_model("smollm2-hf");
    let gguf = cached_model("smollm2-135m-instruct-f16.gguf");
    let llama = instance(&llama_plugin(), 4);
    llama.load_model(&ModelSpec::new("ref", Format::Gguf, gguf.display().to_string())).unwrap();
    let prompts = prompts();
    // llama.cpp's greedy continuations, four at a time.
    let continuations: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .chunks(prompts.len().div_ceil(4))
            .enumerate()
            .map(|(c, chunk)| {
                let llama = &llama;
                s.spawn(move || {
                    chunk
                        .iter()
                        .enumerate()
                        .map(|(i, p)| {
                            let mut params = InferParams::new((c * 100 + i) as u64, "ref", p, Sampling::greedy());
                            params.sampling.max_tokens = Some(GENERATED as u32);
                            params.ignore_eos = true;
                            let mut ids = Vec::new();
                            llama
                                .infer(&params, |t| {
                                    ids.push(t.token_id as u32);
                                    true
                                })
                                .unwrap();
                            ids
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });

    let config = ModelConfig::read(&hf.join("config.json")).unwrap();
    let checkpoint = Checkpoint::open(&hf.join("model.safetensors")).unwrap();
    let model = Model::load(&config, &checkpoint).unwrap();
    let tokenizer = ModelTokenizer::load(&hf, config.vocab, &config.eos, config.bos).unwrap();
    let shape = Shape { layers: config.layers, kv_heads: config.kv_heads, head_dim: config.head_dim };
    let (mut agree, mut total) = (0usize, 0usize);
    for (prompt, generated) in prompts.iter().zip(&continuations) {
        assert_eq!(generated.len(), GENERATED, "llama.cpp generated fewer tokens for {prompt:?}");
        let prompt_ids = tokenizer.encode(prompt, true, true).unwrap();
        let reference: Vec<u32> =
            llama.tokenize("ref", prompt, true, true).unwrap().into_iter().map(|t| t as u32).collect();
        assert_eq!(prompt_ids, reference, "the tokenizers disagree on {prompt:?}");
        let tokens: Vec<u32> = prompt_ids.iter().chain(generated).copied().collect();
        let mut pool = KvPool::new(shape, tokens.len().div_ceil(16));
        let mut table = BlockTable::default();
        pool.reserve(&mut table, tokens.len()).unwrap();
        table.len = tokens.len();
        let first = prompt_ids.len() - 1;
        let batch: Vec<BatchToken> = tokens
            .iter()
            .enumerate()
            .map(|(pos, &token)| BatchToken { token, seq: 0, pos, logits: pos >= first && pos + 1 < tokens.len() })
            .collect();
        let logits = model.forward(&mut pool, &[&table], &batch, &mut Scratch::default());
        for (row, want) in logits.chunks_exact(config.vocab).zip(generated) {
            let got = llmr_sampling::argmax(row) as u32;
            agree += usize::from(got == *want);
            total += 1;
        }
    }
    let rate = agree as f64 / total as f64;
    eprintln!("top-1 agreement with llama.cpp: {agree}/{total} = {:.2}%", rate * 100.0);
    assert_eq!(total, prompts.len() * GENERATED);
    assert!(rate >= 0.99, "top-1 agreement {:.2}% is below 99%", rate * 100.0);
}
