#!/usr/bin/env python3
"""Turn a quantized llama.cpp GGUF (llama, qwen2 or gemma3 architecture) into the same
weights in two 16-bit forms, without torch or transformers:

* a Hugging Face model folder: `model.safetensors` (bf16, HF tensor names and layout),
  `config.json`, `generation_config.json`, `tokenizer.json`, `tokenizer_config.json`;
* an F16 GGUF: the source's metadata and tensor names, matrices F16, 1-D tensors F32,
  `general.file_type` = MOSTLY_F16.

Both hold the *same* numbers: every tensor is dequantized (gguf.quants.dequantize), put in
HF's layout and meaning, rounded to bf16 (round to nearest even) and, for the GGUF, mapped
back to llama.cpp's layout and meaning. A bf16 value has 8 significant bits, F16 has 11, so
it is exact in F16 when it lies in F16's range: |v| <= 65504 and v a multiple of 2**-24
(F16's smallest subnormal). The conversion checks this for every value; a value that is not
exact (none in the pinned models) is moved to the nearest value both types hold exactly
(bf16(f16(v))), and the count is reported.

What "HF layout and meaning" undoes (llama.cpp as vendored in llama-cpp-python 0.3.36:
`conversion/llama.py`, `conversion/qwen.py`, `conversion/gemma.py`):

* llama: `LlamaModel.permute` reorders the rows of q_proj / k_proj (per head, rotate-half to
  interleaved RoPE); the inverse permutation is applied. qwen2 and gemma3 are not permuted.
* gemma3: `Gemma3Model.norm_shift` adds 1 to every `*norm.weight`; 1 is subtracted so the
  checkpoint means what HF Gemma3RMSNorm means (y = x * (1 + w)). The GGUF side stores
  f32(1 + w) with w the bf16 value, which is exactly what HF computes at run time.
* no `output.weight` in the GGUF: tied embeddings (no `lm_head.weight`,
  `tie_word_embeddings: true`).

The tokenizer is rebuilt with the `tokenizers` library from the GGUF vocabulary:
`tokenizer.ggml.model == "gpt2"`: byte-level BPE with the GGUF merges and the pre-tokenizer
that `tokenizer.ggml.pre` names in llama.cpp (smollm, qwen2, gpt2; for qwen2 also the NFC
normalizer of Qwen2's own tokenizer.json, which llama.cpp does not apply: text that is not
in NFC, e.g. "e" + U+0301, tokenizes differently in the two);
`tokenizer.ggml.model == "llama"` (SentencePiece BPE with scores, e.g. Gemma): a BPE with
byte fallback whose merges are derived from the scores the way transformers'
SentencePieceExtractor does (every split of a piece into two pieces, ranked by the piece's
score), with " " -> "\u2581" as the normalizer. CONTROL tokens (type 3) become special added
tokens, USER_DEFINED ones (type 4) non-special added tokens, as llama.cpp matches both in the
raw text before the BPE.

Usage:
  convert_gguf_hf.py SRC.gguf [--hf-dir DIR] [--f16 OUT.gguf] [--verify]
  convert_gguf_hf.py SRC.gguf [--hf-dir DIR] [--f16 OUT.gguf] --verify-only

--hf-dir must not exist or be empty. --verify checks what was written: the safetensors
header (names, dtypes, shapes against config.json), the F16 GGUF (metadata, names, types,
shapes, and every value against a fresh conversion of the source), both files against each
other value by value when both are given, and the tokenizer: about a dozen strings (ASCII,
code, accents, CJK, emoji, the chat template's special tokens) encoded with tokenizer.json
and with llama.cpp's `llama-tokenize` on the source GGUF (--llama-tokenize PATH, else
$LLMR_LLAMA_TOKENIZE, else the one in bench/reference/build.sh's build tree, if built: that
script builds other tools; add this one with `cmake --build
~/.cache/llmr/reference/llama-cpp-python-0.3.36/build --target llama-tokenize`); the ids
must be equal. Without llama-tokenize the comparison is skipped (said on stderr) and
only decode(encode(s)) == s is checked.

Output is deterministic (tensor order, JSON key order), so the files' sha256 can be pinned.
Needs numpy, gguf, safetensors, tokenizers (fetch-models installs them in a private venv).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import gguf
from gguf.constants import GGMLQuantizationType as QT
from gguf.constants import GGUFValueType as VT

SUPPORTED_ARCHS = ("llama", "qwen2", "gemma3")
F16_MAX = 65504.0


def fail(msg: str) -> None:
    print(f"convert_gguf_hf: error: {msg}", file=sys.stderr)
    sys.exit(1)


def log(msg: str) -> None:
    print(f"convert_gguf_hf: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- GGUF metadata

class Meta:
    def __init__(self, reader: gguf.GGUFReader):
        self.reader = reader
        self.arch = self.get("general.architecture")
        if self.arch not in SUPPORTED_ARCHS:
            fail(f"architecture {self.arch!r} is not supported ({', '.join(SUPPORTED_ARCHS)})")

    def get(self, key: str, default=None):
        field = self.reader.fields.get(key)
        if field is None:
            return default
        return field.contents()

    def a(self, key: str, default=None):
        return self.get(f"{self.arch}.{key}", default)

    def need(self, key: str):
        value = self.a(key)
        if value is None:
            fail(f"the GGUF has no {self.arch}.{key}")
        return value


def f32_decimal(x: float) -> float:
    """The shortest decimal that reads back as the same float32 (1e-06, not 9.99e-07)."""
    return float(str(np.float32(x)))


# ---------------------------------------------------------------------------- tensors

BLOCK_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
TOP_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(arch: str, name: str) -> str:
    if name in TOP_MAP:
        return TOP_MAP[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk":
        rest = parts[2]
        if rest == "ffn_norm.weight":
            # llama/qwen2: the norm before the MLP is HF's post_attention_layernorm; gemma3
            # has four norms and this one is pre_feedforward_layernorm.
            hf = "pre_feedforward_layernorm.weight" if arch == "gemma3" else "post_attention_layernorm.weight"
        else:
            hf = BLOCK_MAP.get(rest)
        if hf is not None:
            return f"model.layers.{int(parts[1])}.{hf}"
    fail(f"no Hugging Face name for the {arch} tensor {name!r}")
    raise AssertionError


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's LlamaModel.permute (interleaved RoPE rows -> rotate-half)."""
    out = w.shape[0]
    return w.reshape(n_head, out // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute (rotate-half rows -> interleaved RoPE)."""
    out = w.shape[0]
    return w.reshape(n_head, 2, out // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.all(np.isfinite(x)):
        fail("a tensor holds NaN or infinity")
    u = x.view(np.uint32)
    return ((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)).astype(np.uint16)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


class Converted:
    """One tensor: the HF side (name, bf16 bits in HF layout) and the GGUF side (values)."""

    __slots__ = ("gguf_name", "hf_name", "hf_bits", "gguf_values", "gguf_type", "regridded")

    def __init__(self, gguf_name, hf_name, hf_bits, gguf_values, gguf_type, regridded):
        self.gguf_name = gguf_name
        self.hf_name = hf_name
        self.hf_bits = hf_bits
        self.gguf_values = gguf_values
        self.gguf_type = gguf_type
        self.regridded = regridded


def to_common_grid(bits: np.ndarray) -> tuple[np.ndarray, int]:
    """bf16 bits whose values F16 also holds exactly; returns (bits, how many were moved)."""
    v = bf16_values(bits)
    if np.any(np.abs(v) > F16_MAX):
        fail(f"a value ({np.abs(v).max()}) is beyond F16's range; an F16 GGUF cannot hold these weights")
    exact = v.astype(np.float16).astype(np.float32) == v
    moved = int(exact.size - np.count_nonzero(exact))
    if moved:
        fixed = bf16_bits(v.astype(np.float16).astype(np.float32))
        bits = np.where(exact, bits, fixed)
        v2 = bf16_values(bits)
        assert np.all(v2.astype(np.float16).astype(np.float32) == v2)
    return bits, moved


def convert_tensors(meta: Meta):
    """Yield a Converted per source tensor, in the source's order."""
    arch = meta.arch
    n_head = int(meta.need("attention.head_count"))
    n_head_kv = int(meta.a("attention.head_count_kv", n_head))
    for t in meta.reader.tensors:
        name = t.name
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        w = np.asarray(w, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
        if arch == "llama" and name.endswith("attn_q.weight"):
            w = unpermute_rows(w, n_head)
        elif arch == "llama" and name.endswith("attn_k.weight"):
            w = unpermute_rows(w, n_head_kv)
        norm_shift = arch == "gemma3" and name.endswith("norm.weight")
        if norm_shift:
            w = w - np.float32(1.0)
        bits = bf16_bits(w)
        del w
        regridded = 0
        if bits.ndim >= 2:
            bits, regridded = to_common_grid(bits)
        v = bf16_values(bits)
        if norm_shift:
            v = v + np.float32(1.0)  # what HF computes: (1.0 + w.float())
        if arch == "llama" and name.endswith("attn_q.weight"):
            v = permute_rows(v, n_head)
        elif arch == "llama" and name.endswith("attn_k.weight"):
            v = permute_rows(v, n_head_kv)
        if v.ndim >= 2:
            gv, gt = v.astype(np.float16), QT.F16
        else:
            gv, gt = np.ascontiguousarray(v, dtype=np.float32), QT.F32
        yield Converted(name, hf_name(arch, name), bits, gv, gt, regridded)


# ---------------------------------------------------------------------------- config

def rope_scaling(meta: Meta) -> dict | None:
    kind = meta.a("rope.scaling.type")
    if kind in (None, "none"):
        return None
    factor = meta.a("rope.scaling.factor")
    if kind not in ("linear", "yarn") or factor is None:
        fail(f"rope scaling {kind!r} is not supported")
    out = {"rope_type": kind, "factor": f32_decimal(factor)}
    orig = meta.a("rope.scaling.original_context_length")
    if orig is not None:
        out["original_max_position_embeddings"] = int(orig)
    return out


def build_config(meta: Meta, vocab_size: int, tied: bool, has_qkv_bias: bool) -> dict:
    arch = meta.arch
    hidden = int(meta.need("embedding_length"))
    n_head = int(meta.need("attention.head_count"))
    n_layer = int(meta.need("block_count"))
    head_dim = int(meta.a("attention.key_length", hidden // n_head))
    rope_dim = meta.a("rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != head_dim:
        fail(f"partial rotary embeddings (rope.dimension_count {rope_dim} != head_dim {head_dim}) are not supported")
    ctx = int(meta.need("context_length"))
    cfg: dict = {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": int(meta.need("feed_forward_length")),
        "num_hidden_layers": n_layer,
        "num_attention_heads": n_head,
        "num_key_value_heads": int(meta.a("attention.head_count_kv", n_head)),
        "head_dim": head_dim,
        "max_position_embeddings": ctx,
        "rms_norm_eps": f32_decimal(meta.need("attention.layer_norm_rms_epsilon")),
        "rope_theta": f32_decimal(meta.a("rope.freq_base", 10000.0)),
        "rope_scaling": rope_scaling(meta),
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
    }
    for key, gkey in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                      ("pad_token_id", "padding_token_id")):
        v = meta.get(f"tokenizer.ggml.{gkey}")
        if v is not None:
            cfg[key] = int(v)
    if arch == "llama":
        cfg.update({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "attention_bias": has_qkv_bias,
            "mlp_bias": False,
            "pretraining_tp": 1,
        })
    elif arch == "qwen2":
        if not has_qkv_bias:
            fail("a qwen2 GGUF without q/k/v biases: HF Qwen2 always has them")
        cfg.update({
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_act": "silu",
            "use_sliding_window": False,
            "sliding_window": ctx,
            "max_window_layers": n_layer,
        })
    elif arch == "gemma3":
        swa = meta.a("attention.sliding_window")
        pattern = meta.a("attention.sliding_window_pattern", 6)  # llama.cpp's default for gemma3
        if isinstance(pattern, list):
            layer_types = ["sliding_attention" if p else "full_attention" for p in pattern]
            pattern_n = None
        else:
            pattern_n = int(pattern)
            # llama.cpp hparams.set_swa_pattern(n): layer il is SWA unless il % n == n - 1
            layer_types = ["sliding_attention" if (il % pattern_n) < pattern_n - 1 else "full_attention"
                           for il in range(n_layer)]
        if not swa:
            layer_types = ["full_attention"] * n_layer
        # llama.cpp (src/models/gemma3.cpp): 1/sqrt(head_dim), but n_embd/n_head for the 27B
        qpas = hidden // n_head if n_layer == 62 else head_dim
        softcap = meta.a("final_logit_softcapping")
        cfg.update({
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "hidden_activation": "gelu_pytorch_tanh",
            "attention_bias": False,
            "attn_logit_softcapping": None,
            "final_logit_softcapping": f32_decimal(softcap) if softcap else None,
            "query_pre_attn_scalar": qpas,
            "sliding_window": int(swa) if swa else None,
            "layer_types": layer_types,
            # llama.cpp's default for freq_base_swa (hparams.rope_freq_base_train_swa)
            "rope_local_base_freq": f32_decimal(meta.a("rope.freq_base_swa", 10000.0)),
            "use_bidirectional_attention": False,
        })
        if pattern_n is not None:
            cfg["sliding_window_pattern"] = pattern_n  # what transformers < 4.53 reads
    return dict(sorted(cfg.items()))


# ---------------------------------------------------------------------------- tokenizer

# llama.cpp's pre-tokenizer regexes (src/llama-vocab.cpp) as HF tokenizer.json writes them.
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


def spm_merges(tokens: list[str], types: list[int], scores: list[float]) -> list[tuple[str, str]]:
    """Merges of a SentencePiece BPE vocabulary, as transformers' SentencePieceExtractor
    derives them: every split of a normal piece into two normal pieces, the pieces ranked by
    score (highest first; llama.cpp's SPM tokenizer merges the pair whose union scores
    highest), the splits of one piece by the ids of their halves."""
    ids = {t: i for i, t in enumerate(tokens) if types[i] == TOKEN_NORMAL}
    found = []
    for piece, pid in ids.items():
        for k in range(1, len(piece)):
            left = ids.get(piece[:k])
            if left is None:
                continue
            right = ids.get(piece[k:])
            if right is not None:
                found.append((-scores[pid], pid, left, right))
    found.sort()
    return [(tokens[left], tokens[right]) for _, _, left, right in found]


def build_tokenizer(meta: Meta):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors

    kind = meta.get("tokenizer.ggml.model")
    tokens: list[str] = meta.get("tokenizer.ggml.tokens")
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    if len(set(tokens)) != len(tokens):
        fail("the GGUF vocabulary has duplicate tokens")
    vocab = {t: i for i, t in enumerate(tokens)}

    def tok_text(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}")
        return None if i is None else tokens[int(i)]

    bos, eos, unk = tok_text("bos_token_id"), tok_text("eos_token_id"), tok_text("unknown_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))

    if kind == "gpt2":
        pre = meta.get("tokenizer.ggml.pre", "default")
        merges = []
        for m in meta.get("tokenizer.ggml.merges"):
            a, sep, b = m.partition(" ")
            if not sep or " " in b:
                fail(f"unexpected merge {m!r}")
            merges.append((a, b))
        tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
        if pre == "smollm":
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            ])
        elif pre in ("gpt2", "default"):
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                                         use_regex=True)
        elif pre == "qwen2":
            tok.normalizer = normalizers.NFC()  # as Qwen2's own tokenizer.json
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ])
        else:
            fail(f"pre-tokenizer {pre!r} is not supported (smollm, qwen2, gpt2)")
        tok.decoder = decoders.ByteLevel()
        default_post = processors.ByteLevel(trim_offsets=False)
    elif kind == "llama":
        if meta.get("tokenizer.ggml.add_space_prefix", True):
            fail("SentencePiece vocabularies with add_space_prefix are not supported")
        scores = meta.get("tokenizer.ggml.scores")
        merges = spm_merges(tokens, types, scores)
        tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                         decoders.Fuse()])
        default_post = None
    else:
        fail(f"tokenizer model {kind!r} is not supported (gpt2, llama)")
        raise AssertionError

    added = [AddedToken(t, special=(ty == TOKEN_CONTROL), normalized=False, lstrip=False,
                        rstrip=False, single_word=False)
             for t, ty in zip(tokens, types) if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]
    tok.add_tokens(added)

    if add_bos or add_eos:
        single, pair, specials = ["$A:0"], ["$A:0"], []
        if add_bos:
            single.insert(0, f"{bos}:0")
            pair = [f"{bos}:0", "$A:0", f"{bos}:1", "$B:1"]
            specials.append((bos, vocab[bos]))
        else:
            pair = ["$A:0", "$B:1"]
        if add_eos:
            single.append(f"{eos}:0")
            pair = pair[:pair.index("$A:0") + 1] + [f"{eos}:0"] + pair[pair.index("$A:0") + 1:] + [f"{eos}:1"]
            if not add_bos or eos != bos:
                specials.append((eos, vocab[eos]))
        tok.post_processor = processors.TemplateProcessing(single=" ".join(single), pair=" ".join(pair),
                                                           special_tokens=specials)
    elif default_post is not None:
        tok.post_processor = default_post

    for i, t in enumerate(tokens):
        if tok.token_to_id(t) != i:
            fail(f"token {t!r} has id {tok.token_to_id(t)} in tokenizer.json, {i} in the GGUF")

    tconf = {
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "bos_token": bos,
        "clean_up_tokenization_spaces": False,
        "eos_token": eos,
        "model_max_length": int(meta.need("context_length")),
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    pad = tok_text("padding_token_id")
    if pad is not None:
        tconf["pad_token"] = pad
    if unk is not None:
        tconf["unk_token"] = unk
    template = meta.get("tokenizer.chat_template")
    if template is not None:
        tconf["chat_template"] = template
    return tok, dict(sorted(tconf.items()))


# ---------------------------------------------------------------------------- writing

def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


def write_safetensors(path: Path, tensors: list[tuple[str, np.ndarray]]) -> None:
    """bf16 tensors (uint16 bit patterns) in name order, written with the safetensors library."""
    from safetensors import TensorSpec, serialize_file

    specs = {}
    keep = []
    for name, bits in sorted(tensors):
        arr = np.ascontiguousarray(bits, dtype="<u2")
        keep.append(arr)
        specs[name] = TensorSpec(dtype="bfloat16", shape=list(arr.shape), data_ptr=arr.ctypes.data,
                                 data_len=arr.nbytes)
    serialize_file(specs, str(path), metadata={"format": "pt"})
    del keep
    os.chmod(path, 0o644)  # the library creates it 0600; the other files follow the umask


def copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> None:
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the header's own fields; the writer adds the architecture itself
        if key == "general.file_type":
            writer.add_key_value(key, int(gguf.LlamaFileType.MOSTLY_F16), VT.UINT32)
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == VT.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub)
    if "general.file_type" not in reader.fields:
        writer.add_key_value("general.file_type", int(gguf.LlamaFileType.MOSTLY_F16), VT.UINT32)


