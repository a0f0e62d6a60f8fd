//! A model's vocabulary as the grammar engine sees it, built once per model.

use crate::grammar::{grammar_of, CompileError};
use crate::mask::TokenMask;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use llmr_engine_types::Constraint;
use std::fmt;
use std::sync::Arc;

/// The bytes one token id stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenBytes {
    /// Ordinary text: the bytes it adds to the output.
    Text(Vec<u8>),
    /// A control token (`<|im_end|>`, `<start_of_turn>`): never produced by text, allowed only
    /// where a grammar names it.
    Special(String),
    /// No token has this id (padding rows of the output head).
    Unused,
}

/// Why a vocabulary could not be built; engines then answer constrained requests with
/// UNSUPPORTED and serve the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VocabularyError(pub String);

impl fmt::Display for VocabularyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "constrained output is unavailable for this model: {}", self.0)
    }
}

impl std::error::Error for VocabularyError {}

/// A model's tokens compiled for llguidance: shared by every constrained request on the model.
pub struct Vocabulary {
    factory: ParserFactory,
    end_ids: Arc<[u32]>,
}

impl Vocabulary {
    /// `tokens[id]` for every id the logits have (`tokens.len()` is the logits' length);
    /// `end_ids` are the tokens that end a generation (EOS, end of turn), the first the primary.
    pub fn new(tokens: Vec<TokenBytes>, end_ids: &[u32]) -> Result<Self, VocabularyError> {
        let n = tokens.len();
        if end_ids.is_empty() {
            return Err(VocabularyError("the model has no end-of-generation token".into()));
        }
        if let Some(&bad) = end_ids.iter().find(|&&id| id as usize >= n) {
            return Err(VocabularyError(format!("end token {bad} is beyond the vocabulary of {n}")));
        }
        let words: Vec<Vec<u8>> = tokens
            .into_iter()
            .map(|t| match t {
                TokenBytes::Text(bytes) => bytes,
                TokenBytes::Special(name) => [&[TokTrie::SPECIAL_TOKEN_MARKER][..], name.as_bytes()].concat(),
                TokenBytes::Unused => Vec::new(),
            })
            .collect();
        let info = TokRxInfo::new(n as u32, end_ids[0]);
        // The trie builder asserts on inputs it cannot take; a vocabulary it refuses must not
        // take the engine down with it.
        let built = std::panic::catch_unwind(|| {
            let trie = TokTrie::from(&info, &words).with_eos_tokens(end_ids);
            let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
            ParserFactory::new_simple(&env)
        });
        let mut factory = match built {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => return Err(VocabularyError(e.to_string())),
            Err(_) => return Err(VocabularyError("the token trie could not be built".into())),
        };
        // Grammar warnings go to the request's error, not to the process's stderr.
        factory.set_stderr_log_level(0);
        Ok(Vocabulary { factory, end_ids: end_ids.into() })
    }

    /// From a Hugging Face `tokenizer.json` (byte-level BPE or SentencePiece with byte fallback),
    /// padded with unused ids to `n_logits`.
    pub fn from_tokenizer_json(json: &str, n_logits: usize, end_ids: &[u32]) -> Result<Self, VocabularyError> {
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| VocabularyError(format!("tokenizer.json: {e}")))?;
        let words = std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&value))
            .map_err(|_| VocabularyError("tokenizer.json: a token could not be read".into()))?
            .map_err(|e| VocabularyError(format!("tokenizer.json: {e}")))?;
        if words.len() > n_logits {
            return Err(VocabularyError(format!(
                "tokenizer.json has {} tokens, more than the model's {n_logits} outputs",
                words.len()
            )));
        }
        let mut tokens: Vec<TokenBytes> = words
            .into_iter()
            .map(|w| match w.split_first() {
                None => TokenBytes::Unused,
                Some((&TokTrie::SPECIAL_TOKEN_MARKER, name)) => {
                    TokenBytes::Special(String::from_utf8_lossy(name).into_owned())
                }
                Some(_) => TokenBytes::Text(w),
            })
            .collect();
        tokens.resize(n_logits, TokenBytes::Unused);
        Self::new(tokens, end_ids)
    }

    /// A request's mask, at the start of its output. A grammar that does not compile is an error
    /// naming what is wrong in it.
    pub fn compile(&self, constraint: &Constraint) -> Result<TokenMask, CompileError> {
        let grammar = grammar_of(constraint)?;
        let parser = self.factory.create_parser(grammar).map_err(|e| CompileError(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(CompileError(e));
        }
        Ok(TokenMask::new(matcher, self.end_ids.clone()))
    }
}
