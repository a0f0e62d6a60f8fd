#!/usr/bin/env python3
"""Convert a CTranslate2 Whisper model (faster-whisper's `model.bin`) to whisper.cpp's ggml
model file (`ggml-*.bin`), without torch, transformers or ctranslate2.

The output is the legacy `ggml` file that whisper.cpp's `models/convert-pt-to-ggml.py`
writes from an openai-whisper checkpoint, and that `whisper_model_load` reads:

* magic 0x67676d6c, then int32 hparams: n_vocab, n_audio_ctx, n_audio_state, n_audio_head,
  n_audio_layer, n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype (1: f16);
* the mel filterbank: int32 n_mels, int32 n_fft/2+1, then f32 values (openai-whisper's
  `whisper/assets/mel_filters.npz`, key `mel_{n_mels}`);
* the vocabulary: int32 count, then per token int32 length + bytes: the ranks of
  openai-whisper's `gpt2.tiktoken` (English-only models, n_vocab < 51865) or
  `multilingual.tiktoken`, in file order; whisper.cpp adds the special tokens itself;
* the tensors, in openai-whisper's state-dict order and names: per tensor int32 n_dims,
  name length, type (0: f32, 1: f16), the dims innermost first, the name, the data.
  Matrices and conv kernels are f16; 1-D tensors, conv biases (reshaped to [n, 1]) and both
  positional embeddings are f32.

CTranslate2's `model.bin` (binary version 4 to 6, `ModelSpec._serialize`): uint32 version,
spec name and uint32 revision, uint32 variable count, then per variable its name, uint8 rank,
uint32 dims, uint8 dtype (float32, int8, int16, int32, float16, bfloat16), uint32 byte count
and the raw bytes; then uint32 alias count and (alias, target) name pairs (strings are a
uint16 length counting a trailing NUL, the bytes, the NUL). Int8 / int16 weights are
dequantized with their `weight_scale`. Variable mapping (`WhisperSpec`, from the
transformers converter):

  encoder/conv{1,2}/{weight,bias}                 encoder.conv{1,2}.{weight,bias}
  encoder/position_encodings/encodings            encoder.positional_embedding
  encoder/layer_N/self_attention/linear_0         q, k, v fused on rows: attn.{query,key,value}
  encoder/layer_N/self_attention/linear_1         attn.out
  encoder/layer_N/self_attention/layer_norm       attn_ln (gamma -> weight, beta -> bias)
  */layer_N/ffn/linear_0, linear_1, layer_norm    mlp.0, mlp.2, mlp_ln
  encoder/layer_norm                              encoder.ln_post
  decoder/embeddings/weight                       decoder.token_embedding.weight (also the
                                                  output projection, tied: an alias in CT2)
  decoder/position_encodings/encodings            decoder.positional_embedding
  decoder/layer_N/self_attention/...              attn.* / attn_ln (as in the encoder)
  decoder/layer_N/attention/linear_0              cross_attn.query
  decoder/layer_N/attention/linear_1              k, v fused on rows: cross_attn.{key,value}
  decoder/layer_N/attention/linear_2, layer_norm  cross_attn.out, cross_attn_ln
  decoder/layer_norm                              decoder.ln

Whisper's key projections have no bias; CTranslate2 fuses them with a zero bias, which is
dropped (a key bias could be dropped even when nonzero: it adds the same q.b to every score
of a query, which softmax ignores). Head counts come from `*/num_heads`, layer counts from
the variable names. The output is deterministic.

Usage:
  convert_whisper_ct2.py MODEL_DIR ASSETS_DIR OUT.bin [--verify]   convert (then check)
  convert_whisper_ct2.py MODEL_DIR ASSETS_DIR --verify-only OUT.bin

MODEL_DIR holds `model.bin` and `vocabulary.txt`; ASSETS_DIR holds openai-whisper's
`mel_filters.npz` and `gpt2.tiktoken` (or `multilingual.tiktoken`). The check reads the
file back: hparams, mel filters, vocabulary (which must also match the byte-level BPE tokens
of CTranslate2's `vocabulary.txt`), and every tensor's name, shape, type and values against
the CTranslate2 model, and the tensor set against whisper.cpp's loader. Needs numpy only.
"""

