use llmr_model_store::gguf::GgufHeader;
use std::path::PathBuf;
#[test]
fn dump() {
    let dir = PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/llmr/models");
    for f in [
        "smollm2-135m-instruct-q4_1.gguf",
        "all-minilm-l6-v2-f16.gguf",
        "gemma-3-270m-q4_k_m.gguf",
        "tiny-random-llama.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ] {
        let t = std::time::Instant::now();
        let h = GgufHeader::open(&dir.join(f)).unwrap();
        let el = t.elapsed();
        eprintln!("{f}: {el:?} v{} tensors {} arch {:?} name {:?} ctx {:?} emb {:?} blocks {:?} q {:?} ft {:?} pool {:?} causal {:?} bos {:?} {:?} eos {:?} {:?} tmpl {:?}",
          h.version, h.tensor_count, h.architecture(), h.name(), h.context_length(), h.embedding_length(), h.block_count(), h.quantization(), h.file_type(), h.pooling_type(), h.causal_attention(), h.bos_token_id(), h.bos_token(), h.eos_token_id(), h.eos_token(), h.chat_template().map(|t| &t[..t.len().min(60)]));
        for (k, v) in &h.metadata {
            if let Some(a) = v.as_array() {
                eprintln!("   {k}: array {:?} len {} loaded {}", a.elem_type, a.len, a.is_loaded());
            }
        }
    }
}
