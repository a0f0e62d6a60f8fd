//! The model's own tokenizer (`tokenizer.json`, through the `tokenizers` crate) and what
//! `tokenizer_config.json` / `generation_config.json` say about it: the chat template, the
//! BOS/EOS tokens, and which ids end a generation.

use serde::{Deserialize, Deserializer};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokenizers::tokenizer::step_decode_stream;
use tokenizers::{
    DecoderWrapper, Model, ModelWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper, Token,
    TokenizerImpl,
};

/// A tokenizer whose model (vocabulary and merges) is shared with its clones.
type Tokenizer =
    TokenizerImpl<SharedModel, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>;

/// The tokenizer's model behind an `Arc`: the two tokenizers of a [`ModelTokenizer`] differ only
/// in how they treat special tokens' text, and a clone of the model itself doubled what the
/// tokenizer holds (80-95 MB for Gemma 3's 262,144 tokens and their merges).
#[derive(Clone)]
struct SharedModel(Arc<ModelWrapper>);

impl<'de> Deserialize<'de> for SharedModel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ModelWrapper::deserialize(d).map(|m| SharedModel(Arc::new(m)))
    }
}

impl Model for SharedModel {
    type Trainer = <ModelWrapper as Model>::Trainer;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        self.0.tokenize(sequence)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.0.token_to_id(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        self.0.id_to_token(id)
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        self.0.get_vocab()
    }

    fn get_vocab_size(&self) -> usize {
        self.0.get_vocab_size()
    }

    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        self.0.save(folder, prefix)
    }

    fn get_trainer(&self) -> Self::Trainer {
        self.0.get_trainer()
    }
}

pub struct ModelTokenizer {
    /// Recognises special tokens written in the text (`parse_special`).
    special: Tokenizer,
    /// Encodes special tokens' text as plain text (the same model as `special`).
    plain: Tokenizer,
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub bos_id: Option<u32>,
    /// Ids that end a generation (config, generation config and tokenizer config together).
    pub end_ids: HashSet<u32>,
    /// Whether the model's tokenizer starts a text with BOS (tokenizer_config's `add_bos_token`).
    pub adds_bos: bool,
    /// The tokenizer's special tokens (BOS, EOS, the chat template's role and turn markers).
    pub control_ids: HashSet<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{file}: {message}")]
    Read { file: String, message: String },
    #[error("tokenizer.json has token id {max_id}, beyond the model's vocabulary of {vocab} (config.json vocab_size): the tokenizer does not belong to these weights")]
    VocabMismatch { max_id: u32, vocab: usize },
}

/// A token given as a string or as `{"content": ...}` (both occur in tokenizer_config.json).
fn token_text(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
        _ => None,
    }
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn ids(v: Option<&serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
        _ => Vec::new(),
    }
}