from __future__ import annotations

import argparse
import base64
import re
import struct
import sys
from pathlib import Path

import numpy as np

GGML_MAGIC = 0x67676D6C
F32, F16 = 0, 1
CT2_DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
ATTN = ("query", "key", "value", "out")


# ---------------------------------------------------------------------------- CTranslate2

class Ct2Model:
    """The variables of a CTranslate2 `model.bin`, aliases resolved."""

    def __init__(self, path: Path) -> None:
        self.data = path.read_bytes()
        self.pos = 0
        self.version = self._u("I")
        if not 4 <= self.version <= 6:
            raise SystemExit(f"{path}: CTranslate2 binary version {self.version} is not supported (4 to 6)")
        self.spec = self._str()
        self.revision = self._u("I")
        if self.spec != "WhisperSpec":
            raise SystemExit(f"{path}: spec {self.spec!r}, expected 'WhisperSpec'")
        self.vars: dict[str, np.ndarray] = {}
        for _ in range(self._u("I")):
            name = self._str()
            rank = self._u("B")
            shape = struct.unpack_from(f"<{rank}I", self.data, self.pos)
            self.pos += 4 * rank
            dtype = CT2_DTYPES[self._u("B")]
            nbytes = self._u("I")
            raw = self.data[self.pos:self.pos + nbytes]
            self.pos += nbytes
            if dtype == "bfloat16":
                arr = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                arr = np.frombuffer(raw, np.dtype(dtype).newbyteorder("<"))
            self.vars[name] = arr.reshape(shape)
        self.aliases: dict[str, str] = {}
        for _ in range(self._u("I")):
            alias = self._str()
            self.aliases[alias] = self._str()
        if self.pos != len(self.data):
            raise SystemExit(f"{path}: {len(self.data) - self.pos} trailing bytes")

    def _u(self, fmt: str) -> int:
        (v,) = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def _str(self) -> str:
        n = self._u("H")
        s = self.data[self.pos:self.pos + n - 1].decode("utf-8")
        self.pos += n
        return s

    def get(self, name: str) -> np.ndarray:
        name = self.aliases.get(name, name)
        return self.vars[name]

    def has(self, name: str) -> bool:
        return name in self.vars or name in self.aliases

    def float(self, name: str) -> np.ndarray:
        """A float variable as float32; int8 / int16 weights dequantized with their scale."""
        v = self.get(name)
        if v.dtype.kind == "f":
            return v.astype(np.float32)
        scale_name = name + "_scale"
        if not self.has(scale_name):
            raise SystemExit(f"{name}: {v.dtype} without a {scale_name}")
        scale = self.get(scale_name).astype(np.float32)
        if scale.ndim == 1:  # int8: one scale per output row
            scale = scale.reshape(-1, *([1] * (v.ndim - 1)))
        return v.astype(np.float32) / scale

    def weight(self, name: str) -> np.ndarray:
        """A matrix for a f16 slot: float16 values are passed through bit for bit."""
        v = self.get(name)
        return v if v.dtype == np.float16 else self.float(name).astype(np.float16)

    def n_layers(self, side: str) -> int:
        found = {int(m.group(1)) for n in self.vars if (m := re.match(rf"{side}/layer_(\d+)/", n))}
        if found != set(range(len(found))):
            raise SystemExit(f"{side} layers are not numbered 0..n-1: {sorted(found)}")
        return len(found)


# ---------------------------------------------------------------------------- mapping