def convert(src: Path, hf_dir: Path | None, f16: Path | None) -> None:
    t0 = time.monotonic()
    reader = gguf.GGUFReader(src)
    meta = Meta(reader)
    names = [t.name for t in reader.tensors]
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    vocab_size = int(emb.shape[1])
    n_tokens = len(meta.get("tokenizer.ggml.tokens"))
    if n_tokens != vocab_size:
        fail(f"the vocabulary has {n_tokens} tokens but token_embd has {vocab_size} rows")
    tied = "output.weight" not in names
    has_bias = any(n.endswith("attn_q.bias") for n in names)

    writer = None
    if f16 is not None:
        f16_tmp = f16.with_name(f16.name + ".tmp")
        writer = gguf.GGUFWriter(str(f16_tmp), meta.arch)
        copy_metadata(reader, writer)
    hf_tensors: list[tuple[str, np.ndarray]] = []
    regridded = total = 0
    for c in convert_tensors(meta):
        regridded += c.regridded
        total += c.hf_bits.size
        if hf_dir is not None:
            hf_tensors.append((c.hf_name, c.hf_bits))
        if writer is not None:
            writer.add_tensor(c.gguf_name, c.gguf_values)
    log(f"{src.name}: {len(names)} tensors, {total:,} values dequantized and rounded to bf16 "
        f"({time.monotonic() - t0:.1f}s); values moved onto F16's grid: {regridded}")

    if writer is not None:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(f16_tmp, f16)
        log(f"wrote {f16} ({f16.stat().st_size:,} B)")

    if hf_dir is not None:
        hf_dir.mkdir(parents=True, exist_ok=True)
        if any(hf_dir.iterdir()):
            fail(f"{hf_dir} is not empty")
        write_safetensors(hf_dir / "model.safetensors", hf_tensors)
        del hf_tensors
        config = build_config(meta, vocab_size, tied, has_bias)
        write_json(hf_dir / "config.json", config)
        gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
        write_json(hf_dir / "generation_config.json", gen)
        tok, tconf = build_tokenizer(meta)
        tok.save(str(hf_dir / "tokenizer.json"), pretty=False)
        write_json(hf_dir / "tokenizer_config.json", tconf)
        log(f"wrote {hf_dir} (model.safetensors {(hf_dir / 'model.safetensors').stat().st_size:,} B)")
    log(f"done in {time.monotonic() - t0:.1f}s")


