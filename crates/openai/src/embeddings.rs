//! `/v1/embeddings`.

use crate::ApiError;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// Inputs per request; more is almost always a client bug, and each costs a forward pass.
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

#[derive(Debug, Deserialize)]
pub struct EmbeddingRequest {
    pub model: String,
    pub input: EmbeddingInput,
    #[serde(default)]
    pub encoding_format: Option<String>,
    #[serde(default)]
    pub dimensions: Option<i64>,
    #[serde(default)]
    pub user: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodingFormat {
    Float,
    Base64,
}

/// What to embed: texts, or token ids of the model's vocabulary (OpenAI accepts both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmbedInputs {
    Texts(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

impl EmbedInputs {
    pub fn len(&self) -> usize {
        match self {
            EmbedInputs::Texts(v) => v.len(),
            EmbedInputs::Tokens(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Clone)]
pub struct EmbedRequest {
    pub model: String,
    pub inputs: EmbedInputs,
    pub format: EncodingFormat,
    pub dimensions: Option<usize>,
}

/// Token ids from the wire: not empty, each a vocabulary index (whether the model has it is the
/// node's check, which knows the vocabulary).
pub(crate) fn token_ids(ids: Vec<i64>, param: &str) -> Result<Vec<u32>, ApiError> {
    if ids.is_empty() {
        return Err(ApiError::invalid(param, "must not be an empty list of token ids"));
    }
    ids.iter()
        .enumerate()
        .map(|(i, &id)| {
            u32::try_from(id)
                .map_err(|_| ApiError::invalid(&format!("{param}[{i}]"), format!("{id} is not a token id")))
        })
        .collect()
}

impl EmbeddingRequest {
    pub fn validate(self) -> Result<EmbedRequest, ApiError> {
        if self.model.trim().is_empty() {
            return Err(ApiError::invalid("model", "must not be empty"));
        }
        let inputs = match self.input {
            EmbeddingInput::Text(t) => EmbedInputs::Texts(vec![t]),
            EmbeddingInput::Texts(v) => EmbedInputs::Texts(v),
            EmbeddingInput::Tokens(ids) => EmbedInputs::Tokens(vec![token_ids(ids, "input")?]),
            EmbeddingInput::TokenLists(lists) => EmbedInputs::Tokens(
                lists
                    .into_iter()
                    .enumerate()
                    .map(|(i, ids)| token_ids(ids, &format!("input[{i}]")))
                    .collect::<Result<_, _>>()?,
            ),
        };
        if inputs.is_empty() {
            return Err(ApiError::invalid("input", "must contain at least one input"));
        }
        if inputs.len() > MAX_EMBEDDING_INPUTS {
            return Err(ApiError::invalid("input", format!("at most {MAX_EMBEDDING_INPUTS} inputs per request")));
        }
        if let EmbedInputs::Texts(texts) = &inputs {
            if let Some(i) = texts.iter().position(|s| s.trim().is_empty()) {
                return Err(ApiError::invalid(&format!("input[{i}]"), "must not be empty or whitespace only"));
            }
        }
        let format = match self.encoding_format.as_deref() {
            None | Some("float") => EncodingFormat::Float,
            Some("base64") => EncodingFormat::Base64,
            Some(other) => {
                return Err(ApiError::invalid("encoding_format", format!("`{other}` is not one of `float`, `base64`")))
            }
        };
        let dimensions = match self.dimensions {
            None => None,
            Some(d) if d >= 1 => Some(d as usize),
            Some(d) => return Err(ApiError::invalid("dimensions", format!("{d} is invalid; it must be >= 1"))),
        };
        Ok(EmbedRequest { model: self.model, inputs, format, dimensions })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EmbeddingList {
    /// `list`
    pub object: String,
    pub data: Vec<EmbeddingObject>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EmbeddingObject {
    /// `embedding`
    pub object: String,
    pub index: u32,
    pub embedding: EmbeddingValue,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingValue {
    Float(Vec<f32>),
    /// Little-endian f32 bytes, base64: what the OpenAI SDKs decode.
    Base64(String),
}

impl EmbeddingValue {
    pub fn encode(values: Vec<f32>, format: EncodingFormat) -> Self {
        match format {
            EncodingFormat::Float => EmbeddingValue::Float(values),
            EncodingFormat::Base64 => {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                EmbeddingValue::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            }
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct EmbeddingUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_body;

    #[test]
    fn inputs_and_formats() {
        let r = parse_body::<EmbeddingRequest>(br#"{"model":"m","input":["a","b"],"encoding_format":"base64"}"#)
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!((r.inputs.len(), r.format), (2, EncodingFormat::Base64));
        let e = parse_body::<EmbeddingRequest>(br#"{"model":"m","input":["a"," "]}"#).unwrap().validate().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[1]"));
        let e = parse_body::<EmbeddingRequest>(br#"{"model":"m","input":[]}"#).unwrap().validate().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input"));
        // Token ids: one list or several; each id a vocabulary index.
        let tokens = |json: &[u8]| parse_body::<EmbeddingRequest>(json).unwrap().validate();
        assert_eq!(
            tokens(br#"{"model":"m","input":[12,34]}"#).unwrap().inputs,
            EmbedInputs::Tokens(vec![vec![12, 34]])
        );
        assert_eq!(
            tokens(br#"{"model":"m","input":[[1],[2,3]]}"#).unwrap().inputs,
            EmbedInputs::Tokens(vec![vec![1], vec![2, 3]])
        );
        assert_eq!(tokens(br#"{"model":"m","input":[[1],[2,-3]]}"#).unwrap_err().param.as_deref(), Some("input[1][1]"));
        assert_eq!(tokens(br#"{"model":"m","input":[[1],[]]}"#).unwrap_err().param.as_deref(), Some("input[1]"));
        match EmbeddingValue::encode(vec![1.0, -2.0], EncodingFormat::Base64) {
            EmbeddingValue::Base64(s) => {
                let bytes = base64::engine::general_purpose::STANDARD.decode(s).unwrap();
                assert_eq!(f32::from_le_bytes(bytes[4..8].try_into().unwrap()), -2.0);
            }
            _ => panic!("expected base64"),
        }
    }
}
