//! Embeddings of a decoder (SmolLM2 in Hugging Face layout) through the plugin: the same vectors
//! as llama.cpp computes from the F16 GGUF of the same weights, pooling as the model folder
//! declares it, chunked inputs, and no interference with a generation running beside them.

use crate::support::{cached_model, engine, instance, llama_plugin, spec};
use llmr_engine_host::{EngineInstance, Format, InferParams, ModelSpec, Sampling};
use llmr_native_engine::kernels::linear::bf16_products_here;
use std::path::{Path, PathBuf};

const TEXTS: [&str; 3] = [
    "The capital of France is Paris.",
    "Photosynthesis turns sunlight, water and carbon dioxide into sugar.",
    "fn main() { println!(\"hello\"); }",
];

/// One vector per input, and the token count the engine reports.
pub(crate) fn embed(e: &EngineInstance, model: &str, inputs: &[&str], normalize: bool) -> (Vec<Vec<f32>>, u32) {
    let mut out = vec![Vec::new(); inputs.len()];
    let tokens = e
        .embed(1, model, inputs, normalize, |i, v| {
            out[i] = v.to_vec();
            true
        })
        .unwrap();
    (out, tokens)
}

pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn last_token_embeddings_match_llama_cpp_on_the_same_weights() {
    let native = engine(2);
    native.load_model(&spec("smollm2", &cached_model("smollm2-hf"))).unwrap();
    let info = native.model_info("smollm2").unwrap();
    assert_eq!(info.pooling.as_deref(), Some("last"));
    assert!(info.capabilities.iter().any(|c| c.as_str() == "embedding"), "{info:?}");
    let llama = instance(&llama_plugin(), 2);
    let gguf = cached_model("smollm2-135m-instruct-f16.gguf");
    llama.load_model(&ModelSpec::new("ref", Format::Gguf, gguf.display().to_string())).unwrap();

    let (ours, tokens) = embed(&native, "smollm2", &TEXTS, true);
    let (theirs, their_tokens) = embed(&llama, "ref", &TEXTS, true);
    assert_eq!(tokens, their_tokens, "both engines embed the same tokens");
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(a.len(), 576, "SmolLM2's hidden size");
        let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "input {i}: norm {norm}");
        let c = cosine(a, b);
        eprintln!("input {i}: cosine with llama.cpp {c:.6}");
        assert!(c > 0.999, "input {i}: cosine {c} with llama.cpp's vector");
    }
    // Different texts give clearly different vectors; the same text the same one.
    assert!(cosine(&ours[0], &ours[1]) < 0.99);
    let (again, _) = embed(&native, "smollm2", &TEXTS[..1], true);
    assert_eq!(again[0], ours[0]);
    // Unnormalised: the same direction, not unit length.
    let (raw, _) = embed(&native, "smollm2", &TEXTS[..1], false);
    let norm: f32 = raw[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() > 0.1, "norm {norm}");
    assert!(cosine(&raw[0], &ours[0]) > 0.99999);
}

#[test]
fn long_inputs_run_in_chunks_and_a_generation_beside_them_is_undisturbed() {
    let e = engine(2);
    e.load_model(&spec("smollm2", &cached_model("smollm2-hf"))).unwrap();
    let long = TEXTS.join(" ").repeat(4);
    let (whole, tokens) = embed(&e, "smollm2", &[&long], false);
    assert!(tokens > 60, "{tokens} tokens");
    e.set_config(Some("smollm2"), "prefill_chunk", &serde_json::json!(16)).unwrap();
    let (chunked, _) = embed(&e, "smollm2", &[&long], false);
    // The chunks take other kernels (dot products below 64 rows, GEMM above): rounding only.
    // With bf16 products the whole input's attention multiplies in bf16 (values and weights
    // rounded) where 16-token chunks keep f32, and on an AMX CPU its projections run on tiles,
    // summed in another order than the dot kernels': a value on the other side of a bf16
    // rounding moves the next layer's input by up to 2^-8 of itself, so the bound is a bf16
    // step.
    let bound = if bf16_products_here() { 4e-3 } else { 1e-4 };
    let scale = whole[0].iter().fold(0f32, |m, x| m.max(x.abs()));
    let d = max_diff(&whole[0], &chunked[0]) / scale;
    assert!(d < bound, "chunks of 16 tokens move the vector by {d} of its largest element ({scale})");

    let story = "Once upon a time, in a small village,";
    let params = |id| InferParams::new(id, "smollm2", story, Sampling { max_tokens: Some(48), ..Sampling::greedy() });
    let generate = |id| {
        let mut text = String::new();
        e.infer(&params(id), |t| {
            text.push_str(&t.text);
            true
        })
        .unwrap();
        text
    };
    let alone = generate(10);
    let (beside, during) = std::thread::scope(|s| {
        let g = s.spawn(|| generate(11));
        let mut vectors = Vec::new();
        for _ in 0..4 {
            vectors.push(embed(&e, "smollm2", &[&long], false).0.remove(0));
        }
        (g.join().unwrap(), vectors)
    });
    assert_eq!(beside, alone, "embeddings between its steps leave a generation's text as it was");
    for v in &during {
        assert!(max_diff(v, &chunked[0]) < 1e-5, "an embedding computed during a generation differs");
    }
}

/// `dir` holding links to SmolLM2's files and sentence-transformers files asking for mean pooling.
fn mean_pooled_copy(dir: &Path) -> PathBuf {
    let src = cached_model("smollm2-hf");
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::os::unix::fs::symlink(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(
        dir.join("modules.json"),
        r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
            {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("1_Pooling/config.json"),
        r#"{"word_embedding_dimension":576,"pooling_mode_cls_token":false,"pooling_mode_mean_tokens":true,
            "pooling_mode_max_tokens":false,"pooling_mode_lasttoken":false}"#,
    )
    .unwrap();
    dir.to_path_buf()
}

#[test]
fn mean_pooling_comes_from_the_model_folder_and_agrees_with_last_on_one_token() {
    let dir = mean_pooled_copy(&std::env::temp_dir().join(format!("llmr-native-mean-{}", std::process::id())));
    let e = engine(1);
    e.load_model(&spec("mean", &dir)).unwrap();
    e.load_model(&spec("last", &cached_model("smollm2-hf"))).unwrap();
    assert_eq!(e.model_info("mean").unwrap().pooling.as_deref(), Some("mean"));
    let (mean, _) = embed(&e, "mean", &TEXTS, true);
    let (last, _) = embed(&e, "last", &TEXTS, true);
    for (m, l) in mean.iter().zip(&last) {
        assert!(cosine(m, l) < 0.99, "mean and last pooling of a sentence should differ");
    }
    // One token: its mean is itself.
    let (one_mean, n) = embed(&e, "mean", &["Paris"], true);
    assert_eq!(n, 1, "\"Paris\" is one SmolLM2 token");
    let (one_last, _) = embed(&e, "last", &["Paris"], true);
    assert!(max_diff(&one_mean[0], &one_last[0]) < 1e-6);
    let _ = std::fs::remove_dir_all(&dir);
}
