#!/usr/bin/env python3
"""Convert sentence-transformers all-MiniLM-L6-v2 (a HF `BertModel` checkpoint) to a
llama.cpp BERT GGUF (f16 matrices, f32 norms / biases / position and token-type
embeddings), without torch or transformers.

This reproduces what llama.cpp's `convert_hf_to_gguf.py --outtype f16` does for a
`BertModel` (its `conversion/bert.py` + `conversion/base.py`, llama.cpp as vendored in
llama-cpp-python 0.3.36, gguf-py 0.19.0):

* tensors are read in name order (as safetensors lists them), `embeddings.position_ids`,
  `pooler.*`, `cls.predictions.*` and `cls.seq_relationship.*` are dropped, the rest are
  renamed with `gguf.get_tensor_name_map(MODEL_ARCH.BERT, n_layer)`;
* 1-D tensors, `*_norm.weight`, anything not ending in `.weight`, `position_embd.weight`
  and `token_types.weight` are F32, every other matrix is F16;
* metadata: `general.*` from `gguf.Metadata` (model card + config), the hyper-parameters,
  `bert.attention.causal = false`, `bert.pooling_type` from the sentence-transformers
  Pooling module (mean -> 1), `tokenizer.ggml.model = "bert"`, the WordPiece vocab of
  `vocab.txt` rewritten to llama.cpp's "phantom space" form (`##x` -> `x`, `x` -> `\u2581x`,
  control tokens unchanged), token types, `tokenizer.ggml.pre` from the pre-tokenizer hash,
  special token ids from `gguf.SpecialVocab`, and `tokenizer.ggml.normalizer.lowercase`
  (written by newer gguf-py than PyPI's 0.19.0); one extra: `tokenizer.ggml.cls_token_id`.

Usage:
  convert_minilm_gguf.py MODEL_DIR OUT.gguf [--verify]   convert (then check)
  convert_minilm_gguf.py MODEL_DIR --verify-only OUT.gguf  only check an existing GGUF

The check reads the GGUF back (tensor count, names, shapes, types, key metadata) and runs
a small numpy BERT forward pass (mean pooling, L2 norm) on two sentences from the GGUF
tensors and from the original fp32 safetensors; the cosine of each pair must be > 0.999.

Needs numpy, gguf, safetensors, tokenizers (fetch-models installs them in a private venv).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from hashlib import sha256
from pathlib import Path

import numpy as np

import gguf
from gguf.constants import GGMLQuantizationType as QT
from safetensors import safe_open

ARCH = gguf.MODEL_ARCH.BERT

# llama.cpp's get_vocab_base_pre(): the ids of this text, tokenized with the model's own
# tokenizer (special tokens added), hashed, name the pre-tokenizer.
CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001f680 (normal) \U0001f636\u200d\U0001f32b\ufe0f "
    "(multiple emojis concatenated) \u2705 \U0001f999\U0001f999 3 33 333 3333 33333 333333 3333333 "
    "33333333 3.3 3..3 3...3 \u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785"
    "\U0001f601 ?\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e ------======= "
    "\u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438 "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure "
    "I'll make it, 'D you like some tea? We'Ve a'lL"
)
# Only the WordPiece entries of llama.cpp's table. In llama.cpp both "bert-bge"
# (BAAI/bge-small-en-v1.5) and, further down, "jina-v2-en" test 0876d13b...; the checks
# are plain `if`s, so the later one wins and the converter writes "jina-v2-en".
PRE_TOKENIZERS = {
    "0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f": "jina-v2-en",
    "8e62295832751ca1e8f92f2226f403dea30dc5165e448b5bfa05af5340c64ec7": "bert-bge-large",
}

# HF names dropped by BertModel.filter_tensors / prepare_tensors.
SKIPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
SKIPPED_PREFIXES = ("cls.predictions", "cls.seq_relationship")
SKIPPED_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")

NORMAL, CONTROL, USER_DEFINED, UNUSED = (
    gguf.TokenType.NORMAL, gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED, gguf.TokenType.UNUSED)


def fail(msg: str) -> None:
    raise SystemExit(f"convert_minilm_gguf: {msg}")


def load_json(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------------------- tensors

def tensor_name(key: gguf.MODEL_TENSOR, suffix: str = ".weight") -> str:
    return gguf.TENSOR_NAMES[key] + suffix


def qtype_for(name: str, n_dims: int) -> QT:
    """prepare_tensors()'s choice for --outtype f16."""
    if n_dims <= 1 or name.endswith("_norm.weight"):
        return QT.F32
    always_f32 = {tensor_name(gguf.MODEL_TENSOR.POS_EMBD), tensor_name(gguf.MODEL_TENSOR.TOKEN_TYPES)}
    if name in always_f32 or not name.endswith(".weight"):
        return QT.F32
    return QT.F16


