#!/usr/bin/env python3
"""Writes phoneme_ids.json: what the PyPI piper-tts package feeds the joe voice for fixed texts.

The golden for tests/real_voice.rs (`phoneme_ids_match_piper`). piper-tts bundles its own
espeak-ng (a newer build than Debian's 1.51), so the texts are ones both pronounce alike.

    python3 -m venv /tmp/piper && /tmp/piper/bin/pip install piper-tts==1.8.0
    /tmp/piper/bin/python make_phoneme_ids.py ~/.cache/llmr/models/piper-joe/en_US-joe-medium.onnx
"""
import json
import sys
from pathlib import Path

from piper import PiperVoice

TEXTS = [
    "The quick brown fox jumps over the lazy dog. How are you today? I am fine, thank you!",
    "Hello world. This is a test, of the clause splitting: really? Yes!",
    "Wait... what is this; a test? Mr. Smith paid $3.50 for apples.",
]


def main() -> None:
    voice = PiperVoice.load(sys.argv[1])
    golden = []
    for text in TEXTS:
        sentences = voice.phonemize(text)
        golden.append(
            {
                "text": text,
                "sentences": [
                    {"phonemes": "".join(p), "ids": voice.phonemes_to_ids(p)} for p in sentences if p
                ],
            }
        )
    out = Path(__file__).with_name("phoneme_ids.json")
    out.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
