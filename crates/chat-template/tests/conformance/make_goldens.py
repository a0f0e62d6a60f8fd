#!/usr/bin/env python3
"""Regenerates the chat-template conformance fixtures from the reference renderer.

The reference is Python `transformers` (`render_jinja_template`, which renders with jinja2 exactly as
`apply_chat_template` does). The templates are the real ones that llama.cpp keeps for its own tests,
taken from the `llama-cpp-python` sdist on PyPI, which vendors llama.cpp.

Usage (from anywhere):

    python3 crates/chat-template/tests/conformance/make_goldens.py [--sdist PATH.tar.gz]

It makes (or reuses) a private venv under ~/.cache/llmr/venv-templates, installs nothing globally,
and rewrites `templates/`, `goldens/` and `SOURCE.json` beside this script. `conversations.json`
(hand-written, also read by the Rust test) is its input.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = Path.home() / ".cache" / "llmr" / "venv-templates"
SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
REQUIREMENTS = ["transformers==5.23.0", "jinja2==3.1.6"]
TEMPLATE_DIR_IN_SDIST = "vendor/llama.cpp/models/templates"

# Kept in step with tests/it/conformance.rs: the Rust side renders with the same inputs.
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
# strftime_now must not depend on the day the goldens were made.
FIXED_NOW = (2026, 1, 5, 14, 30, 0)


def venv_python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv() -> None:
    """Re-executes this script inside the private venv, creating it on first use."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    if not venv_python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(venv_python()), "-m", "pip", "install", "-q", *REQUIREMENTS], check=True)
    os.execv(str(venv_python()), [str(venv_python()), __file__, *sys.argv[1:]])


def fetch_sdist(workdir: Path) -> Path:
    subprocess.run(
        [
            str(venv_python()), "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            f"{SDIST_NAME}=={SDIST_VERSION}", "-d", str(workdir),
        ],
        check=True,
    )
    found = sorted(workdir.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        sys.exit("pip download produced no sdist")
    return found[0]


def extract_templates(sdist: Path) -> dict[str, str]:
    templates = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/", 1)
            if len(parts) != 2 or not member.isfile():
                continue
            inner = parts[1]
            if inner.startswith(TEMPLATE_DIR_IN_SDIST + "/") and inner.endswith(".jinja"):
                stem = Path(inner).stem
                # Read bytes and decode strictly: the goldens are byte-for-byte, no newline translation.
                templates[stem] = tar.extractfile(member).read().decode("utf-8")
    if not templates:
        sys.exit(f"no templates found under {TEMPLATE_DIR_IN_SDIST} in {sdist}")
    return templates


def freeze_clock() -> None:
    import datetime as dt

    import transformers.utils.chat_template_utils as ctu

    class FrozenDatetime(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(*FIXED_NOW)

    ctu.datetime = FrozenDatetime


def render(source: str, conversation: dict, tools: list) -> tuple[str, str]:
    """Returns ("ok", text) or ("raised"/"error", message)."""
    import jinja2.exceptions
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        rendered, _ = render_jinja_template(
            conversations=[conversation["messages"]],
            tools=tools if conversation.get("with_tools") else None,
            chat_template=source,
            add_generation_prompt=True,
            bos_token=BOS_TOKEN,
            eos_token=EOS_TOKEN,
        )
        return "ok", rendered[0]
    except Exception as e:  # noqa: BLE001 - any failure is a golden outcome to reproduce
        # raise_exception() raises exactly TemplateError; jinja's own errors are subclasses of it.
        kind = "raised" if type(e) is jinja2.exceptions.TemplateError else "error"
        return kind, f"{type(e).__name__}: {e}"


def main() -> None:
    ensure_venv()
    parser = argparse.ArgumentParser()
    parser.add_argument("--sdist", type=Path, help=f"a local {SDIST_NAME}-{SDIST_VERSION} sdist")
    args = parser.parse_args()

    import jinja2
    import transformers

    freeze_clock()

    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist or fetch_sdist(Path(tmp))
        templates = extract_templates(sdist)

    inputs = json.loads((HERE / "conversations.json").read_text(encoding="utf-8"))
    tools = inputs["tools"]

    for sub in ("templates", "goldens"):
        shutil.rmtree(HERE / sub, ignore_errors=True)
        (HERE / sub).mkdir()

    counts = {"ok": 0, "raised": 0, "error": 0}
    for stem, source in sorted(templates.items()):
        (HERE / "templates" / f"{stem}.jinja").write_bytes(source.encode("utf-8"))
        out_dir = HERE / "goldens" / stem
        out_dir.mkdir()
        for conv_name, conversation in inputs["conversations"].items():
            kind, text = render(source, conversation, tools)
            counts[kind] += 1
            suffix = {"ok": "txt", "raised": "raised", "error": "error"}[kind]
            (out_dir / f"{conv_name}.{suffix}").write_bytes(text.encode("utf-8"))

    source_info = {
        "sdist": f"{SDIST_NAME}=={SDIST_VERSION}",
        "templates_path_in_sdist": TEMPLATE_DIR_IN_SDIST,
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "renderer": "transformers.utils.chat_template_utils.render_jinja_template",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "add_generation_prompt": True,
        "fixed_now": "%04d-%02d-%02dT%02d:%02d:%02d" % FIXED_NOW,
    }
    (HERE / "SOURCE.json").write_text(json.dumps(source_info, indent=2) + "\n", encoding="utf-8")
    print(f"{len(templates)} templates, outcomes: {counts}")


if __name__ == "__main__":
    main()
