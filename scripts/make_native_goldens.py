#!/usr/bin/env python3
"""Reference goldens for the native engine, computed by Hugging Face `transformers` (torch, CPU).

Run by hand, never in CI (torch is a few GB):

    scripts/reference-venv && ~/.cache/llmr/venv-reference/bin/python scripts/make_native_goldens.py

For each architecture the native engine runs (llama, qwen2, gemma3_text, gpt_oss) it makes a tiny
checkpoint with made-up weights in a temporary folder, loads it with transformers, runs a fixed
prompt and writes `engines/native/tests/goldens/<name>.json` (a few tens of KB). No weights are
committed: the checkpoint is rebuilt bit for bit from the golden by the Rust port of the generator
below (`engines/native/tests/it/random_checkpoint.rs`).

Options: `--out DIR` (default engines/native/tests/goldens), `--keep DIR` (keep the checkpoint
folders there), `--only NAME[,NAME]`.

The weight generator ("llmr-splitmix64-v1")
===========================================
Every tensor is a pure function of its name, shape and dtype (and, for norms, the model type).

* seed = FNV-1a-64 of the tensor name's UTF-8 bytes:
      h = 0xcbf29ce484222325; for each byte b: h = ((h ^ b) * 0x100000001b3) mod 2^64
* SplitMix64 seeded with `seed`; one draw per element, elements in row-major (C) order:
      state = (state + 0x9e3779b97f4a7c15) mod 2^64
      z = state
      z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) mod 2^64
      z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) mod 2^64
      x = z ^ (z >> 31)
  (so draw i, counting from 1, is the mix of seed + i * 0x9e3779b97f4a7c15.)
* Floating tensors (dtype BF16): u = ((x >> 40) - 2^23) / 2^23, a float32 in [-1, 1) (exact: a
  24-bit integer times a power of two); value = bf16(offset + scale * u), where scale and offset are
  float32, `scale * u` and `+ offset` are float32 operations (round to nearest even, no FMA) and
  bf16() rounds float32 to bfloat16 to nearest even (`(bits + 0x7fff + ((bits >> 16) & 1)) >> 16`,
  the rounding of torch's `.to(torch.bfloat16)` and of `half::bf16::from_f32`).
  (scale, offset) by tensor, first rule that matches:
      name ends with "sinks"                      (gpt_oss attention sinks)  scale 1.0, offset 0
      1-D and "norm" in the name, gemma3_text     (gemma norms are x*(1+w))  scale 0.1, offset 0
      1-D and "norm" in the name, other models    (x*w)                      scale 0.1, offset 1.0
      name ends with "bias" (".bias", "_bias")                               scale 0.1, offset 0
      anything else (matrices, embeddings, router, lm_head)   scale float32(1/sqrt(shape[-1])), offset 0
* MXFP4 expert weights (gpt_oss, dtype U8), in OpenAI's on-disk form:
      "..._blocks": byte = x >> 56                       (two random FP4 e2m1 nibbles)
      "..._scales": byte = 122 + (x >> 62)               (E8M0 exponent 122..125: 2^-5 .. 2^-2)
  transformers dequantizes them (verified below, and recorded in the golden's notes) as
      W[e, r, 32*g + 2*j]     = FP4[blocks[e, r, g, j] & 0x0f] * 2^(scales[e, r, g] - 127)
      W[e, r, 32*g + 2*j + 1] = FP4[blocks[e, r, g, j] >> 4]   * 2^(scales[e, r, g] - 127)
      FP4 = [0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6]
  with W[e] of shape [out_features, in_features] (gate_up: [2*I, H]; down: [H, I]).
Each golden records every tensor with its generator parameters ("init"), so a reader need not
re-derive the rules; the Rust port checks that its rules agree with the recorded ones.

The checkpoint folder: config.json (exactly the golden's "config"), model.safetensors (metadata
{"format": "pt"}) and tokenizer.json (a WordLevel vocabulary t0..t{V-1}, whitespace split).

The goldens: logits of the last 4 prompt positions from one full forward pass in float32 (the
bf16 weights upcast exactly: the golden is the exact math on bf16-rounded weights, eager
attention), the greedy continuation of 16 tokens (generate, do_sample=False, use_cache=True, eos
stopping disabled) with the top-5 logits of each step, and tolerance hints (bf16-compute run vs
float32, KV-cache decode vs full forward).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import numpy as np  # noqa: E402

MASK64 = (1 << 64) - 1
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
GAMMA = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
GENERATOR = "llmr-splitmix64-v1"
MXFP4_SCALE_BASE = 122
MXFP4_SCALE_BITS = 2
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "engines" / "native" / "tests" / "goldens"

# 24 token ids, longer than the sliding windows (8): 3 + (draw % 253) for the 24 SplitMix64 draws
# seeded with FNV-1a-64("prompt-9"). Chosen by hand among "prompt-0".."prompt-29" as one whose
# greedy continuations are not a single repeated token for most models and whose smallest
# top-1/top-2 logit margin over all goldens (prompt and greedy steps) is large (>= 4e-3, vs. about
# 1e-6 of float32 noise), so that an exact-argmax comparison is robust.
PROMPT = [186, 111, 48, 188, 47, 223, 112, 86, 191, 66, 203, 211, 80, 92, 161, 241, 244, 168, 229, 48, 40, 207, 181, 118]
MAX_NEW_TOKENS = 16
LAST_POSITIONS = 4


# ---------------------------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------------------------

def fnv1a64(data: bytes) -> int:
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK64
    return h


class SplitMix64:
    """Scalar reference implementation (the vectorised `draws` below must agree with it)."""

    def __init__(self, seed: int):
        self.state = seed & MASK64

    def next(self) -> int:
        self.state = (self.state + GAMMA) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * MIX1) & MASK64
        z = ((z ^ (z >> 27)) * MIX2) & MASK64
        return z ^ (z >> 31)


def draws(seed: int, n: int) -> np.ndarray:
    """The first n SplitMix64 outputs for `seed`, as uint64 (numpy wraps mod 2^64)."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
        return z ^ (z >> np.uint64(31))


