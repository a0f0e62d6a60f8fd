//! The tiny random checkpoints behind `tests/goldens/*.json`, rebuilt bit for bit.
//!
//! `scripts/make_native_goldens.py` (run by hand, with torch and transformers) made each golden
//! from a checkpoint whose every tensor comes from a trivially reproducible generator, so no
//! weights are committed: this is the Rust port of that generator ("llmr-splitmix64-v1"; the
//! script's docstring is the specification, and `tests/goldens/README.md` explains the goldens).
//!
//! * seed = FNV-1a-64 of the tensor name's UTF-8 bytes;
//! * SplitMix64 from that seed, one draw `x` per element in row-major order;
//! * BF16 tensors: `u = ((x >> 40) - 2^23) / 2^23` (f32 in [-1, 1), exact), value =
//!   `bf16_rne(offset + scale * u)` with f32 arithmetic (no FMA);
//! * MXFP4 (gpt_oss experts, U8): `*_blocks` byte = `x >> 56`; `*_scales` byte =
//!   `base + (x >> (64 - bits))` (base 122, bits 2: exponents 2^-5..2^-2).
//!
//! (scale, offset) per tensor are recorded in each golden's `tensors[i].init`; [`default_init`]
//! holds the same rules, and a test checks that they agree with every committed golden.
//!
//! Standalone on purpose (serde_json, safetensors, half and, in one test, tokenizers): the
//! engine's own loader is what the goldens test, so nothing here uses it.

#![allow(dead_code)]

use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const GENERATOR: &str = "llmr-splitmix64-v1";
pub const MXFP4_SCALE_BASE: u8 = 122;
pub const MXFP4_SCALE_BITS: u32 = 2;
/// The FP4 (e2m1) values of the 16 nibble codes.
pub const FP4_VALUES: [f32; 16] =
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// The folder of the committed goldens.
pub fn goldens_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/goldens"))
}

/// One golden, parsed (`name` is the file stem, e.g. "gpt_oss").
pub fn load_golden(name: &str) -> Value {
    let path = goldens_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The names of all committed goldens, sorted.
pub fn golden_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(goldens_dir())
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".json")).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// A draw as an f32 in [-1, 1): `((x >> 40) - 2^23) / 2^23`, exact.
pub fn unit_f32(x: u64) -> f32 {
    ((x >> 40) as i32 - (1 << 23)) as f32 * (1.0 / 8_388_608.0)
}

/// How a tensor's elements are made from the draws.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// BF16: `bf16(offset + scale * u)`.
    Uniform { scale: f32, offset: f32 },
    /// U8: `x >> 56`, two random FP4 nibbles.
    Mxfp4Blocks,
    /// U8: `base + (x >> (64 - bits))`, an E8M0 exponent (value 2^(byte - 127)).
    Mxfp4Scales { base: u8, bits: u32 },
}

#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    /// "BF16" or "U8", as safetensors spells them.
    pub dtype: String,
    pub init: Init,
}

/// The generator's rules (first match wins), as `make_native_goldens.py`'s `init_for`.
pub fn default_init(model_type: &str, name: &str, shape: &[usize], dtype: &str) -> Init {
    if dtype == "U8" {
        if name.ends_with("_blocks") {
            return Init::Mxfp4Blocks;
        }
        assert!(name.ends_with("_scales"), "no rule for U8 tensor {name}");
        return Init::Mxfp4Scales { base: MXFP4_SCALE_BASE, bits: MXFP4_SCALE_BITS };
    }
    assert_eq!(dtype, "BF16", "{name}");
    if name.ends_with("sinks") {
        return Init::Uniform { scale: 1.0, offset: 0.0 };
    }
    if shape.len() == 1 && name.contains("norm") {
        // Gemma's RMSNorm multiplies by (1 + w), the others by w.
        let offset = if model_type == "gemma3_text" { 0.0 } else { 1.0 };
        return Init::Uniform { scale: 0.1, offset };
    }
    if name.ends_with("bias") {
        return Init::Uniform { scale: 0.1, offset: 0.0 };
    }
    let fan_in = *shape.last().expect("a matrix has a shape");
    Init::Uniform { scale: (1.0 / (fan_in as f64).sqrt()) as f32, offset: 0.0 }
}

