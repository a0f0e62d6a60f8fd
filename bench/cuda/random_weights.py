#!/usr/bin/env python3
"""A model folder with a real model's config.json and tokenizer but random weights (transformers'
own initialisation), in the checkpoint's dtype: for a GPU machine the real weights cannot be
copied to. Speed does not depend on the values; logits of random weights are flatter than a
trained model's, which makes GPU-vs-CPU comparisons on them stricter, not looser.

  random_weights.py SRC_DIR OUT_DIR
"""
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

src, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
for f in src.iterdir():
    if f.suffix in (".json", ".jinja", ".txt") and not f.name.startswith("model.safetensors"):
        shutil.copy(f, out / f.name)
config = AutoConfig.from_pretrained(src)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
# save_pretrained rewrites config.json; keep the original (its keys are what the engine reads).
shutil.copy(src / "config.json", out / "config.json")
print(out, sum(p.numel() for p in model.parameters()), "parameters")