def hf_tensor_names(model_dir: Path) -> list[str]:
    with safe_open(model_dir / "model.safetensors", framework="np") as f:
        return sorted(f.keys())


def keep_tensor(name: str) -> str | None:
    if name.startswith("bert."):
        name = name[5:]
    if name.endswith(".gamma"):
        name = name[:-6] + ".weight"
    if name.endswith(".beta"):
        name = name[:-5] + ".bias"
    if name in SKIPPED or name.startswith(SKIPPED_PREFIXES) or name.endswith(SKIPPED_SUFFIXES):
        return None
    return name


def converted_tensors(model_dir: Path, n_layer: int):
    """Yield (gguf_name, array in its final dtype, qtype) in llama.cpp's order."""
    tmap = gguf.get_tensor_name_map(ARCH, n_layer)
    with safe_open(model_dir / "model.safetensors", framework="np") as f:
        for hf_name in sorted(f.keys()):
            name = keep_tensor(hf_name)
            if name is None:
                continue
            new_name = tmap.get_name(key=name, try_suffixes=(".weight", ".bias"))
            if new_name is None:
                fail(f"can not map tensor {hf_name!r}")
            data = f.get_tensor(hf_name)
            if data.dtype not in (np.float16, np.float32):
                data = data.astype(np.float32)
            qtype = qtype_for(new_name, data.ndim)
            dtype = np.float32 if qtype == QT.F32 else np.float16
            yield new_name, np.ascontiguousarray(data.astype(dtype, copy=False)), qtype


# ---------------------------------------------------------------------------- vocab

def open_tokenizer(model_dir: Path):
    """The HF fast tokenizer as transformers uses it: no truncation, no padding."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def pre_tokenizer_name(model_dir: Path) -> str:
    ids = open_tokenizer(model_dir).encode(CHKTXT).ids
    chkhsh = sha256(str(ids).encode()).hexdigest()
    if chkhsh not in PRE_TOKENIZERS:
        fail(f"pre-tokenizer not recognized (chkhsh {chkhsh})")
    return PRE_TOKENIZERS[chkhsh]


def does_token_look_special(tok: str) -> bool:
    return (tok in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (tok.startswith("<|") and tok.endswith("|>"))
            or (tok.startswith("<\uff5c") and tok.endswith("\uff5c>"))
            or (tok.startswith("<unused") and tok.endswith(">")))


def bert_vocab(model_dir: Path, vocab_size: int) -> tuple[list[str], list[int]]:
    """get_vocab_base() + BertModel.set_vocab()'s phantom-space rewrite."""
    with open(model_dir / "vocab.txt", encoding="utf-8") as f:
        words = f.read().split("\n")
    if words and words[-1] == "":
        words.pop()
    tokj = load_json(model_dir / "tokenizer.json")
    vocab = dict(tokj["model"]["vocab"])
    if vocab != {w: i for i, w in enumerate(words)}:
        fail("vocab.txt and tokenizer.json disagree")
    added = {t["id"]: t for t in tokj.get("added_tokens", [])}
    for i, t in added.items():
        vocab[t["content"]] = i
    if max(vocab.values()) >= vocab_size:
        fail("token id beyond vocab_size")
    reverse = {i: w for w, i in vocab.items()}

    tokens: list[str] = []
    toktypes: list[int] = []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            toktypes.append(UNUSED)
            continue
        tok = reverse[i]
        if i in added:
            if added[i]["special"] or does_token_look_special(tok):
                toktypes.append(CONTROL)
            else:
                tok = tok.replace("\u2581", " ")
                toktypes.append(USER_DEFINED)
        else:
            toktypes.append(NORMAL)
        tokens.append(tok)

    def phantom(tok: str, toktype: int) -> str:
        if toktype == CONTROL:
            return tok
        if tok.startswith("##"):
            return tok[2:]
        return "\u2581" + tok

    return [phantom(t, k) for t, k in zip(tokens, toktypes)], toktypes


