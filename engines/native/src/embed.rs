//! Embeddings from a decoder: each input runs through the model on the scheduler's thread, one
//! prompt-sized chunk per turn between generation steps, on blocks of its own that are freed
//! once it is read and never enter the prefix index; its final hidden states are pooled.
//!
//! Pooling is what the checkpoint's sentence-transformers files say (`modules.json` naming a
//! `Pooling` module whose `config.json` sets `pooling_mode_mean_tokens` or
//! `pooling_mode_lasttoken`), else the last token, as decoder embedding models (Qwen3-Embedding,
//! gte-Qwen2, e5-mistral) and the llama.cpp plugin's decoders do.

use crate::arch::{BatchToken, Model, Scratch};
use crate::kv_cache::{BlockTable, KvPool};
use llmr_engine_sdk::{EngineError, ErrorCode};
use std::path::Path;
use std::sync::mpsc::Sender;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The hidden state of the input's last token.
    Last,
    /// The mean of every token's hidden state.
    Mean,
}

impl Pooling {
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Last => "last",
            Pooling::Mean => "mean",
        }
    }

    /// The pooling the model folder `dir` declares for sentence-transformers; `Last` when it
    /// declares none or one this engine does not compute (CLS, max: an encoder's).
    pub fn of_model(dir: &Path) -> Pooling {
        let read =
            |p: &Path| -> Option<serde_json::Value> { serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok() };
        let modules = read(&dir.join("modules.json"));
        let folder = modules
            .as_ref()
            .and_then(|m| m.as_array())
            .and_then(|list| {
                list.iter().find(|m| m.get("type").and_then(|t| t.as_str()).is_some_and(|t| t.ends_with(".Pooling")))
            })
            .and_then(|m| m.get("path").and_then(|p| p.as_str()).map(str::to_string));
        // The module's folder must be a plain name inside the model's folder.
        let Some(folder) =
            folder.filter(|f| Path::new(f).components().all(|c| matches!(c, std::path::Component::Normal(_))))
        else {
            return Pooling::Last;
        };
        let Some(config) = read(&dir.join(folder).join("config.json")) else { return Pooling::Last };
        let on = |key: &str| config.get(key).and_then(|v| v.as_bool()).unwrap_or(false);
        if on("pooling_mode_mean_tokens") && !on("pooling_mode_lasttoken") {
            Pooling::Mean
        } else {
            Pooling::Last
        }
    }
}

pub struct EmbedJob {
    /// Token ids of each input (none empty).
    pub inputs: Vec<Vec<u32>>,
    pub normalize: bool,
    pub pooling: Pooling,
    /// One vector per input, in order, or the failure.
    pub reply: Sender<Result<Vec<Vec<f32>>, EngineError>>,
}

/// What an embedding pass borrows from the scheduler.
pub struct EmbedContext<'a> {
    pub model: &'a Model,
    pub pool: &'a mut KvPool,
    pub threads: &'a rayon::ThreadPool,
    pub scratch: &'a mut Scratch,
    pub chunk: usize,
}

/// An embedding request in progress. It advances one prompt chunk per scheduler turn, between
/// generation steps, so a large batch of inputs does not stall the streams running beside it.
pub struct EmbedRun {
    job: EmbedJob,
    /// The input being read, and how many of its tokens are in `table`.
    input: usize,
    read: usize,
    table: BlockTable,
    pooled: Vec<f32>,
    done: Vec<Vec<f32>>,
}

impl EmbedRun {
    pub fn new(job: EmbedJob) -> Self {
        let done = Vec::with_capacity(job.inputs.len());
        EmbedRun { job, input: 0, read: 0, table: BlockTable::default(), pooled: Vec::new(), done }
    }

    /// Reads the next chunk; once the job is answered (every vector, or the failure), frees
    /// its blocks and returns true.
    pub fn advance(&mut self, ctx: &mut EmbedContext<'_>) -> bool {
        if self.job.inputs.is_empty() {
            let _ = self.job.reply.send(Ok(Vec::new()));
            return true;
        }
        match self.chunk(ctx) {
            Ok(false) => false,
            Ok(true) => {
                let _ = self.job.reply.send(Ok(std::mem::take(&mut self.done)));
                true
            }
            Err(e) => {
                self.abandon(ctx.pool, e);
                true
            }
        }
    }