# ---------------------------------------------------------------------------- verification

def read_safetensors_header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return header, 8 + n


def expected_hf_shapes(cfg: dict) -> dict[str, list[int]]:
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    gemma = cfg["model_type"] == "gemma3_text"
    out = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h]}
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = [v, h]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": [h],
            p + "post_attention_layernorm.weight": [h],
            p + "self_attn.q_proj.weight": [nh * hd, h],
            p + "self_attn.k_proj.weight": [nkv * hd, h],
            p + "self_attn.v_proj.weight": [nkv * hd, h],
            p + "self_attn.o_proj.weight": [h, nh * hd],
            p + "mlp.gate_proj.weight": [inter, h],
            p + "mlp.up_proj.weight": [inter, h],
            p + "mlp.down_proj.weight": [h, inter],
        })
        if cfg["model_type"] == "qwen2" or cfg.get("attention_bias"):
            out.update({p + "self_attn.q_proj.bias": [nh * hd], p + "self_attn.k_proj.bias": [nkv * hd],
                        p + "self_attn.v_proj.bias": [nkv * hd]})
        if gemma:
            out.update({p + "pre_feedforward_layernorm.weight": [h],
                        p + "post_feedforward_layernorm.weight": [h],
                        p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd]})
    return out


def find_llama_tokenize(arg: str | None) -> Path | None:
    if arg:
        return Path(arg)
    if os.environ.get("LLMR_LLAMA_TOKENIZE"):
        return Path(os.environ["LLMR_LLAMA_TOKENIZE"])
    ref = Path(os.environ.get("LLMR_REFERENCE_CACHE", Path.home() / ".cache" / "llmr" / "reference"))
    found = sorted(ref.glob("llama-cpp-python-*/build/bin/llama-tokenize"))
    return found[-1] if found else None


