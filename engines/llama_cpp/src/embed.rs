//! Embeddings: a worker thread per model owns a context made for pooled outputs.
//!
//! Encoder models (BERT-like) use the pooling their GGUF declares; decoder models are pooled on
//! their last token. Inputs are packed several to a batch, one sequence each.

use crate::backend;
use llama_cpp_2::context::params::{LlamaContextParams, LlamaPoolingType};
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llmr_engine_sdk::{EngineError, ErrorCode};
use std::num::NonZeroU32;
use std::sync::mpsc::{Receiver, Sender};

const MAX_SEQS: u32 = 16;

pub struct EmbedJob {
    pub inputs: Vec<Vec<LlamaToken>>,
    pub normalize: bool,
    /// One vector per input, in order, or the failure.
    pub reply: Sender<Result<Vec<Vec<f32>>, EngineError>>,
}

pub struct EmbedSettings {
    pub pooling: LlamaPoolingType,
    /// Most tokens one input may have (and the batch size).
    pub n_ctx: u32,
    pub threads: u32,
}

pub fn run(model: &LlamaModel, s: EmbedSettings, jobs: Receiver<EmbedJob>, ready: Sender<Result<(), EngineError>>) {
    let params = LlamaContextParams::default()
        .with_embeddings(true)
        .with_pooling_type(s.pooling)
        .with_n_ctx(NonZeroU32::new(s.n_ctx))
        .with_n_batch(s.n_ctx)
        // Non-causal attention needs a whole sequence in one micro-batch.
        .with_n_ubatch(s.n_ctx)
        .with_n_seq_max(MAX_SEQS)
        .with_kv_unified(true)
        .with_n_threads(s.threads as i32)
        .with_n_threads_batch(s.threads as i32);
    backend::clear_last_error();
    let mut ctx = match model.new_context(backend::backend(), params) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(EngineError::new(
                ErrorCode::OomRam,
                format!("cannot create an embeddings context: {e} {}", backend::last_error()),
            )));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let mut batch = LlamaBatch::new(s.n_ctx as usize, MAX_SEQS as i32);
    for job in jobs {
        let mut out: Vec<Vec<f32>> = Vec::with_capacity(job.inputs.len());
        let mut result = Ok(());
        let mut start = 0;
        while start < job.inputs.len() && result.is_ok() {
            // Pack inputs while they fit.
            let mut end = start;
            let mut tokens = 0usize;
            while end < job.inputs.len()
                && end - start < MAX_SEQS as usize
                && tokens + job.inputs[end].len() <= s.n_ctx as usize
            {
                tokens += job.inputs[end].len();
                end += 1;
            }
            if end == start {
                result = Err(EngineError::new(
                    ErrorCode::Unsupported,
                    format!(
                        "input {start} has {} tokens; this model embeds at most {}",
                        job.inputs[start].len(),
                        s.n_ctx
                    ),
                ));
                break;
            }
            batch.clear();
            for (seq, input) in job.inputs[start..end].iter().enumerate() {
                for (pos, &t) in input.iter().enumerate() {
                    batch.add(t, pos as i32, &[seq as i32], true).expect("batch sized to n_ctx");
                }
            }
            ctx.clear_kv_cache();
            if let Err(e) = ctx.decode(&mut batch) {
                result = Err(EngineError::internal(format!("embedding decode failed: {e}")));
                break;
            }
            for seq in 0..(end - start) {
                match ctx.embeddings_seq_ith(seq as i32) {
                    Ok(v) => {
                        let mut v = v.to_vec();
                        if job.normalize {
                            llmr_engine_sdk::vectors::l2_normalize(&mut v);
                        }
                        out.push(v);
                    }
                    Err(e) => {
                        result = Err(EngineError::internal(format!("no pooled embedding: {e}")));
                        break;
                    }
                }
            }
            start = end;
        }
        let _ = job.reply.send(result.map(|()| out));
    }
}
