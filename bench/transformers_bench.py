#!/usr/bin/env python3
"""Hugging Face `transformers` (torch, CPU or `--device cuda`) on a safetensors model folder: prompt
processing and single-sequence greedy decode, in the dtype the checkpoint is stored in. Run by
bench/engine_bench.py with the reference venv's python (scripts/reference-venv); prints one JSON
object.

  transformers_bench.py MODEL_DIR --threads 2 --pp 512 --tg 128 --reps 3
"""
import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype="auto").to(a.device)
    model.eval()
    # GPU work is queued: wait for it before reading the clock.
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    pp, tg = [], []
    with torch.inference_mode():
        for rep in range(a.reps + 1):  # the first is a warm-up
            ids = torch.randint(10, min(vocab, 30000), (1, a.pp), generator=g).to(a.device)
            sync()
            t0 = time.perf_counter()
            out = model(ids, use_cache=True)
            sync()
            t1 = time.perf_counter()
            cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            t2 = time.perf_counter()
            for _ in range(a.tg):
                out = model(nxt, past_key_values=cache, use_cache=True)
                cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            sync()
            t3 = time.perf_counter()
            if rep:
                pp.append(a.pp / (t1 - t0))
                tg.append(a.tg / (t3 - t2))
    print(json.dumps({"pp": statistics.median(pp), "tg": statistics.median(tg), "dtype": str(model.dtype),
                      "torch": torch.__version__, "threads": a.threads, "device": a.device}))


if __name__ == "__main__":
    main()