def normalizer_lowercase(model_dir: Path) -> bool | None:
    """Newer gguf-py SpecialVocab (llama.cpp master) writes BertNormalizer's lowercase flag;
    gguf 0.19.0 on PyPI predates it, so it is added here. strip_accents is null for this
    model, which llama.cpp also leaves unwritten (it then follows lowercase)."""
    norm = load_json(model_dir / "tokenizer.json").get("normalizer") or {}
    found: list[bool] = []

    def walk(n: dict) -> None:
        if n.get("type") == "Lowercase":
            found.append(True)
        elif n.get("type") == "BertNormalizer" and "lowercase" in n:
            found.append(bool(n["lowercase"]))
        elif n.get("type") == "Sequence":
            for sub in n.get("normalizers", []):
                walk(sub)

    walk(norm)
    return found[-1] if found else None


def pooling_type(model_dir: Path) -> gguf.PoolingType | None:
    modules = model_dir / "modules.json"
    if not modules.is_file():
        return None
    path = next((m["path"] for m in load_json(modules) if m["type"].endswith("Pooling")), None)
    if path is None:
        return None
    cfg = load_json(model_dir / path / "config.json")
    if cfg.get("pooling_mode_mean_tokens"):
        return gguf.PoolingType.MEAN
    if cfg.get("pooling_mode_cls_token"):
        return gguf.PoolingType.CLS
    if cfg.get("pooling_mode_lasttoken"):
        return gguf.PoolingType.LAST
    modes = {"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS, "lasttoken": gguf.PoolingType.LAST}
    if cfg.get("pooling_mode") in modes:
        return modes[cfg["pooling_mode"]]
    fail("only MEAN, CLS and LAST pooling are supported")


# ---------------------------------------------------------------------------- convert

def convert(model_dir: Path, out: Path) -> None:
    hp = load_json(model_dir / "config.json")
    if hp.get("architectures", [None])[0] != "BertModel":
        fail(f"not a BertModel: {hp.get('architectures')}")
    n_layer = hp["num_hidden_layers"]
    ftype = gguf.LlamaFileType.MOSTLY_F16

    w = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[ARCH])

    # prepare_tensors()
    for name, data, qtype in converted_tensors(model_dir, n_layer):
        w.add_tensor(name, data, raw_dtype=qtype)

    # ModelBase.prepare_metadata()
    total, shared, expert, expert_count = w.get_total_parameter_count()
    meta = gguf.Metadata.load(None, model_dir, None, total)
    if meta.name is None:
        meta.name = model_dir.name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, expert_count)
    w.add_type(gguf.GGUFType.MODEL)
    meta.set_gguf_meta_model(w)

    # TextModel.set_gguf_parameters() for the keys a BERT config has
    w.add_block_count(n_layer)
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    if "num_key_value_heads" in hp:
        w.add_head_count_kv(hp["num_key_value_heads"])
    w.add_layer_norm_eps(hp["layer_norm_eps"])
    w.add_file_type(ftype)
    # BertModel.set_gguf_parameters()
    w.add_causal_attention(False)
    if (pt := pooling_type(model_dir)) is not None:
        w.add_pooling_type(pt)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    # BertModel.set_vocab()
    tokens, toktypes = bert_vocab(model_dir, hp["vocab_size"])
    w.add_token_type_count(hp.get("type_vocab_size", 1))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre(pre_tokenizer_name(model_dir))
    w.add_token_list(tokens)
    w.add_token_types(toktypes)
    special = gguf.SpecialVocab(model_dir, n_vocab=len(tokens))
    # gguf-py has no writer for "cls" (llama.cpp's converter logs "No handler for special
    # token type cls" and skips it; llama.cpp uses bos = [CLS]). It is written below under
    # the key llama.cpp's arch table names, as an extra that llama.cpp ignores.
    cls_id = special.special_token_ids.pop("cls", None)
    special.add_to_gguf(w, quiet=True)
    if (lower := normalizer_lowercase(model_dir)) is not None:
        w.add_bool("tokenizer.ggml.normalizer.lowercase", lower)
    if cls_id is not None:
        w.add_uint32("tokenizer.ggml.cls_token_id", cls_id)

    w.write_header_to_file(path=out)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---------------------------------------------------------------------------- verify

