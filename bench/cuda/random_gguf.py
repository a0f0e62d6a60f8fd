#!/usr/bin/env python3
"""A GGUF with a real model's metadata (architecture, vocabulary, chat template) and random weights
of the same names, shapes and types, for llama.cpp's tools on the GPU machine, which takes 64 MiB
per call and reaches no network (the real F16 GGUFs are 270 and 540 MB). Two steps:

  random_gguf.py skeleton REAL.gguf SKELETON.gguf   here: the metadata and the tensor list only
  random_gguf.py fill SKELETON.gguf OUT.gguf        there: the same, with random tensor data

Speed does not depend on the values (the benchmarks generate a fixed number of tokens). Needs
numpy and llama.cpp's `gguf` package (its gguf-py folder on PYTHONPATH).
"""
import json
import sys

import gguf
import numpy as np

TENSORS_KEY = "llmr.random.tensors"


def copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> None:
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF.") \
                or field.name == TENSORS_KEY:
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)


def architecture(reader: gguf.GGUFReader) -> str:
    return reader.fields[gguf.Keys.General.ARCHITECTURE].contents()


def skeleton(real: str, out: str) -> None:
    reader = gguf.GGUFReader(real)
    writer = gguf.GGUFWriter(out, architecture(reader))
    copy_metadata(reader, writer)
    # GGUF's own dimension order (innermost first), as llama.cpp reads it.
    tensors = [[t.name, [int(d) for d in t.shape], int(t.tensor_type)] for t in reader.tensors]
    writer.add_string(TENSORS_KEY, json.dumps(tensors))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()


def random_data(rng: np.random.Generator, dims: list[int], kind: gguf.GGMLQuantizationType):
    shape = tuple(reversed(dims))
    values = (rng.standard_normal(shape, dtype=np.float32) * 0.02)
    if kind == gguf.GGMLQuantizationType.F32:
        return values
    if kind == gguf.GGMLQuantizationType.F16:
        return values.astype(np.float16)
    if kind == gguf.GGMLQuantizationType.BF16:
        return (values.view(np.uint32) >> 16).astype(np.uint16)
    raise SystemExit(f"random_gguf.py: tensor type {kind.name} is not a float type")


def fill(skel: str, out: str) -> None:
    reader = gguf.GGUFReader(skel)
    tensors = json.loads(reader.fields[TENSORS_KEY].contents())
    writer = gguf.GGUFWriter(out, architecture(reader))
    copy_metadata(reader, writer)
    rng = np.random.default_rng(0)
    for name, dims, kind in tensors:
        kind = gguf.GGMLQuantizationType(kind)
        data = random_data(rng, dims, kind)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("skeleton", "fill"):
        raise SystemExit(__doc__)
    {"skeleton": skeleton, "fill": fill}[sys.argv[1]](sys.argv[2], sys.argv[3])
