//! The GGUF reader and descriptors on the real models cached by `scripts/fetch-models`.

use crate::support::{gemma3, minilm, qwen, smollm2, tiny_llama};
use llmr_model_store::gguf::{GgufHeader, PoolingType};
use llmr_model_store::{Capability, Format, ModelDescriptor};
use std::fs::File;
use std::io::{Cursor, Read, Seek, SeekFrom};

#[test]
fn smollm2_header() {
    let h = GgufHeader::open(&smollm2()).unwrap();
    assert_eq!((h.version, h.tensor_count), (3, 272));
    assert_eq!(h.architecture(), Some("llama"));
    assert_eq!(h.context_length(), Some(8192));
    assert_eq!(h.embedding_length(), Some(576));
    assert_eq!(h.block_count(), Some(30));
    assert_eq!(h.quantization(), Some("Q4_1"));
    assert_eq!((h.bos_token_id(), h.bos_token()), (Some(1), Some("<|im_start|>")));
    assert_eq!((h.eos_token_id(), h.eos_token()), (Some(2), Some("<|im_end|>")));
    let template = h.chat_template().expect("smollm2 ships a chat template");
    assert!(template.contains("<|im_start|>"), "ChatML template expected: {template}");
    let tokens = h.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
    assert!(!tokens.is_loaded(), "the vocabulary must not be held in memory");
    assert_eq!(tokens.len, 49152);
}

#[test]
fn minilm_is_an_embedding_model() {
    let path = minilm();
    let h = GgufHeader::open(&path).unwrap();
    assert_eq!(h.architecture(), Some("bert"));
    assert_eq!(h.pooling_type(), Some(PoolingType::Mean));
    assert_eq!(h.causal_attention(), Some(false));
    assert_eq!(h.context_length(), Some(512));
    assert_eq!(h.quantization(), Some("F16"));
    assert_eq!((h.bos_token(), h.eos_token()), (Some("[CLS]"), Some("[SEP]")));
    let d = ModelDescriptor::from_gguf_file(&path).unwrap();
    assert_eq!(d.capabilities, vec![Capability::Embedding]);
}

#[test]
fn gemma3_and_tiny_llama_headers() {
    let h = GgufHeader::open(&gemma3()).unwrap();
    assert_eq!((h.architecture(), h.context_length(), h.quantization()), (Some("gemma3"), Some(32768), Some("Q4_K_M")));
    assert_eq!((h.bos_token(), h.eos_token()), (Some("<bos>"), Some("<eos>")));
    assert_eq!(h.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap().len, 262_144);

    let h = GgufHeader::open(&tiny_llama()).unwrap();
    assert_eq!((h.architecture(), h.context_length(), h.quantization()), (Some("llama"), Some(2048), Some("F16")));
    assert_eq!(h.block_count(), Some(2));
}

#[test]
fn qwen_eos_is_found_deep_in_a_large_vocabulary() {
    let h = GgufHeader::open(&qwen()).unwrap();
    assert_eq!((h.architecture(), h.context_length(), h.quantization()), (Some("qwen2"), Some(32768), Some("Q4_K_M")));
    assert_eq!((h.eos_token_id(), h.eos_token()), (Some(151_645), Some("<|im_end|>")));
}

/// Counts the bytes read through it and the furthest offset any read reached.
struct Counting<R> {
    inner: R,
    read: u64,
    pos: u64,
    furthest: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        self.pos += n as u64;
        self.furthest = self.furthest.max(self.pos);
        Ok(n)
    }
}

impl<R: Seek> Seek for Counting<R> {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.pos = self.inner.seek(pos)?;
        Ok(self.pos)
    }
}

#[test]
fn a_500_mb_file_is_read_without_its_tensor_data() {
    let path = qwen();
    let size = std::fs::metadata(&path).unwrap().len();
    let mut counting = Counting { inner: File::open(&path).unwrap(), read: 0, pos: 0, furthest: 0 };
    let h = GgufHeader::read_from(&mut counting).unwrap();
    assert_eq!((h.architecture(), h.tensor_count), (Some("qwen2"), 291));
    let vocabulary = h.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
    assert_eq!(vocabulary.len, 151_936);
    assert!(!vocabulary.is_loaded(), "the vocabulary must stay on disk");
    assert_eq!(h.eos_token(), Some("<|im_end|>"), "found in the vocabulary on disk");
    // The header (vocabulary and merges included) is a few MB of the 491 MB, and no read went
    // past it into the tensor data (but for one buffer's read-ahead).
    assert!(h.data_offset < size / 50, "tensor data at {} of {size} bytes", h.data_offset);
    let (furthest, data) = (counting.furthest, h.data_offset);
    eprintln!("read {} bytes, up to {furthest}; tensor data at {data} of {size}", counting.read);
    assert!(furthest <= data + 64 * 1024, "read up to {furthest}, tensor data at {data}");
    assert!(counting.read < 16 << 20, "read {} of {size} bytes", counting.read);
}

#[test]
fn cuts_through_a_real_header_are_errors() {
    let path = tiny_llama();
    let bytes = std::fs::read(&path).unwrap();
    let header_len = GgufHeader::open(&path).unwrap().data_offset as usize;
    let step = (header_len / 150).max(1);
    for cut in (0..header_len).step_by(step).chain([header_len - 1, bytes.len() - 1]) {
        assert!(GgufHeader::read_from(Cursor::new(&bytes[..cut])).is_err(), "prefix of {cut} bytes was accepted");
    }
}

#[test]
fn a_file_given_directly_is_described() {
    let d = ModelDescriptor::from_gguf_file(&smollm2()).unwrap();
    assert_eq!(d.name, "smollm2-135m-instruct-q4_1");
    assert_eq!((d.format, d.architecture.as_str(), d.runtime.as_str()), (Format::Gguf, "llama", "LlamaCpp"));
    assert_eq!((d.quantization.as_deref(), d.context_length), (Some("Q4_1"), Some(8192)));
    assert_eq!((d.capabilities.as_slice(), d.mmproj.as_ref()), (&[Capability::Text][..], None));
    assert_eq!(d.size_bytes, 98_362_432);
    assert_eq!(d.primary_file, smollm2());
}