# Written out by hand (not via gguf's tensor map) so the check is independent of it.
HF_TO_GGUF = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.position_embeddings.weight": "position_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}
HF_LAYER_TO_GGUF = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
SENTENCES = ("The quick brown fox jumps over the lazy dog.",
             "A fast auburn fox leaps above a sleepy hound.")


def reference_weights(model_dir: Path, n_layer: int) -> dict[str, np.ndarray]:
    names = dict(HF_TO_GGUF)
    for i in range(n_layer):
        for hf, gg in HF_LAYER_TO_GGUF.items():
            for s in ("weight", "bias"):
                names[f"encoder.layer.{i}.{hf}.{s}"] = f"blk.{i}.{gg}.{s}"
    with safe_open(model_dir / "model.safetensors", framework="np") as f:
        return {gg: f.get_tensor(hf).astype(np.float32) for hf, gg in names.items()}


_erf = np.frompyfunc(math.erf, 1, 1)


def bert_embed(W: dict[str, np.ndarray], ids: list[int], n_layer: int, n_head: int, eps: float) -> np.ndarray:
    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * W[p + ".weight"] + W[p + ".bias"]

    def lin(x, p):
        return x @ W[p + ".weight"].T + W[p + ".bias"]

    T = len(ids)
    x = W["token_embd.weight"][ids] + W["position_embd.weight"][:T] + W["token_types.weight"][0]
    x = ln(x, "token_embd_norm")
    d = x.shape[1] // n_head
    for i in range(n_layer):
        b = f"blk.{i}."
        q, k, v = (lin(x, b + n).reshape(T, n_head, d).transpose(1, 0, 2) for n in ("attn_q", "attn_k", "attn_v"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(T, -1)
        x = ln(x + lin(a, b + "attn_output"), b + "attn_output_norm")
        h = lin(x, b + "ffn_up")
        h = 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)).astype(np.float64))
        x = ln(x + lin(h, b + "ffn_down"), b + "layer_output_norm")
    e = x.mean(0)
    return e / np.linalg.norm(e)


def field_value(reader: gguf.GGUFReader, key: str):
    field = reader.get_field(key)
    if field is None:
        fail(f"missing key {key}")
    return field.contents()