fn parse_init(v: &Value) -> Result<Init, String> {
    let num = |k: &str| v[k].as_f64().ok_or_else(|| format!("init.{k} missing in {v}"));
    match v["kind"].as_str() {
        Some("uniform") => Ok(Init::Uniform { scale: num("scale")? as f32, offset: num("offset")? as f32 }),
        Some("mxfp4_blocks") => Ok(Init::Mxfp4Blocks),
        Some("mxfp4_scales") => Ok(Init::Mxfp4Scales { base: num("base")? as u8, bits: num("bits")? as u32 }),
        _ => Err(format!("unknown init {v}")),
    }
}

/// The tensor list of a golden (`golden["tensors"]`: name, shape, dtype and the recorded
/// `init`; without `init`, [`default_init`] with `golden["config"]["model_type"]`).
pub fn tensor_specs(golden: &Value) -> Result<Vec<TensorSpec>, String> {
    if let Some(g) = golden.get("generator").and_then(Value::as_str) {
        if g != GENERATOR {
            return Err(format!("golden made by generator {g}, this is {GENERATOR}"));
        }
    }
    let model_type = golden["config"]["model_type"].as_str().ok_or("config.model_type missing")?;
    let list = golden["tensors"].as_array().ok_or("tensors missing")?;
    list.iter()
        .map(|t| {
            let name = t["name"].as_str().ok_or("tensor name")?.to_owned();
            let shape = t["shape"]
                .as_array()
                .ok_or("tensor shape")?
                .iter()
                .map(|d| d.as_u64().map(|d| d as usize).ok_or("shape entry"))
                .collect::<Result<Vec<_>, _>>()?;
            let dtype = t["dtype"].as_str().ok_or("tensor dtype")?.to_owned();
            let init = match t.get("init") {
                Some(v) => parse_init(v)?,
                None => default_init(model_type, &name, &shape, &dtype),
            };
            Ok(TensorSpec { name, shape, dtype, init })
        })
        .collect()
}

/// The tensor's bytes as safetensors stores them (little-endian bf16, or u8).
pub fn tensor_bytes(spec: &TensorSpec) -> Vec<u8> {
    let n: usize = spec.shape.iter().product();
    let mut rng = SplitMix64::new(fnv1a64(spec.name.as_bytes()));
    match spec.init {
        Init::Uniform { scale, offset } => {
            assert_eq!(spec.dtype, "BF16", "{}", spec.name);
            let mut out = Vec::with_capacity(2 * n);
            for _ in 0..n {
                let v = offset + scale * unit_f32(rng.next_u64());
                out.extend_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes());
            }
            out
        }
        Init::Mxfp4Blocks => {
            assert_eq!(spec.dtype, "U8", "{}", spec.name);
            (0..n).map(|_| (rng.next_u64() >> 56) as u8).collect()
        }
        Init::Mxfp4Scales { base, bits } => {
            assert_eq!(spec.dtype, "U8", "{}", spec.name);
            (0..n).map(|_| base + (rng.next_u64() >> (64 - bits)) as u8).collect()
        }
    }
}

/// The tensor as f32 (BF16 tensors only).
pub fn tensor_f32(spec: &TensorSpec) -> Vec<f32> {
    assert_eq!(spec.dtype, "BF16", "{}", spec.name);
    tensor_bytes(spec)
        .chunks_exact(2)
        .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
        .collect()
}

/// MXFP4 as transformers dequantizes it: `blocks` [.., R, G, 16] and `scales` [.., R, G] give
/// W [.., R, 32 G] (W[e] is [out_features, in_features]) with
/// `W[.., r, 32g + 2j] = FP4[blocks[.., r, g, j] & 15] * 2^(scales[.., r, g] - 127)` and
/// `W[.., r, 32g + 2j + 1] = FP4[blocks[.., r, g, j] >> 4] * 2^(scales[.., r, g] - 127)`.
pub fn mxfp4_dequantize(blocks: &[u8], scales: &[u8]) -> Vec<f32> {
    assert_eq!(blocks.len(), scales.len() * 16);
    let mut out = Vec::with_capacity(blocks.len() * 2);
    for (group, &s) in blocks.chunks_exact(16).zip(scales) {
        let mul = (2.0f64).powi(i32::from(s) - 127) as f32;
        for &b in group {
            out.push(FP4_VALUES[(b & 0x0f) as usize] * mul);
            out.push(FP4_VALUES[(b >> 4) as usize] * mul);
        }
    }
    out
}