def unit_f32(x: np.ndarray) -> np.ndarray:
    """u = ((x >> 40) - 2^23) / 2^23 in float32, exact."""
    return ((x >> np.uint64(40)).astype(np.int64) - (1 << 23)).astype(np.float32) * np.float32(2.0**-23)


def f32_to_bf16_bits(v: np.ndarray) -> np.ndarray:
    bits = v.astype(np.float32).view(np.uint32).astype(np.uint64)
    assert np.all(np.isfinite(v))
    return ((bits + 0x7FFF + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(np.uint16)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def init_for(model_type: str, name: str, shape: list[int], dtype: str) -> dict:
    """The generator parameters of one tensor (the rules of the module docstring)."""
    if dtype == "U8":
        if name.endswith("_blocks"):
            return {"kind": "mxfp4_blocks"}
        if name.endswith("_scales"):
            return {"kind": "mxfp4_scales", "base": MXFP4_SCALE_BASE, "bits": MXFP4_SCALE_BITS}
        raise ValueError(f"no rule for U8 tensor {name}")
    assert dtype == "BF16", (name, dtype)
    if name.endswith("sinks"):
        return {"kind": "uniform", "scale": 1.0, "offset": 0.0}
    if len(shape) == 1 and "norm" in name:
        if model_type == "gemma3_text":
            return {"kind": "uniform", "scale": float(np.float32(0.1)), "offset": 0.0}
        return {"kind": "uniform", "scale": float(np.float32(0.1)), "offset": 1.0}
    if name.endswith("bias"):
        return {"kind": "uniform", "scale": float(np.float32(0.1)), "offset": 0.0}
    return {"kind": "uniform", "scale": float(np.float32(1.0 / math.sqrt(shape[-1]))), "offset": 0.0}


def generate_tensor(name: str, shape: list[int], init: dict) -> np.ndarray:
    """uint16 (bf16 bits) or uint8 array of `shape`."""
    n = int(np.prod(shape))
    x = draws(fnv1a64(name.encode("utf-8")), n)
    kind = init["kind"]
    if kind == "uniform":
        v = np.float32(init["offset"]) + np.float32(init["scale"]) * unit_f32(x)
        assert v.dtype == np.float32
        return f32_to_bf16_bits(v).reshape(shape)
    if kind == "mxfp4_blocks":
        return (x >> np.uint64(56)).astype(np.uint8).reshape(shape)
    if kind == "mxfp4_scales":
        return (np.uint64(init["base"]) + (x >> np.uint64(64 - init["bits"]))).astype(np.uint8).reshape(shape)
    raise ValueError(kind)


def mxfp4_dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Our reading of the MXFP4 layout: [E, R, G, 16] + [E, R, G] -> float32 [E, R, 32 * G]."""
    lut = np.array(FP4_VALUES, dtype=np.float32)
    lo = lut[blocks & 0x0F]
    hi = lut[blocks >> 4]
    vals = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)  # element 2j = low nibble
    vals = vals * np.exp2(scales.astype(np.float32) - 127.0)[..., None]
    return vals.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


def self_check_generator() -> list[dict]:
    """Scalar vs vectorised SplitMix64; returns the first values the Rust unit test pins."""
    out = []
    for name in ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight"]:
        seed = fnv1a64(name.encode())
        sm = SplitMix64(seed)
        scalar = [sm.next() for _ in range(4)]
        vec = [int(v) for v in draws(seed, 4)]
        assert scalar == vec, (name, scalar, vec)
        out.append({"name": name, "fnv1a64": f"0x{seed:016x}", "draws": [f"0x{v:016x}" for v in scalar]})
    return out


def print_pins() -> None:
    """The numbers hard-coded in random_checkpoint.rs's unit test."""
    print("generator pins (for random_checkpoint.rs):", file=sys.stderr)
    for entry in self_check_generator():
        print(f"  {entry['name']}: fnv1a64 {entry['fnv1a64']} draws {entry['draws']}", file=sys.stderr)
    cases = [
        ("llama", "model.embed_tokens.weight", [256, 64], "BF16"),
        ("llama", "model.layers.0.input_layernorm.weight", [64], "BF16"),
        ("gemma3_text", "model.layers.0.input_layernorm.weight", [64], "BF16"),
        ("gpt_oss", "model.layers.0.mlp.experts.gate_up_proj_blocks", [4, 256, 2, 16], "U8"),
        ("gpt_oss", "model.layers.0.mlp.experts.gate_up_proj_scales", [4, 256, 2], "U8"),
    ]
    for mt, name, shape, dtype in cases:
        init = init_for(mt, name, shape, dtype)
        t = generate_tensor(name, shape, init).reshape(-1)[:4]
        if dtype == "BF16":
            shown = [f"0x{int(b):04x} ({float(bf16_bits_to_f32(np.array([b]))[0])!r})" for b in t]
        else:
            shown = [str(int(b)) for b in t]
        print(f"  {mt} {name} {init}: {shown}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# The models
# ---------------------------------------------------------------------------------------------

COMMON = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "initializer_range": 0.02,
    "use_cache": True,
    "attention_dropout": 0.0,
    "torch_dtype": "bfloat16",
}


def llama_config(**over) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **COMMON,
        "num_hidden_layers": 2,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    cfg.update(over)
    return cfg


def qwen2_config() -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **COMMON,
        "num_hidden_layers": 2,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 2,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def gemma3_config(**over) -> dict:
    cfg = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        **COMMON,
        "num_hidden_layers": 4,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": None,
        "query_pre_attn_scalar": 32,
        "sliding_window": 8,
        "sliding_window_pattern": 3,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        "attention_bias": False,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "use_bidirectional_attention": False,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
    }
    cfg.update(over)
    return cfg


def gpt_oss_config() -> dict:
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        **COMMON,
        "max_position_embeddings": 131072,
        "num_hidden_layers": 4,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "experts_per_token": 2,
        "hidden_act": "silu",
        "swiglu_limit": 7.0,
        "rms_norm_eps": 1e-5,
        "rope_theta": 150000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
        "initial_context_length": 4096,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "attention_bias": True,
        "router_aux_loss_coef": 0.9,
        "output_router_logits": False,
        "tie_word_embeddings": False,
        "pad_token_id": 0,
        "eos_token_id": 2,
        "quantization_config": {
            "quant_method": "mxfp4",
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
        },
    }