    /// Answers the job with `error` and frees its blocks.
    pub fn abandon(&mut self, pool: &mut KvPool, error: EngineError) {
        pool.free_table(&mut self.table);
        let _ = self.job.reply.send(Err(error));
    }

    /// One chunk of the current input; true when the last input is done.
    fn chunk(&mut self, ctx: &mut EmbedContext<'_>) -> Result<bool, EngineError> {
        let pooling = self.job.pooling;
        let input = &self.job.inputs[self.input];
        let (start, end) = (self.read, (self.read + ctx.chunk.max(1)).min(input.len()));
        ctx.pool.reserve(&mut self.table, end - start).map_err(|full| {
            EngineError::new(
                ErrorCode::OomRam,
                format!(
                    "no room in the KV cache for an input of {} tokens while requests run ({} blocks short); retry",
                    input.len(),
                    full.0
                ),
            )
        })?;
        let batch: Vec<BatchToken> = (start..end)
            .map(|pos| BatchToken {
                token: input[pos],
                seq: 0,
                pos,
                logits: pooling == Pooling::Mean || pos + 1 == input.len(),
            })
            .collect();
        self.table.len = end;
        self.read = end;
        let (model, pool, scratch) = (ctx.model, &mut *ctx.pool, &mut *ctx.scratch);
        let tables = [&self.table];
        let hidden = ctx
            .threads
            .install(|| model.hidden(pool, &tables, &batch, scratch))
            .map_err(|e| EngineError::new(ErrorCode::Internal, format!("the forward pass failed: {e}")))?;
        let rows = batch.iter().filter(|b| b.logits).count();
        if let Some(d) = hidden.len().checked_div(rows) {
            self.pooled.resize(d, 0.0);
            for row in hidden.chunks_exact(d) {
                for (p, h) in self.pooled.iter_mut().zip(row) {
                    *p += h;
                }
            }
        }
        if end < input.len() {
            return Ok(false);
        }
        // The input is read: pool it, and free its blocks for the next.
        let mut v = std::mem::take(&mut self.pooled);
        if pooling == Pooling::Mean {
            let n = input.len() as f32;
            v.iter_mut().for_each(|p| *p /= n);
        }
        if self.job.normalize {
            llmr_engine_sdk::vectors::l2_normalize(&mut v);
        }
        self.done.push(v);
        ctx.pool.free_table(&mut self.table);
        self.table = BlockTable::default();
        (self.input, self.read) = (self.input + 1, 0);
        Ok(self.input == self.job.inputs.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_follows_the_sentence_transformers_files() {
        let dir = std::env::temp_dir().join(format!("llmr-native-pooling-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
        assert_eq!(Pooling::of_model(&dir), Pooling::Last);
        let modules = r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
            {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#;
        std::fs::write(dir.join("modules.json"), modules).unwrap();
        let config = |mean: bool, last: bool| {
            format!(
                r#"{{"word_embedding_dimension":64,"pooling_mode_mean_tokens":{mean},"pooling_mode_lasttoken":{last}}}"#
            )
        };
        std::fs::write(dir.join("1_Pooling/config.json"), config(true, false)).unwrap();
        assert_eq!(Pooling::of_model(&dir), Pooling::Mean);
        std::fs::write(dir.join("1_Pooling/config.json"), config(false, true)).unwrap();
        assert_eq!(Pooling::of_model(&dir), Pooling::Last);
        // A module path that leaves the folder is not followed, even to a mean-pooling config.
        std::fs::write(dir.join("1_Pooling/config.json"), config(true, false)).unwrap();
        let name = dir.file_name().unwrap().to_str().unwrap();
        let escaping = modules.replace("\"1_Pooling\"", &format!("\"../{name}/1_Pooling\""));
        std::fs::write(dir.join("modules.json"), escaping).unwrap();
        assert_eq!(Pooling::of_model(&dir), Pooling::Last);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