/// A tokenizer.json with a WordLevel vocabulary `t0 .. t{vocab_size-1}` (id i is "t{i}"),
/// whitespace-split, unknown words to t0.
pub fn tokenizer_json(vocab_size: usize) -> Value {
    let vocab: serde_json::Map<String, Value> = (0..vocab_size).map(|i| (format!("t{i}"), json!(i))).collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    })
}

/// The safetensors file of `tensors` (metadata {"format": "pt"}, as transformers wants it).
pub fn safetensors_bytes(tensors: &[TensorSpec]) -> Vec<u8> {
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    let data: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = tensors
        .iter()
        .map(|t| {
            let dtype = match t.dtype.as_str() {
                "BF16" => Dtype::BF16,
                "U8" => Dtype::U8,
                other => panic!("{}: dtype {other}", t.name),
            };
            (t.name.clone(), t.shape.clone(), dtype, tensor_bytes(t))
        })
        .collect();
    let views = data
        .iter()
        .map(|(name, shape, dtype, bytes)| (name.clone(), TensorView::new(*dtype, shape.clone(), bytes).unwrap()));
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::tensor::serialize(views, Some(metadata)).expect("serialize safetensors")
}

/// Writes `config.json` (exactly `config`), `model.safetensors` and `tokenizer.json` into `dir`.
pub fn write_checkpoint(dir: &Path, config: &Value, tensors: &[TensorSpec]) -> std::io::Result<()> {
    let vocab = config["vocab_size"].as_u64().expect("config.vocab_size") as usize;
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(config)? + "\n")?;
    std::fs::write(dir.join("tokenizer.json"), serde_json::to_string(&tokenizer_json(vocab))? + "\n")?;
    std::fs::write(dir.join("model.safetensors"), safetensors_bytes(tensors))
}

/// The checkpoint of a golden (its `config` and `tensors`), written into `dir`.
pub fn write_golden_checkpoint(dir: &Path, golden: &Value) -> std::io::Result<()> {
    let tensors = tensor_specs(golden).map_err(std::io::Error::other)?;
    write_checkpoint(dir, &golden["config"], &tensors)
}