impl ModelTokenizer {
    /// Reads the tokenizer files of the model folder `dir`; `vocab` is config.json's
    /// `vocab_size` and `config_eos` its EOS ids.
    pub fn load(dir: &Path, vocab: usize, config_eos: &[u32], config_bos: Option<u32>) -> Result<Self, TokenizerError> {
        let file = dir.join("tokenizer.json");
        let special = Tokenizer::from_file(&file)
            .map_err(|e| TokenizerError::Read { file: file.display().to_string(), message: e.to_string() })?;
        let max_id = special.get_vocab(true).values().copied().max().unwrap_or(0);
        if max_id as usize >= vocab {
            return Err(TokenizerError::VocabMismatch { max_id, vocab });
        }
        let mut plain = special.clone();
        plain.set_encode_special_tokens(true);
        let tc = read_json(&dir.join("tokenizer_config.json")).unwrap_or_default();
        let gc = read_json(&dir.join("generation_config.json")).unwrap_or_default();
        let chat_template = match tc.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            // A list of named templates: the default one.
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
            _ => None,
        }
        .or_else(|| std::fs::read_to_string(dir.join("chat_template.jinja")).ok());
        let bos_token = token_text(tc.get("bos_token"));
        let eos_token = token_text(tc.get("eos_token"));
        let mut end_ids: HashSet<u32> = config_eos.iter().copied().collect();
        end_ids.extend(ids(gc.get("eos_token_id")));
        if let Some(id) = eos_token.as_deref().and_then(|t| special.token_to_id(t)) {
            end_ids.insert(id);
        }
        let bos_id = bos_token.as_deref().and_then(|t| special.token_to_id(t)).or(config_bos);
        let adds_bos = tc.get("add_bos_token").and_then(|v| v.as_bool()).unwrap_or(false);
        let control_ids =
            special.get_added_tokens_decoder().into_iter().filter(|(_, t)| t.special).map(|(id, _)| id).collect();
        Ok(ModelTokenizer {
            special,
            plain,
            chat_template,
            bos_token,
            eos_token,
            bos_id,
            end_ids,
            adds_bos,
            control_ids,
        })
    }

    /// Token ids of `text`. `add_bos` asks for the model's own special tokens, as llama.cpp's
    /// `add_special` does: BOS first when the model's tokenizer adds one (`add_bos_token`).
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<u32>, String> {
        let tk = if parse_special { &self.special } else { &self.plain };
        let enc = tk.encode_fast(text, false).map_err(|e| e.to_string())?;
        let mut out = Vec::with_capacity(enc.len() + 1);
        if add_bos && self.adds_bos {
            if let Some(bos) = self.bos_id {
                out.push(bos);
            }
        }
        out.extend_from_slice(enc.get_ids());
        Ok(out)
    }

    /// Token ids of `text` as Hugging Face's `tokenizer(text)` gives them (its post-processor's
    /// special tokens included): what sentence-transformers embeds.
    pub fn encode_with_special(&self, text: &str) -> Result<Vec<u32>, String> {
        Ok(self.plain.encode_fast(text, true).map_err(|e| e.to_string())?.get_ids().to_vec())
    }

    /// The text of one token alone (special tokens render empty, as in generated text).
    pub fn piece(&self, id: u32) -> String {
        self.special.decode(&[id], true).unwrap_or_default()
    }

    pub fn is_end(&self, id: u32) -> bool {
        self.end_ids.contains(&id)
    }

    /// A sequence's detokenizer; `special_text`: control tokens are written as their text
    /// (`LLMR_INFER_SPECIAL_TEXT`), else as nothing.
    pub fn decoder(&self, special_text: bool) -> Detokenizer {
        Detokenizer { special_text, ..Detokenizer::default() }
    }

    /// Feeds one generated token to `d`; returns the text it completes (empty while a multi-byte
    /// character is still incomplete).
    pub fn step(&self, d: &mut Detokenizer, id: u32) -> String {
        let skip = !d.special_text;
        match step_decode_stream(&self.special, vec![id], skip, &mut d.ids, &mut d.prefix, &mut d.prefix_index) {
            Ok(Some(text)) => text,
            Ok(None) => String::new(),
            // The stream lost its prefix (a decoder that rewrites earlier text): start afresh
            // from this token rather than fail the request.
            Err(_) => {
                *d = self.decoder(d.special_text);
                self.special.decode(&[id], skip).unwrap_or_default()
            }
        }
    }
}

/// Incremental detokenization state of one sequence.
#[derive(Default)]
pub struct Detokenizer {
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
    special_text: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BPE of seven tokens, `<s>` among them as a special token.
    const TOKENIZER: &str = r#"{
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "vocab": {"<s>": 0, "a": 1, "b": 2, "ab": 3, "<": 4, ">": 5, "s": 6}, "merges": ["a b"]}
    }"#;

    #[test]
    fn both_tokenizers_share_one_model_and_treat_special_text_each_its_way() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), TOKENIZER).unwrap();
        let t = ModelTokenizer::load(dir.path(), 8, &[], None).unwrap();
        assert!(Arc::ptr_eq(&t.special.get_model().0, &t.plain.get_model().0), "the model is shared, not copied");
        assert_eq!(t.encode("ab<s>", false, true).unwrap(), [3, 0]);
        assert_eq!(t.encode("ab<s>", false, false).unwrap(), [3, 4, 6, 5]);
        assert_eq!(t.control_ids, HashSet::from([0]));
    }
}