MODELS = {
    "llama": (
        llama_config(),
        "Llama: RMSNorm (x*w), default RoPE (theta 1e4, rotate-half), GQA 4q/2kv, SwiGLU, untied lm_head.",
    ),
    "llama_rope_llama3": (
        llama_config(
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
        "Llama with rope_scaling llama3 (factor 8, low 1, high 4). original_max_position_embeddings is 64"
        " (8192 in Llama 3.1) so that with head_dim 16 all three branches occur: wavelengths 6.3 (kept),"
        " 32.5 (smoothed) and >= 167 (divided by 8), and the effect is visible at short positions.",
    ),
    "llama_tied": (
        llama_config(tie_word_embeddings=True),
        "Llama with tie_word_embeddings: no lm_head.weight in the checkpoint; logits = h @ embed_tokens^T.",
    ),
    "qwen2": (
        qwen2_config(),
        "Qwen2: as Llama plus bias on q/k/v projections (not o_proj), rope theta 1e6, eps 1e-6.",
    ),
    "gemma3_text": (
        gemma3_config(),
        "Gemma 3 text: embeddings * sqrt(hidden), RMSNorm x*(1+w), q/k RMSNorm, 4 norms per layer"
        " (pre/post attention, pre/post feedforward), GeGLU (gelu tanh), scaling query_pre_attn_scalar^-0.5,"
        " sliding (window 8, local rope theta 1e4) and full (global rope theta 1e6) layers [s, s, f, s],"
        " tied embeddings.",
    ),
    "gemma3_text_softcap_linear": (
        gemma3_config(
            rope_scaling={"rope_type": "linear", "factor": 8.0},
            final_logit_softcapping=3.0,
        ),
        "gemma3_text plus linear rope scaling (factor 8) on the global (full-attention) layers only, as"
        " Gemma 3 4B/12B/27B have it, and final logit softcapping 3.0 (small on purpose so that tanh is"
        " far from linear with these tiny weights; released Gemma 3 configs have it null)."
        " attn_logit_softcapping stays null: transformers' Gemma3 attention never passes it to the"
        " attention function (Gemma2's does), so a value there would be silently ignored.",
    ),
    "gpt_oss": (
        gpt_oss_config(),
        "gpt-oss: MoE (4 experts, top-2, softmax over the top-k logits), MXFP4 expert weights"
        " (blocks+scales, dequantized by transformers on CPU), clamped SwiGLU with alpha 1.702 and"
        " limit 7, per-head attention sinks, biases on q/k/v/o, alternating sliding (window 8) and full"
        " layers, YaRN rope (factor 32, beta_fast 32, beta_slow 1, original 4096, truncate false).",
    ),
}


# ---------------------------------------------------------------------------------------------
# Checkpoint writing
# ---------------------------------------------------------------------------------------------

def tokenizer_json(vocab_size: int) -> dict:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(vocab_size)}, "unk_token": "t0"},
    }