/// A fresh folder under the temp dir for the checkpoint of golden `name`, written.
pub fn golden_checkpoint_in_temp(name: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "llmr-native-golden-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    write_golden_checkpoint(&dir, &load_golden(name)).unwrap();
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(model_type: &str, name: &str, shape: &[usize], dtype: &str) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            shape: shape.to_vec(),
            dtype: dtype.into(),
            init: default_init(model_type, name, shape, dtype),
        }
    }

    fn bf16_bits(spec: &TensorSpec, n: usize) -> Vec<u16> {
        tensor_bytes(spec)[..2 * n].chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect()
    }

    /// The numbers `make_native_goldens.py` prints ("generator pins").
    #[test]
    fn generator_matches_the_python_script() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        let seed = fnv1a64(b"model.embed_tokens.weight");
        assert_eq!(seed, 0xa88f_d795_d5c6_d156);
        let mut rng = SplitMix64::new(seed);
        let draws: Vec<u64> = (0..4).map(|_| rng.next_u64()).collect();
        assert_eq!(draws, [0x5f0c_e479_8904_7d81, 0x51ec_b670_9450_0aee, 0x8366_a965_cb94_ae9c, 0x3f99_e587_468e_8e0a]);
        let seed = fnv1a64(b"model.layers.0.input_layernorm.weight");
        assert_eq!(seed, 0xa202_704e_dd64_ce84);
        let mut rng = SplitMix64::new(seed);
        let draws: Vec<u64> = (0..4).map(|_| rng.next_u64()).collect();
        assert_eq!(draws, [0x6ef3_75fc_5a6b_660e, 0x28f9_b1d3_47c1_8285, 0xbccf_9313_0d3d_d769, 0x8fbe_a84d_6078_a33a]);

        let embed = spec("llama", "model.embed_tokens.weight", &[256, 64], "BF16");
        assert_eq!(embed.init, Init::Uniform { scale: 0.125, offset: 0.0 });
        assert_eq!(bf16_bits(&embed, 4), [0xbd04, 0xbd38, 0x3b5a, 0xbd81]);
        let as_f64 = |s: &TensorSpec| tensor_f32(s)[..4].iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
        assert_eq!(as_f64(&embed), [-0.032_226_562_5, -0.044_921_875, 0.003_326_416_015_625, -0.062_988_281_25]);
        let norm = spec("llama", "model.layers.0.input_layernorm.weight", &[64], "BF16");
        assert_eq!(bf16_bits(&norm, 4), [0x3f7d, 0x3f6f, 0x3f86, 0x3f82]);
        assert_eq!(as_f64(&norm), [0.988_281_25, 0.933_593_75, 1.046_875, 1.015_625]);
        let gemma_norm = spec("gemma3_text", "model.layers.0.input_layernorm.weight", &[64], "BF16");
        assert_eq!(bf16_bits(&gemma_norm, 4), [0xbc5a, 0xbd8b, 0x3d43, 0x3c4a]);
        let blocks = spec("gpt_oss", "model.layers.0.mlp.experts.gate_up_proj_blocks", &[4, 256, 2, 16], "U8");
        assert_eq!(tensor_bytes(&blocks)[..4], [244, 14, 136, 60]);
        let scales = spec("gpt_oss", "model.layers.0.mlp.experts.gate_up_proj_scales", &[4, 256, 2], "U8");
        assert_eq!(tensor_bytes(&scales)[..4], [122, 124, 124, 123]);
    }

    #[test]
    fn bf16_rounding_is_to_nearest_even() {
        // Exactly halfway between 0x3f80 (1.0) and 0x3f81: ties to the even 0x3f80; a hair above
        // rounds up; halfway between 0x3f81 and 0x3f82 ties to 0x3f82.
        assert_eq!(half::bf16::from_f32(f32::from_bits(0x3f80_8000)).to_bits(), 0x3f80);
        assert_eq!(half::bf16::from_f32(f32::from_bits(0x3f80_8001)).to_bits(), 0x3f81);
        assert_eq!(half::bf16::from_f32(f32::from_bits(0x3f81_8000)).to_bits(), 0x3f82);
    }

    #[test]
    fn mxfp4_dequantization_rule() {
        // Byte 0x9a: low nibble 0xa (-1.0) first, high nibble 0x9 (-0.5) second; scale 2^(125-127).
        let mut blocks = [0u8; 16];
        blocks[0] = 0x9a;
        blocks[15] = 0x71;
        let w = mxfp4_dequantize(&blocks, &[125]);
        assert_eq!(w.len(), 32);
        assert_eq!(&w[..2], &[-0.25, -0.125]);
        assert_eq!(&w[30..], &[0.125, 1.5]);
    }

    /// The rules here give the (scale, offset) each committed golden recorded.
    #[test]
    fn rules_agree_with_the_goldens() {
        let names = golden_names();
        for name in &names {
            let golden = load_golden(name);
            assert_eq!(golden["generator"], GENERATOR, "{name}");
            let model_type = golden["config"]["model_type"].as_str().unwrap();
            for t in tensor_specs(&golden).unwrap() {
                assert_eq!(t.init, default_init(model_type, &t.name, &t.shape, &t.dtype), "{name}: {}", t.name);
            }
        }
    }

    /// Every golden's checkpoint writes, reads back as safetensors with the recorded tensors,
    /// and its tokenizer.json loads with the tokenizers crate.
    #[test]
    fn golden_checkpoints_write_and_read_back() {
        for name in golden_names() {
            let golden = load_golden(&name);
            let dir = golden_checkpoint_in_temp(&name);
            let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let specs = tensor_specs(&golden).unwrap();
            assert_eq!(st.len(), specs.len(), "{name}");
            for t in &specs {
                let view = st.tensor(&t.name).unwrap();
                assert_eq!(view.shape(), &t.shape[..], "{name}: {}", t.name);
                assert_eq!(view.data(), &tensor_bytes(t)[..], "{name}: {}", t.name);
            }
            let config: Value =
                serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
            assert_eq!(config, golden["config"], "{name}");
            let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
            let vocab = config["vocab_size"].as_u64().unwrap() as usize;
            assert_eq!(tok.get_vocab_size(true), vocab, "{name}");
            let enc = tok.encode("t5 t255 t17", false).unwrap();
            assert_eq!(enc.get_ids(), &[5, 255, 17]);
            assert_eq!(tok.decode(&[5, 255, 17], false).unwrap(), "t5 t255 t17");
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
