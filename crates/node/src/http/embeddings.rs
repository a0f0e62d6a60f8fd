//! `POST /v1/embeddings`.

use super::pipeline::{self, record_model};
use super::{parse_json, SharedState};
use crate::error::NodeError;
use crate::metrics as m;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use llmr_engine_host::{Capability, EmbedInputs as HostInputs};
use llmr_openai::{
    ApiError, EmbedInputs, EmbeddingList, EmbeddingObject, EmbeddingRequest, EmbeddingUsage, EmbeddingValue,
};
use llmr_telemetry::RequestId;
use std::sync::atomic::{AtomicU64, Ordering};

const ENDPOINT: &str = "embeddings";

/// Embedding request ids live in their own range so they never collide with generations'.
static NEXT_ID: AtomicU64 = AtomicU64::new(1 << 62);

pub async fn handle(State(state): State<SharedState>, id: RequestId, body: Result<Bytes, BytesRejection>) -> Response {
    pipeline::respond(ENDPOINT, &id, async {
        let req = parse_json::<EmbeddingRequest>(body, state.body_limit)?.validate()?;
        let model = state.models.get(&req.model).await?;
        record_model(&model);
        // Counted once the model is known: request JSON must not create metric series.
        metrics::counter!(m::REQUESTS, "endpoint" => ENDPOINT, "model" => model.name.clone()).increment(1);
        model.require(Capability::Embedding)?;
        if let (EmbedInputs::Tokens(lists), Some(vocab)) = (&req.inputs, model.engine.info().vocab_size) {
            for (i, ids) in lists.iter().enumerate() {
                pipeline::check_vocabulary(ids, vocab, &format!("input[{i}]"))?;
            }
        }
        let permit = model.admission.admit().await?;
        let request_id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let tokens = matches!(req.inputs, EmbedInputs::Tokens(_));
        let inputs = req.inputs.clone();
        let engine_model = model.clone();
        let (vectors, prompt_tokens) = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let (texts, ids): (Vec<&str>, Vec<Vec<i32>>) = match &inputs {
                EmbedInputs::Texts(t) => (t.iter().map(String::as_str).collect(), Vec::new()),
                EmbedInputs::Tokens(lists) => {
                    (Vec::new(), lists.iter().map(|l| l.iter().map(|&id| id as i32).collect()).collect())
                }
            };
            let id_refs: Vec<&[i32]> = ids.iter().map(Vec::as_slice).collect();
            let engine_inputs = if tokens { HostInputs::Tokens(&id_refs) } else { HostInputs::Texts(&texts) };
            let mut vectors: Vec<Vec<f32>> = vec![Vec::new(); inputs.len()];
            let tokens = engine_model.engine.embed(request_id, engine_inputs, true, &mut |i, v| {
                if let Some(slot) = vectors.get_mut(i) {
                    *slot = v.to_vec();
                }
                true
            })?;
            Ok::<_, NodeError>((vectors, tokens))
        })
        .await
        .map_err(|e| NodeError::Internal(format!("embedding panicked: {e}")))?
        // Token ids the engine cannot take (it has no token input) are the client's to change.
        .map_err(|e| pipeline::Blame(tokens.then_some("input")).error(e))?;
        let mut data = Vec::with_capacity(vectors.len());
        for (i, mut v) in vectors.into_iter().enumerate() {
            if let Some(d) = req.dimensions {
                if d > v.len() {
                    return Err(ApiError::invalid(
                        "dimensions",
                        format!("{d} is more than the model's {} dimensions", v.len()),
                    ));
                }
                // Shortened embeddings are re-normalized, as OpenAI's are.
                v.truncate(d);
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                if norm > 0.0 {
                    v.iter_mut().for_each(|x| *x /= norm);
                }
            }
            data.push(EmbeddingObject {
                object: "embedding".into(),
                index: i as u32,
                embedding: EmbeddingValue::encode(v, req.format),
            });
        }
        let list = EmbeddingList {
            object: "list".into(),
            data,
            model: model.name.clone(),
            usage: EmbeddingUsage { prompt_tokens, total_tokens: prompt_tokens },
        };
        Ok(Json(list).into_response())
    })
    .await
}