def tensor_list(cfg: dict) -> list[dict]:
    """Names and shapes from the model transformers would build (on the meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    plain = {k: v for k, v in cfg.items() if k not in ("architectures", "quantization_config")}
    config = AutoConfig.for_model(**plain)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tied = bool(cfg.get("tie_word_embeddings"))
    out = []
    for name, t in model.state_dict().items():
        shape = list(t.shape)
        if tied and name == "lm_head.weight":
            continue
        if cfg["model_type"] == "gpt_oss" and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            # [E, in, out] in the module; on disk [E, out, in/32, 16] blocks + [E, out, in/32] scales.
            e, fan_in, fan_out = shape
            assert fan_in % 32 == 0
            out.append({"name": name + "_blocks", "shape": [e, fan_out, fan_in // 32, 16], "dtype": "U8"})
            out.append({"name": name + "_scales", "shape": [e, fan_out, fan_in // 32], "dtype": "U8"})
            continue
        out.append({"name": name, "shape": shape, "dtype": "BF16"})
    out.sort(key=lambda t: t["name"])
    for t in out:
        t["init"] = init_for(cfg["model_type"], t["name"], t["shape"], t["dtype"])
    return out


def write_checkpoint(folder: Path, cfg: dict, tensors: list[dict]) -> dict[str, np.ndarray]:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(cfg["vocab_size"])) + "\n")
    arrays: dict[str, np.ndarray] = {}
    torch_tensors = {}
    for t in tensors:
        a = generate_tensor(t["name"], t["shape"], t["init"])
        arrays[t["name"]] = a
        if t["dtype"] == "BF16":
            torch_tensors[t["name"]] = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        else:
            torch_tensors[t["name"]] = torch.from_numpy(a.copy())
    save_file(torch_tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return arrays


# ---------------------------------------------------------------------------------------------
# Running transformers
# ---------------------------------------------------------------------------------------------

def dump_json(obj, level: int = 0) -> str:
    """JSON with objects indented and every list of scalars, tensor entry, logits row and
    top-5 step on one line (small, and readable in a diff)."""
    pad, inner = " " * level, " " * (level + 1)
    if isinstance(obj, dict) and obj and not (level > 0 and all(not isinstance(v, (dict, list)) for v in obj.values())):
        items = [f"{inner}{json.dumps(k)}: {dump_json(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj and any(isinstance(v, (dict, list)) for v in obj):
        return "[\n" + ",\n".join(inner + json.dumps(v) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj)


def round6(x: float) -> float:
    return float(f"{x:.6g}")


def load(folder: Path, cfg: dict, dtype):
    from transformers import AutoModelForCausalLM, Mxfp4Config

    kwargs = {"dtype": dtype, "attn_implementation": "eager", "output_loading_info": True}
    if cfg["model_type"] == "gpt_oss":
        # On CPU transformers dequantizes pre-quantized MXFP4 to bf16 anyway; say so explicitly.
        kwargs["quantization_config"] = Mxfp4Config(dequantize=True)
    model, info = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
    # Every tensor used, none missing (a tied lm_head may be listed as missing: it is tied).
    info = {k: list(v) for k, v in info.items() if v}
    if cfg.get("tie_word_embeddings") and "missing_keys" in info:
        info["missing_keys"] = [k for k in info["missing_keys"] if k != "lm_head.weight"] or None
        info = {k: v for k, v in info.items() if v}
    if info:
        raise SystemExit(f"{folder}: loading problems: {info}")
    model.eval()
    # No eos/bos from the model's defaults: the greedy golden always has MAX_NEW_TOKENS tokens
    # (generate() would otherwise put the config's eos_token_id back into our GenerationConfig).
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def check_config(model, cfg: dict) -> None:
    """Every key we wrote is what transformers uses (nothing silently ignored or rewritten)."""
    skip = {"architectures", "torch_dtype", "quantization_config", "model_type", "sliding_window_pattern"}
    for k, v in cfg.items():
        if k in skip:
            continue
        got = getattr(model.config, k)
        if isinstance(v, dict) and isinstance(got, dict):
            assert all(got.get(kk) == vv for kk, vv in v.items()), (k, v, got)
        else:
            assert got == v, (k, v, got)


def check_weights(model, cfg: dict, tensors: list[dict], arrays: dict[str, np.ndarray]) -> list[str]:
    """The loaded parameters are exactly the generated ones; returns notes (MXFP4 rule)."""
    import torch

    params = dict(model.named_parameters())
    notes = []
    for t in tensors:
        name = t["name"]
        if t["dtype"] == "U8":
            if not name.endswith("_blocks"):
                continue
            base = name[: -len("_blocks")]
            blocks, scales = arrays[name], arrays[base + "_scales"]
            want = mxfp4_dequantize(blocks, scales)  # [E, out, in]
            got = params[base].detach().to(torch.float32).numpy()  # [E, in, out]
            assert got.shape == (want.shape[0], want.shape[2], want.shape[1]), (name, got.shape, want.shape)
            assert np.array_equal(got, want.transpose(0, 2, 1)), f"MXFP4 dequantization differs for {base}"
            continue
        want = bf16_bits_to_f32(arrays[name])
        got = params[name].detach().to(torch.float32).numpy()
        assert np.array_equal(got, want), f"loaded {name} differs from the generated tensor"
    if cfg.get("tie_word_embeddings"):
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "lm_head not tied"
    if cfg["model_type"] == "gpt_oss":
        notes.append(
            "MXFP4 dequantization verified bit-exactly against the parameters transformers loaded"
            " (Mxfp4Config(dequantize=True) on CPU): for *_blocks [E, R, G, 16] and *_scales [E, R, G],"
            " W[e, r, 32g+2j] = FP4[blocks[e,r,g,j] & 15] * 2^(scales[e,r,g]-127) and"
            " W[e, r, 32g+2j+1] = FP4[blocks[e,r,g,j] >> 4] * 2^(scales[e,r,g]-127),"
            " FP4 = [0,.5,1,1.5,2,3,4,6,-0,-.5,-1,-1.5,-2,-3,-4,-6]; W[e] is [out, in] (gate_up: [2I, H],"
            " down: [H, I]); transformers stores the transpose ([E, in, out]) and computes x @ W^T."
            " gate_up output row 2i is gate_i and row 2i+1 is up_i (interleaved, not concatenated)."
        )
    return notes


def moe_clamp_stats(model, input_ids) -> dict:
    """How often the SwiGLU clamp (limit 7) bites in the float32 prompt pass (so the golden tests it)."""
    import torch

    stats = {"gate_values": 0, "gate_above_limit": 0, "up_values": 0, "up_outside_limit": 0}
    hooks = []

    def pre_hook(module, args, kwargs):
        x = args[0].reshape(-1, module.hidden_size)
        idx = kwargs["router_indices"]
        for tok in range(x.shape[0]):
            for e in idx[tok].tolist():
                gu = x[tok] @ module.gate_up_proj[e] + module.gate_up_proj_bias[e]
                gate, up = gu[::2], gu[1::2]
                stats["gate_values"] += gate.numel()
                stats["gate_above_limit"] += int((gate > module.limit).sum())
                stats["up_values"] += up.numel()
                stats["up_outside_limit"] += int((up.abs() > module.limit).sum())

    for layer in model.model.layers:
        hooks.append(layer.mlp.experts.register_forward_pre_hook(pre_hook, with_kwargs=True))
    with torch.no_grad():
        model(input_ids)
    for h in hooks:
        h.remove()
    return stats


def run_model(name: str, cfg: dict, description: str, folder: Path) -> dict:
    import safetensors
    import torch
    import transformers
    from transformers import GenerationConfig

    torch.manual_seed(0)
    tensors = tensor_list(cfg)
    arrays = write_checkpoint(folder, cfg, tensors)
    sha = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()

    input_ids = torch.tensor([PROMPT], dtype=torch.long)
    n = len(PROMPT)
    gen_cfg = GenerationConfig(
        max_new_tokens=MAX_NEW_TOKENS,
        do_sample=False,
        use_cache=True,
        eos_token_id=None,
        pad_token_id=0,
        bos_token_id=None,
        return_dict_in_generate=True,
        output_logits=True,
    )

    # bfloat16 compute (as loaded), for the tolerance hint.
    model16 = load(folder, cfg, torch.bfloat16)
    with torch.no_grad():
        logits16 = model16(input_ids).logits[0, -LAST_POSITIONS:, :].to(torch.float32)
        gen16 = model16.generate(input_ids, generation_config=gen_cfg)
    tokens16 = gen16.sequences[0, n:].tolist()
    del model16

    # float32 compute on the bf16 weights: the golden.
    model = load(folder, cfg, torch.bfloat16).float()
    check_config(model, cfg)
    notes = check_weights(model, cfg, tensors, arrays)
    with torch.no_grad():
        logits = model(input_ids).logits[0, -LAST_POSITIONS:, :]
        gen = model.generate(input_ids, generation_config=gen_cfg)
        seq = gen.sequences
        assert seq.shape[1] == n + MAX_NEW_TOKENS, seq.shape
        step_logits = torch.stack([s[0] for s in gen.logits])  # [steps, vocab]
        full = model(seq[:, :-1]).logits[0, n - 1 :, :]  # no cache, same positions
    tokens = seq[0, n:].tolist()
    assert step_logits.argmax(-1).tolist() == tokens
    cache_diff = float((full - step_logits).abs().max())
    top2 = step_logits.topk(2, dim=-1).values
    margins = (top2[:, 0] - top2[:, 1]).tolist()
    prompt_top2 = logits.topk(2, dim=-1).values
    top5 = []
    for s in range(step_logits.shape[0]):
        v, i = step_logits[s].topk(5)
        top5.append([[int(a), round6(float(b))] for a, b in zip(i.tolist(), v.tolist())])

    extra = {}
    if cfg["model_type"] == "gpt_oss":
        extra["swiglu_clamp_stats_prompt"] = moe_clamp_stats(model, input_ids)
    if cfg["model_type"] == "gemma3_text" and cfg.get("final_logit_softcapping"):
        cap = cfg["final_logit_softcapping"]
        extra["final_logits_abs_max_over_cap"] = round6(float(logits.abs().max()) / cap)

    golden = {
        "name": name,
        "description": description,
        "generator": GENERATOR,
        "config": cfg,
        "tensors": tensors,
        "checkpoint": {
            "files": ["config.json", "model.safetensors", "tokenizer.json"],
            "model.safetensors_sha256": sha,
            "safetensors_metadata": {"format": "pt"},
        },
        "input_ids": PROMPT,
        "logits_positions": list(range(n - LAST_POSITIONS, n)),
        "logits": [[round6(v) for v in row] for row in logits.tolist()],
        "greedy": {
            "max_new_tokens": MAX_NEW_TOKENS,
            "eos_stopping": False,
            "tokens": tokens,
            "first_eos_index": tokens.index(cfg["eos_token_id"]) if cfg.get("eos_token_id") in tokens else None,
            "top5_per_step": top5,
            "min_top1_top2_margin": round6(min(margins)),
        },
        "tolerance_hints": {
            "compute": "float32 on bf16-rounded weights, eager attention, batch 1",
            "logits_abs_max": round6(float(logits.abs().max())),
            "prompt_min_top1_top2_margin": round6(float((prompt_top2[:, 0] - prompt_top2[:, 1]).min())),
            "bf16_compute_max_abs_logit_diff": round6(float((logits16 - logits).abs().max())),
            "bf16_compute_greedy_tokens": tokens16,
            "bf16_compute_greedy_agrees_for": next(
                (i for i, (a, b) in enumerate(zip(tokens, tokens16)) if a != b), MAX_NEW_TOKENS
            ),
            "kv_cache_decode_vs_full_forward_max_abs_logit_diff": round6(cache_diff),
            **extra,
        },
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "safetensors": safetensors.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "notes": notes,
    }
    return golden


def check_prompt() -> None:
    x = draws(fnv1a64(b"prompt-9"), len(PROMPT))
    assert PROMPT == [3 + int(v % 253) for v in x]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--keep", type=Path, help="keep the checkpoint folders under this directory")
    ap.add_argument("--only", help="comma-separated golden names")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    names = list(MODELS) if not args.only else args.only.split(",")
    check_prompt()
    print_pins()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        for name in names:
            cfg, description = MODELS[name]
            golden = run_model(name, json.loads(json.dumps(cfg)), description, root / name)
            path = args.out / f"{name}.json"
            text = dump_json(golden) + "\n"
            assert json.loads(text) == golden
            path.write_text(text)
            h = golden["tolerance_hints"]
            print(
                f"{name}: {path.stat().st_size} B, {len(golden['tensors'])} tensors,"
                f" {sum(int(np.prod(t['shape'])) for t in golden['tensors'])} elements;"
                f" greedy {golden['greedy']['tokens']}; |logits| <= {h['logits_abs_max']};"
                f" bf16 diff {h['bf16_compute_max_abs_logit_diff']};"
                f" cache diff {h['kv_cache_decode_vs_full_forward_max_abs_logit_diff']};"
                f" min margin {golden['greedy']['min_top1_top2_margin']}"
                + (f"; clamp {h['swiglu_clamp_stats_prompt']}" if "swiglu_clamp_stats_prompt" in h else ""),
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