def sample_texts(meta: Meta, tconf: dict) -> list[str]:
    texts = [
        "The capital of France is Paris.",
        "Hello world! How are you doing today?  Double  spaces,\ttabs and\nnew lines.\n\n\n",
        "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # 12345\n",
        "fn main() { let v: Vec<u8> = vec![0xFF, 0x10]; println!(\"{:?}\", v); }",
        "Café, naïve, façade, Zürich, São Paulo, Ærøskøbing, crème brûlée",
        "日本語のテキストと中文文本，还有한국어 텍스트。",
        "Emoji: 🚀🔥👍🏽 👨‍👩‍👧 ✅ and math ∑∫√ ≤ ≥",
        "Numbers 3.14159 1,000,000 2024-06-01 and I've, you'RE, it's, we'll",
        "   leading spaces and trailing   ",
    ]
    specials = []
    for key in ("bos_token", "eos_token", "pad_token"):
        if tconf.get(key):
            specials.append(tconf[key])
    template = tconf.get("chat_template") or ""
    tokens = meta.get("tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type")
    for t, ty in zip(tokens, types):
        if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED) and len(t) > 2 and t in template and t not in specials:
            specials.append(t)
    for t in ("<start_of_turn>", "<end_of_turn>"):
        if t in tokens and t not in specials:
            specials.append(t)
    if specials:
        texts.append(f"{specials[0]}user\nHi there!{specials[-1]}\n" + "".join(specials))
    if "<|im_start|>" in tokens:
        texts.append("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?"
                     "<|im_end|>\n<|im_start|>assistant\n")
    if "<start_of_turn>" in tokens:
        texts.append("<start_of_turn>user\nWrite a haiku.<end_of_turn>\n<start_of_turn>model\n")
    return texts


