//! What the node and a worker say to each other: one JSON document per line over the socket
//! pair that is the worker's standard input, in both directions.
//!
//! JSON rather than a binary codec because the engine's own documents (model info, metrics,
//! settings, load options) are JSON values already; the one bulky payload, PCM and embedding
//! vectors, travels as base64 of little-endian `f32`s (`f32_base64`), about 5.3 bytes a sample.
//!
//! Every call carries a `call` number chosen by the node; its events and its one final
//! `Done`/`Failed` carry it back. The worker answers calls concurrently (one thread each), so
//! replies of different calls interleave.

use llmr_engine_host::{CallError, InferResult, InstanceConfig, ModelInfo, ModelSpec, Sampling, Segment, TopLogprob};
use serde::{Deserialize, Serialize};
use std::io::{self, BufRead, Write};
use std::path::PathBuf;

/// Node to worker.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// The first line a worker reads: open the plugin in `plugin_dir`, create an instance and
    /// load the model. Answered by `Loaded` or `LoadFailed`.
    Load {
        plugin_dir: PathBuf,
        config: InstanceConfig,
        spec: ModelSpec,
    },
    /// Instead of `Load`: only open the plugin in `plugin_dir` (its library's initialisers run)
    /// and say its version, then exit. Answered by `Probed` or `LoadFailed`.
    Probe {
        plugin_dir: PathBuf,
    },
    Tokenize {
        call: u64,
        text: String,
        add_bos: bool,
        parse_special: bool,
    },
    Infer {
        call: u64,
        request: InferRequest,
    },
    Embed {
        call: u64,
        request_id: u64,
        inputs: EmbedInputs,
        normalize: bool,
    },
    Transcribe {
        call: u64,
        request: TranscribeRequest,
    },
    Synthesize {
        call: u64,
        request: SynthesizeRequest,
    },
    Metrics {
        call: u64,
    },
    SetConfig {
        call: u64,
        key: String,
        value: serde_json::Value,
    },
    /// The node's callback returned false: the call's next event callback in the worker returns
    /// false, which cancels it in the engine.
    Stop {
        call: u64,
    },
    /// `llmr_engine_cancel` for a request id (a request still in prefill has no callback yet).
    Cancel {
        request_id: u64,
    },
    /// Unload the model, destroy the instance, exit.
    Shutdown,
}

/// Worker to node.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Loaded {
        // Boxed: the one big variant, sent once; every token is a `Reply` too.
        info: Box<ModelInfo>,
        capabilities: u32,
        version: String,
    },
    LoadFailed {
        error: CallError,
    },
    Probed {
        version: String,
    },
    Token {
        call: u64,
        token_id: i32,
        text: String,
        logprob: f32,
        top: Vec<TopLogprob>,
        timestamp_ns: u64,
    },
    Embedding {
        call: u64,
        index: usize,
        #[serde(with = "f32_base64")]
        vector: Vec<f32>,
    },
    Segment {
        call: u64,
        segment: Segment,
    },
    Audio {
        call: u64,
        #[serde(with = "f32_base64")]
        samples: Vec<f32>,
        sample_rate: u32,
    },
    /// The engine advanced (its metrics changed) while calls were running: what the node's
    /// watchdog counts as progress besides events, so a long prefill is not taken for a hang.
    Progress,
    Done {
        call: u64,
        outcome: Outcome,
    },
    Failed {
        call: u64,
        error: CallError,
    },
}

/// What a finished call returns.
#[derive(Debug, Serialize, Deserialize)]
pub enum Outcome {
    Tokens(Vec<i32>),
    Infer(InferResult),
    /// Prompt tokens of an embedding call.
    Embedded(u32),
    Metrics(serde_json::Value),
    Unit,
}

/// `InferParams`, owned (the model is the worker's one model).
#[derive(Debug, Serialize, Deserialize)]
pub struct InferRequest {
    pub request_id: u64,
    pub prompt: String,
    pub sampling: Sampling,
    pub parse_special: bool,
    pub add_bos: bool,
    pub ignore_eos: bool,
    pub prompt_tokens: Option<Vec<i32>>,
    #[serde(default)]
    pub special_text: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum EmbedInputs {
    Texts(Vec<String>),
    Tokens(Vec<Vec<i32>>),
}

/// `TranscribeParams`, owned.
#[derive(Debug, Serialize, Deserialize)]
pub struct TranscribeRequest {
    pub request_id: u64,
    #[serde(with = "f32_base64")]
    pub samples: Vec<f32>,
    pub sample_rate: u32,
    pub language: Option<String>,
    pub prompt: Option<String>,
    pub temperature: f32,
    pub translate: bool,
    pub word_timestamps: bool,
    pub beam_size: u32,
}

/// `SynthesizeParams`, owned.
#[derive(Debug, Serialize, Deserialize)]
pub struct SynthesizeRequest {
    pub request_id: u64,
    pub text: String,
    pub voice: Option<String>,
    pub speed: f32,
}

/// Writes one message as one line (compact JSON never contains a raw newline).
pub fn write_line<T: Serialize>(out: &mut impl Write, message: &T) -> io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line)
}

/// Reads one message; `Ok(None)` at the end of the stream.
pub fn read_line<T: for<'de> Deserialize<'de>>(input: &mut impl BufRead, buf: &mut String) -> io::Result<Option<T>> {
    buf.clear();
    if input.read_line(buf)? == 0 {
        return Ok(None);
    }
    serde_json::from_str(buf).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// `Vec<f32>` as base64 of its little-endian bytes.
mod f32_base64 {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(values: &[f32], s: S) -> Result<S::Ok, S::Error> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let bytes = STANDARD.decode(text.as_bytes()).map_err(D::Error::custom)?;
        if bytes.len() % 4 != 0 {
            return Err(D::Error::custom("f32 payload is not a whole number of samples"));
        }
        Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_round_trip_bit_for_bit() {
        let samples = vec![0.0, -0.0, 1.5, f32::MIN_POSITIVE, -3.25e-7, f32::MAX];
        let reply = Reply::Audio { call: 7, samples: samples.clone(), sample_rate: 22050 };
        let mut line = Vec::new();
        write_line(&mut line, &reply).unwrap();
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1, "one message, one line");
        let back: Reply = read_line(&mut &line[..], &mut String::new()).unwrap().unwrap();
        let Reply::Audio { call, samples: got, sample_rate } = back else { panic!("{back:?}") };
        assert_eq!((call, sample_rate), (7, 22050));
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            samples.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_prompt_with_newlines_stays_on_one_line() {
        let request = Request::Tokenize { call: 1, text: "a\nb\r\n\"c\"".into(), add_bos: true, parse_special: false };
        let mut line = Vec::new();
        write_line(&mut line, &request).unwrap();
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        let Some(Request::Tokenize { text, .. }) = read_line(&mut &line[..], &mut String::new()).unwrap() else {
            panic!()
        };
        assert_eq!(text, "a\nb\r\n\"c\"");
    }

    #[test]
    fn a_torn_line_is_invalid_data_and_the_end_is_none() {
        let err = read_line::<Reply>(&mut &b"{\"Done\":{\"call\":1\n"[..], &mut String::new()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(read_line::<Reply>(&mut &b""[..], &mut String::new()).unwrap().is_none());
    }
}