def verify(model_dir: Path, path: Path) -> None:
    hp = load_json(model_dir / "config.json")
    n_layer, n_head = hp["num_hidden_layers"], hp["num_attention_heads"]
    r = gguf.GGUFReader(path)

    expected = {name: (data.shape, qt) for name, data, qt in converted_tensors(model_dir, n_layer)}
    got = {t.name: (tuple(int(n) for n in reversed(t.shape.tolist())), t.tensor_type) for t in r.tensors}
    if set(got) != set(expected):
        fail(f"tensor names differ: missing {sorted(set(expected) - set(got))}, extra {sorted(set(got) - set(expected))}")
    for name, (shape, qt) in expected.items():
        if got[name] != (tuple(shape), qt):
            fail(f"{name}: got {got[name]}, expected {(tuple(shape), qt)}")
    n_f16 = sum(1 for _, qt in got.values() if qt == QT.F16)

    a = "bert"
    checks = {
        "general.architecture": a,
        f"{a}.block_count": n_layer,
        f"{a}.context_length": hp["max_position_embeddings"],
        f"{a}.embedding_length": hp["hidden_size"],
        f"{a}.feed_forward_length": hp["intermediate_size"],
        f"{a}.attention.head_count": n_head,
        f"{a}.attention.causal": False,
        f"{a}.pooling_type": int(gguf.PoolingType.MEAN),
        "general.file_type": int(gguf.LlamaFileType.MOSTLY_F16),
        "tokenizer.ggml.model": "bert",
        "tokenizer.ggml.token_type_count": hp["type_vocab_size"],
        "tokenizer.ggml.cls_token_id": 101,
        "tokenizer.ggml.seperator_token_id": 102,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.unknown_token_id": 100,
        "tokenizer.ggml.mask_token_id": 103,
    }
    for key, want in checks.items():
        if (have := field_value(r, key)) != want:
            fail(f"{key} = {have!r}, expected {want!r}")
    eps = float(field_value(r, f"{a}.attention.layer_norm_epsilon"))
    if not math.isclose(eps, hp["layer_norm_eps"], rel_tol=1e-6):
        fail(f"layer_norm_epsilon {eps}")
    tokens = field_value(r, "tokenizer.ggml.tokens")
    if len(tokens) != hp["vocab_size"] or tokens[101] != "[CLS]" or tokens[7592] != "\u2581hello":
        fail("unexpected token list")

    gg = {t.name: np.asarray(t.data).astype(np.float32) for t in r.tensors}
    ref = reference_weights(model_dir, n_layer)
    tok = open_tokenizer(model_dir)
    embs = []
    for text in SENTENCES:
        ids = tok.encode(text).ids
        e_gguf = bert_embed(gg, ids, n_layer, n_head, eps)
        e_ref = bert_embed(ref, ids, n_layer, n_head, hp["layer_norm_eps"])
        cos = float(e_gguf @ e_ref)
        print(f"verify: {len(ids):2d} tokens  cos(gguf f16, safetensors f32) = {cos:.7f}  {text!r}")
        if cos <= 0.999:
            fail(f"cosine {cos} <= 0.999")
        embs.append(e_gguf)
    print(f"verify: {len(got)} tensors ({n_f16} f16), pooling mean, "
          f"tokenizer.ggml.pre={field_value(r, 'tokenizer.ggml.pre')!r}, "
          f"similarity(sentence 1, sentence 2) = {float(embs[0] @ embs[1]):.4f}: OK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path, help="sentence-transformers all-MiniLM-L6-v2 directory")
    ap.add_argument("out", type=Path, nargs="?", help="GGUF file to write")
    ap.add_argument("--verify", action="store_true", help="check the written file")
    ap.add_argument("--verify-only", type=Path, metavar="GGUF", help="only check an existing GGUF")
    args = ap.parse_args()
    if args.verify_only:
        verify(args.model_dir, args.verify_only)
        return
    if args.out is None:
        ap.error("OUT is required unless --verify-only is given")
    convert(args.model_dir, args.out)
    if args.verify:
        verify(args.model_dir, args.out)


if __name__ == "__main__":
    sys.exit(main())