def llama_tokenize(exe: Path, model: Path, text: str) -> list[int]:
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        name = f.name
    try:
        res = subprocess.run([str(exe), "-m", str(model), "-f", name, "--no-escape", "--ids", "--log-disable"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        os.unlink(name)
    if res.returncode != 0:
        fail(f"{exe} failed (exit {res.returncode}): {res.stderr.strip()[-500:]}")
    line = res.stdout.strip().splitlines()[-1]
    return json.loads(line)


def verify_tokenizer(src: Path, meta: Meta, hf_dir: Path, exe_arg: str | None) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    tconf = json.loads((hf_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    if tok.get_vocab_size(with_added_tokens=True) != len(meta.get("tokenizer.ggml.tokens")):
        fail("tokenizer.json's vocabulary size differs from the GGUF's")
    exe = find_llama_tokenize(exe_arg)
    if exe is not None and not exe.is_file():
        fail(f"llama-tokenize not found at {exe}")
    if exe is None:
        log("tokenizer: no llama-tokenize (build it with bench/reference/build.sh's tree, or pass "
            "--llama-tokenize); comparison with llama.cpp SKIPPED, only round trips checked")
    mismatches = 0
    texts = sample_texts(meta, tconf)
    for text in texts:
        ids = tok.encode(text, add_special_tokens=True).ids
        decoded = tok.decode(ids, skip_special_tokens=False)
        expect_text = (tconf["bos_token"] if tconf.get("add_bos_token") else "") + text
        if decoded != expect_text:
            fail(f"tokenizer round trip: {text!r} decodes to {decoded!r}")
        if exe is not None:
            ref = llama_tokenize(exe, src, text)
            if ref != ids:
                mismatches += 1
                log(f"tokenizer MISMATCH on {text!r}:\n  tokenizer.json {ids}\n  llama.cpp      {ref}")
    if mismatches:
        fail(f"tokenizer: {mismatches} of {len(texts)} strings tokenize differently from llama.cpp")
    what = f"identical to llama.cpp ({exe})" if exe else "round trips only"
    log(f"tokenizer: {len(texts)} strings, ids {what}")


def verify(src: Path, hf_dir: Path | None, f16: Path | None, exe_arg: str | None) -> None:
    from safetensors import safe_open

    t0 = time.monotonic()
    reader = gguf.GGUFReader(src)
    meta = Meta(reader)
    hf_file = hf_header = hf_base = None
    f16_tensors = None
    if hf_dir is not None:
        for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                     "tokenizer_config.json"):
            if not (hf_dir / name).is_file():
                fail(f"{hf_dir} has no {name}")
        cfg = json.loads((hf_dir / "config.json").read_text())
        want = expected_hf_shapes(cfg)
        hf_file = hf_dir / "model.safetensors"
        with safe_open(str(hf_file), framework="numpy") as st:
            got = {k: list(st.get_slice(k).get_shape()) for k in st.keys()}
            dtypes = {st.get_slice(k).get_dtype() for k in st.keys()}
        if got != want:
            missing = sorted(set(want) - set(got))[:5]
            extra = sorted(set(got) - set(want))[:5]
            bad = sorted(k for k in set(got) & set(want) if got[k] != want[k])[:5]
            fail(f"model.safetensors does not match config.json: missing {missing}, unexpected {extra}, "
                 f"wrong shape {bad}")
        if dtypes != {"BF16"}:
            fail(f"model.safetensors dtypes {dtypes}, expected BF16 only")
        hf_header, hf_base = read_safetensors_header(hf_file)
        log(f"model.safetensors: {len(got)} tensors, names and shapes match config.json ({cfg['model_type']})")
        verify_tokenizer(src, meta, hf_dir, exe_arg)
    if f16 is not None:
        out = gguf.GGUFReader(f16)
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            want = int(gguf.LlamaFileType.MOSTLY_F16) if key == "general.file_type" else field.contents()
            o = out.fields.get(key)
            if o is None or o.contents() != want or o.types != field.types:
                fail(f"{f16.name}: metadata {key} differs from the source")
        if out.fields["general.file_type"].contents() != int(gguf.LlamaFileType.MOSTLY_F16):
            fail(f"{f16.name}: general.file_type is not MOSTLY_F16")
        if [t.name for t in out.tensors] != [t.name for t in reader.tensors]:
            fail(f"{f16.name}: tensor names or order differ from the source")
        f16_tensors = {t.name: t for t in out.tensors}
        for s in reader.tensors:
            o = f16_tensors[s.name]
            want_type = QT.F16 if len(s.shape) >= 2 else QT.F32
            if list(o.shape) != list(s.shape) or o.tensor_type != want_type:
                fail(f"{f16.name}: {s.name} is {o.tensor_type.name} {list(o.shape)}, expected "
                     f"{want_type.name} {list(s.shape)}")
        log(f"{f16.name}: metadata, {len(out.tensors)} tensor names, shapes and types match the source")

    # every value: a fresh conversion of the source against what the files hold
    hf_map = np.memmap(hf_file, dtype=np.uint8, mode="r") if hf_file is not None else None
    n = 0
    for c in convert_tensors(meta):
        if hf_map is not None:
            h = hf_header[c.hf_name]
            a, b = h["data_offsets"]
            bits = hf_map[hf_base + a:hf_base + b].view("<u2").reshape(h["shape"])
            if not np.array_equal(bits, c.hf_bits):
                fail(f"model.safetensors: {c.hf_name} differs from the conversion of {c.gguf_name}")
        if f16_tensors is not None:
            data = np.asarray(f16_tensors[c.gguf_name].data).reshape(c.gguf_values.shape)
            if not np.array_equal(data.view(np.uint8), c.gguf_values.view(np.uint8)):
                fail(f"{f16.name}: {c.gguf_name} differs from the conversion of the source")
        if hf_map is not None and f16_tensors is not None:
            # the two files hold the same numbers: the GGUF's, put in HF layout and meaning
            g = np.asarray(f16_tensors[c.gguf_name].data, dtype=np.float32).reshape(c.gguf_values.shape)
            if meta.arch == "llama" and c.gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
                nh = int(meta.need("attention.head_count"))
                if c.gguf_name.endswith("attn_k.weight"):
                    nh = int(meta.a("attention.head_count_kv", nh))
                g = unpermute_rows(g, nh)
            hv = bf16_values(bits)
            if meta.arch == "gemma3" and c.gguf_name.endswith("norm.weight"):
                hv = hv + np.float32(1.0)
            if not np.array_equal(g, hv):
                fail(f"{c.gguf_name}: the F16 GGUF and model.safetensors hold different values")
        n += 1
    both = " (and equal to each other)" if hf_map is not None and f16_tensors is not None else ""
    log(f"values: all {n} tensors equal a fresh conversion of the source{both} "
        f"({time.monotonic() - t0:.1f}s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="the quantized source GGUF")
    ap.add_argument("--hf-dir", type=Path, help="write the Hugging Face folder here (absent or empty)")
    ap.add_argument("--f16", type=Path, help="write the F16 GGUF here")
    ap.add_argument("--verify", action="store_true", help="check what was written")
    ap.add_argument("--verify-only", action="store_true", help="only check existing outputs")
    ap.add_argument("--llama-tokenize", metavar="PATH", help="llama.cpp's llama-tokenize for the check")
    args = ap.parse_args()
    if args.hf_dir is None and args.f16 is None:
        ap.error("give --hf-dir and/or --f16")
    if not args.verify_only:
        convert(args.src, args.hf_dir, args.f16)
    if args.verify or args.verify_only:
        verify(args.src, args.hf_dir, args.f16, args.llama_tokenize)


if __name__ == "__main__":
    main()