def hparams(ct2: Ct2Model) -> dict[str, int]:
    enc_pe = ct2.get("encoder/position_encodings/encodings")
    dec_pe = ct2.get("decoder/position_encodings/encodings")
    return {
        "n_vocab": ct2.get("decoder/embeddings/weight").shape[0],
        "n_audio_ctx": enc_pe.shape[0],
        "n_audio_state": enc_pe.shape[1],
        "n_audio_head": int(ct2.get("encoder/num_heads")),
        "n_audio_layer": ct2.n_layers("encoder"),
        "n_text_ctx": dec_pe.shape[0],
        "n_text_state": dec_pe.shape[1],
        "n_text_head": int(ct2.get("decoder/num_heads")),
        "n_text_layer": ct2.n_layers("decoder"),
        "n_mels": ct2.get("encoder/conv1/weight").shape[1],
    }


def split_rows(ct2: Ct2Model, linear: str, parts: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    w = ct2.weight(f"{linear}/weight")
    b = ct2.float(f"{linear}/bias")
    if w.shape[0] % parts or b.shape != (w.shape[0],):
        raise SystemExit(f"{linear}: cannot split {w.shape} / {b.shape} in {parts}")
    return np.split(w, parts), np.split(b, parts)


def attention(ct2: Ct2Model, prefix: str, scope: str, fused: str) -> list[tuple[str, np.ndarray]]:
    """query/key/value/out of one attention, from CT2's fused linears. fused: "qkv" for
    self-attention (linear_0 = q|k|v, linear_1 = out), "q_kv" for cross-attention
    (linear_0 = q, linear_1 = k|v, linear_2 = out)."""
    if fused == "qkv":
        ws, bs = split_rows(ct2, f"{scope}/linear_0", 3)
        out = f"{scope}/linear_1"
    else:
        ws, bs = split_rows(ct2, f"{scope}/linear_0", 1)
        kv_w, kv_b = split_rows(ct2, f"{scope}/linear_1", 2)
        ws, bs = ws + kv_w, bs + kv_b
        out = f"{scope}/linear_2"
    if np.any(bs[1]):
        print(f"note: {scope}: nonzero key bias dropped (max |b| {np.abs(bs[1]).max():g}); "
              "softmax is invariant to it", file=sys.stderr)
    return [
        (f"{prefix}.query.weight", ws[0]), (f"{prefix}.query.bias", bs[0]),
        (f"{prefix}.key.weight", ws[1]),
        (f"{prefix}.value.weight", ws[2]), (f"{prefix}.value.bias", bs[2]),
        (f"{prefix}.out.weight", ct2.weight(f"{out}/weight")),
        (f"{prefix}.out.bias", ct2.float(f"{out}/bias")),
    ]


def norm(ct2: Ct2Model, prefix: str, scope: str) -> list[tuple[str, np.ndarray]]:
    return [(f"{prefix}.weight", ct2.float(f"{scope}/gamma")), (f"{prefix}.bias", ct2.float(f"{scope}/beta"))]


def mlp(ct2: Ct2Model, prefix: str, scope: str) -> list[tuple[str, np.ndarray]]:
    return [
        (f"{prefix}.mlp.0.weight", ct2.weight(f"{scope}/linear_0/weight")),
        (f"{prefix}.mlp.0.bias", ct2.float(f"{scope}/linear_0/bias")),
        (f"{prefix}.mlp.2.weight", ct2.weight(f"{scope}/linear_1/weight")),
        (f"{prefix}.mlp.2.bias", ct2.float(f"{scope}/linear_1/bias")),
        *norm(ct2, f"{prefix}.mlp_ln", f"{scope}/layer_norm"),
    ]


def tensors(ct2: Ct2Model, hp: dict[str, int]) -> list[tuple[str, np.ndarray]]:
    """openai-whisper's state dict (names and order), with whisper.cpp's storage types:
    f16 matrices, f32 vectors, conv biases [n, 1] f32, positional embeddings f32."""
    if ct2.has("decoder/projection/weight") and not np.array_equal(
            ct2.get("decoder/projection/weight"), ct2.get("decoder/embeddings/weight")):
        raise SystemExit("decoder/projection/weight differs from decoder/embeddings/weight: "
                         "whisper.cpp ties the output projection to the token embedding")
    if ct2.has("decoder/projection/bias") and np.any(ct2.float("decoder/projection/bias")):
        raise SystemExit("decoder/projection/bias is nonzero: whisper.cpp has no output bias")
    out: list[tuple[str, np.ndarray]] = [
        ("encoder.positional_embedding", ct2.float("encoder/position_encodings/encodings")),
    ]
    for i in (1, 2):
        out += [(f"encoder.conv{i}.weight", ct2.weight(f"encoder/conv{i}/weight")),
                (f"encoder.conv{i}.bias", ct2.float(f"encoder/conv{i}/bias").reshape(-1, 1))]
    for i in range(hp["n_audio_layer"]):
        p, s = f"encoder.blocks.{i}", f"encoder/layer_{i}"
        out += attention(ct2, f"{p}.attn", f"{s}/self_attention", "qkv")
        out += norm(ct2, f"{p}.attn_ln", f"{s}/self_attention/layer_norm")
        out += mlp(ct2, p, f"{s}/ffn")
    out += norm(ct2, "encoder.ln_post", "encoder/layer_norm")
    out += [("decoder.positional_embedding", ct2.float("decoder/position_encodings/encodings")),
            ("decoder.token_embedding.weight", ct2.weight("decoder/embeddings/weight"))]
    for i in range(hp["n_text_layer"]):
        p, s = f"decoder.blocks.{i}", f"decoder/layer_{i}"
        out += attention(ct2, f"{p}.attn", f"{s}/self_attention", "qkv")
        out += norm(ct2, f"{p}.attn_ln", f"{s}/self_attention/layer_norm")
        out += attention(ct2, f"{p}.cross_attn", f"{s}/attention", "q_kv")
        out += norm(ct2, f"{p}.cross_attn_ln", f"{s}/attention/layer_norm")
        out += mlp(ct2, p, f"{s}/ffn")
    out += norm(ct2, "decoder.ln", "decoder/layer_norm")
    return out


def expected_layout(hp: dict[str, int]) -> dict[str, tuple[tuple[int, ...], int]]:
    """Every tensor whisper.cpp's whisper_model_load creates: numpy shape and type."""
    a, t, m = hp["n_audio_state"], hp["n_text_state"], hp["n_mels"]
    exp = {
        "encoder.positional_embedding": ((hp["n_audio_ctx"], a), F32),
        "encoder.conv1.weight": ((a, m, 3), F16), "encoder.conv1.bias": ((a, 1), F32),
        "encoder.conv2.weight": ((a, a, 3), F16), "encoder.conv2.bias": ((a, 1), F32),
        "encoder.ln_post.weight": ((a,), F32), "encoder.ln_post.bias": ((a,), F32),
        "decoder.positional_embedding": ((hp["n_text_ctx"], t), F32),
        "decoder.token_embedding.weight": ((hp["n_vocab"], t), F16),
        "decoder.ln.weight": ((t,), F32), "decoder.ln.bias": ((t,), F32),
    }

    def block(p: str, n: int, attns: tuple[str, ...]) -> None:
        for ln in ("mlp_ln", *(f"{x}_ln" for x in attns)):
            exp[f"{p}.{ln}.weight"] = exp[f"{p}.{ln}.bias"] = ((n,), F32)
        exp[f"{p}.mlp.0.weight"], exp[f"{p}.mlp.0.bias"] = ((4 * n, n), F16), ((4 * n,), F32)
        exp[f"{p}.mlp.2.weight"], exp[f"{p}.mlp.2.bias"] = ((n, 4 * n), F16), ((n,), F32)
        for x in attns:
            for proj in ATTN:
                exp[f"{p}.{x}.{proj}.weight"] = ((n, n), F16)
                if proj != "key":
                    exp[f"{p}.{x}.{proj}.bias"] = ((n,), F32)

    for i in range(hp["n_audio_layer"]):
        block(f"encoder.blocks.{i}", a, ("attn",))
    for i in range(hp["n_text_layer"]):
        block(f"decoder.blocks.{i}", t, ("attn", "cross_attn"))
    return exp


# ---------------------------------------------------------------------------- assets

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (as in whisper.cpp's converters)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def load_assets(model_dir: Path, assets_dir: Path, hp: dict[str, int]) -> tuple[np.ndarray, list[bytes]]:
    with np.load(assets_dir / "mel_filters.npz", allow_pickle=False) as f:
        filters = f[f"mel_{hp['n_mels']}"].astype(np.float32)
    multilingual = hp["n_vocab"] >= 51865
    tiktoken = assets_dir / ("multilingual.tiktoken" if multilingual else "gpt2.tiktoken")
    ranks: list[tuple[int, bytes]] = []
    for line in tiktoken.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks.append((int(rank), base64.b64decode(token)))
    if [r for r, _ in ranks] != list(range(len(ranks))):
        raise SystemExit(f"{tiktoken}: ranks are not 0..n-1 in order")
    tokens = [t for _, t in ranks]
    # the same tokens must open CTranslate2's vocabulary (byte-level BPE strings)
    decoder = {c: b for b, c in bytes_to_unicode().items()}
    ct2_vocab = (model_dir / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
    if len(ct2_vocab) < len(tokens):
        raise SystemExit(f"vocabulary.txt has {len(ct2_vocab)} tokens, fewer than {tiktoken.name}'s {len(tokens)}")
    for i, tok in enumerate(tokens):
        if bytes(decoder[c] for c in ct2_vocab[i]) != tok:
            raise SystemExit(f"token {i}: vocabulary.txt {ct2_vocab[i]!r} != {tiktoken.name} {tok!r}")
    return filters, tokens


# ---------------------------------------------------------------------------- ggml file

HPARAM_ORDER = ("n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer",
                "n_text_ctx", "n_text_state", "n_text_head", "n_text_layer", "n_mels")


def convert(model_dir: Path, assets_dir: Path, out: Path) -> None:
    ct2 = Ct2Model(model_dir / "model.bin")
    hp = hparams(ct2)
    print(f"CTranslate2 {ct2.spec} rev {ct2.revision} (binary v{ct2.version}): {hp}", file=sys.stderr)
    filters, tokens = load_assets(model_dir, assets_dir, hp)
    tens = tensors(ct2, hp)
    with open(out, "wb") as f:
        f.write(struct.pack("<i", GGML_MAGIC))
        f.write(struct.pack("<11i", *(hp[k] for k in HPARAM_ORDER), F16))
        f.write(struct.pack("<2i", *filters.shape))
        f.write(filters.astype("<f4").tobytes())
        f.write(struct.pack("<i", len(tokens)))
        for tok in tokens:
            f.write(struct.pack("<i", len(tok)) + tok)
        for name, data in tens:
            ftype = F16 if data.dtype == np.float16 else F32
            data = data.astype("<f2" if ftype == F16 else "<f4")
            raw = name.encode("utf-8")
            f.write(struct.pack("<3i", data.ndim, len(raw), ftype))
            f.write(struct.pack(f"<{data.ndim}i", *reversed(data.shape)))
            f.write(raw)
            f.write(np.ascontiguousarray(data).tobytes())
    print(f"wrote {out}: {len(tens)} tensors, {len(tokens)} tokens, {out.stat().st_size:,} B", file=sys.stderr)


def read_ggml(path: Path) -> tuple[list[int], np.ndarray, list[bytes], list[tuple[str, int, np.ndarray]]]:
    data = path.read_bytes()
    pos = 0

    def ints(n: int) -> tuple[int, ...]:
        nonlocal pos
        v = struct.unpack_from(f"<{n}i", data, pos)
        pos += 4 * n
        return v

    if ints(1)[0] != GGML_MAGIC:
        raise SystemExit(f"{path}: bad magic")
    hp = list(ints(11))
    rows, cols = ints(2)
    filters = np.frombuffer(data, "<f4", rows * cols, pos).reshape(rows, cols)
    pos += 4 * rows * cols
    tokens = []
    for _ in range(ints(1)[0]):
        (n,) = ints(1)
        tokens.append(data[pos:pos + n])
        pos += n
    tens = []
    while pos < len(data):
        n_dims, length, ftype = ints(3)
        shape = tuple(reversed(ints(n_dims)))
        name = data[pos:pos + length].decode("utf-8")
        pos += length
        dt = np.dtype("<f2" if ftype == F16 else "<f4")
        count = int(np.prod(shape))
        tens.append((name, ftype, np.frombuffer(data, dt, count, pos).reshape(shape)))
        pos += count * dt.itemsize
    if pos != len(data):
        raise SystemExit(f"{path}: truncated")
    return hp, filters, tokens, tens


def verify(model_dir: Path, assets_dir: Path, path: Path) -> None:
    ct2 = Ct2Model(model_dir / "model.bin")
    hp = hparams(ct2)
    filters, tokens = load_assets(model_dir, assets_dir, hp)
    got_hp, got_filters, got_tokens, got = read_ggml(path)
    problems = []
    if got_hp != [hp[k] for k in HPARAM_ORDER] + [F16]:
        problems.append(f"hparams {got_hp}")
    if not np.array_equal(got_filters, filters):
        problems.append("mel filters differ")
    if got_tokens != tokens:
        problems.append("vocabulary differs")
    want = dict(tensors(ct2, hp))
    layout = expected_layout(hp)
    names = [n for n, _, _ in got]
    if len(set(names)) != len(names):
        problems.append("duplicate tensor names")
    if set(names) != set(layout):
        problems.append(f"tensor set differs from whisper.cpp's: missing {sorted(set(layout) - set(names))}, "
                        f"unknown {sorted(set(names) - set(layout))}")
    for name, ftype, arr in got:
        shape, ttype = layout.get(name, ((), -1))
        if arr.shape != shape or ftype != ttype:
            problems.append(f"{name}: shape {arr.shape} type {ftype}, whisper.cpp wants {shape} type {ttype}")
        elif name not in want or not np.array_equal(arr, want[name]):
            problems.append(f"{name}: values differ from the CTranslate2 model")
    if problems:
        raise SystemExit(f"{path}: verification FAILED:\n  " + "\n  ".join(problems[:20]))
    print(f"verified {path}: hparams, {len(got_filters)} mel filters, {len(got_tokens)} tokens, "
          f"{len(got)} tensors match the CTranslate2 model and whisper.cpp's layout", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path, help="CTranslate2 Whisper folder (model.bin, vocabulary.txt)")
    ap.add_argument("assets_dir", type=Path, help="openai-whisper's whisper/assets (mel_filters.npz, *.tiktoken)")
    ap.add_argument("out", type=Path, nargs="?", help="ggml model file to write")
    ap.add_argument("--verify", action="store_true", help="check the written file")
    ap.add_argument("--verify-only", type=Path, metavar="BIN", help="only check an existing ggml file")
    args = ap.parse_args()
    if args.verify_only:
        verify(args.model_dir, args.assets_dir, args.verify_only)
        return
    if args.out is None:
        ap.error("OUT is required unless --verify-only is given")
    convert(args.model_dir, args.assets_dir, args.out)
    if args.verify:
        verify(args.model_dir, args.assets_dir, args.out)


if __name__ == "__main__":
    sys.exit(main())
