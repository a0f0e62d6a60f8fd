#!/usr/bin/env bash
# Runs a curated subset of llama.cpp's own server test suite (tools/server/tests, from the
# llama.cpp tree vendored in the pinned llama-cpp-python sdist) against `llmr serve`.
#
#   tests/llama-server/run.sh [PYTEST ARGS...]      e.g. tests/llama-server/run.sh -v
#
# The suite's utils.py targets an already-running server when DEBUG_EXTERNAL=1 and PORT are set;
# this script starts llmr for each group of tests below, runs the group's tests by explicit node id
# (so the selection is reproducible) and stops the server. README.md beside this file says which
# tests run, which are excluded and why.
#
# Three adaptations, in a pytest plugin this script writes (llmr_shim.py, see below), applied to
# the suite's own request helpers (ServerProcess.make_request / make_stream_request) only:
#   * a request body without `model` (or with `"model": null`) gets the group's served model:
#     llama-server serves one model and ignores the field; llmr, like OpenAI, requires it;
#   * `/chat/completions` and `/models` go to `/v1/chat/completions` and `/v1/models`: llama-server
#     also serves the OpenAI routes without the /v1 prefix; llmr only under /v1;
#   * a generation request without `seed` / `temperature` gets the server's (`ServerProcess.seed`,
#     42, and `.temperature`, 0.8): the suite starts llama-server with `--seed` and `--temp`, so its
#     sampled answers repeat; llmr takes sampling settings per request only. (Unseeded, a schema
#     test whose regex needs a digit saw `null` once in a CI run.)
# Requests the tests make with the OpenAI SDK are not touched.
#
# Everything downloaded lives outside the repository:
#   ${LLMR_REFERENCE_CACHE:-$HOME/.cache/llmr/reference}   the sdist (shared with bench/reference/build.sh)
#     llama-server-tests-<version>/tests                     the extracted test suite
#   ${LLMR_LLAMA_TESTS_VENV:-$HOME/.cache/llmr/venv-llama-server-tests}   its Python venv
# Environment: LLMR_BIN, LLMR_MODEL_CACHE, LLMR_ENGINES_DIR as in tests/e2e/conftest.py.
set -euo pipefail

# --- pins ------------------------------------------------------------------------------------------
LCP_VERSION=0.3.36
LCP_SDIST=llama_cpp_python-${LCP_VERSION}.tar.gz
LCP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# The suite's requirements.txt asks for pytest~=8.3.3, openai~=2.14.0, requests~=2.32.3,
# wget~=3.2, filelock~=3.16 (+ aiohttp, numpy, prometheus-client, pytest-xdist that the selected
# tests do not import). Exact pins, transitive ones included:
REQUIREMENTS="pytest==8.3.5
openai==2.14.0
requests==2.32.5
wget==3.2
filelock==3.16.1
annotated-types==0.8.0
anyio==4.16.0
certifi==2026.10.18
charset-normalizer==3.5.2
distro==1.9.0
h11==0.16.0
httpcore==1.0.9
httpx==0.28.1
idna==3.20
iniconfig==2.3.1
jiter==0.19.0
packaging==26.3
pluggy==1.7.0
pydantic==2.14.3
pydantic_core==2.50.4
sniffio==1.3.1
tqdm==4.70.1
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0"

# --- the selection -----------------------------------------------------------------------------------
# Each group: one llmr server (model aliases and options) and the node ids run against it.
# LLMR_SMOLLM2=smollm2-hf runs the suite on the same model in Hugging Face layout (native engine).
SMOLLM2=${LLMR_SMOLLM2:-smollm2-135m-instruct-q4_1.gguf}
MINILM=all-minilm-l6-v2-f16.gguf

# "tinyllama-2" is the alias of the suite's default preset; 256 tokens per request and 2 slots are
# what that preset gives llama-server (--ctx-size 512 --parallel 2).
BASIC_MODELS=("tinyllama-2=$SMOLLM2")
BASIC_ARGS=(--ctx-size 256 --slots 2)
BASIC_TESTS=(
    'unit/test_basic.py::test_server_start_simple'
    'unit/test_basic.py::test_server_models'
    'unit/test_chat_completion.py::test_completion_with_response_format[response_format0-6-"42"]'
    'unit/test_chat_completion.py::test_completion_with_response_format[response_format1-10-[ -3000 ]]'
    'unit/test_chat_completion.py::test_completion_with_response_format[response_format2-10-"foooooo"]'
    'unit/test_chat_completion.py::test_completion_with_response_format[response_format3-10-(\\{|John)+]'
    'unit/test_chat_completion.py::test_completion_with_response_format[response_format4-0-None]'
    'unit/test_chat_completion.py::test_completion_with_json_schema[False-json_schema0-6-"42"]'
    'unit/test_chat_completion.py::test_completion_with_json_schema[True-json_schema1-6-"42"]'
    'unit/test_chat_completion.py::test_chat_template_continue_final_message_mutual_exclusion'
    'unit/test_chat_completion.py::test_invalid_chat_completion_req[None]'
    'unit/test_chat_completion.py::test_invalid_chat_completion_req[string]'
    'unit/test_chat_completion.py::test_invalid_chat_completion_req[messages2]'
    'unit/test_chat_completion.py::test_invalid_chat_completion_req[messages3]'
    'unit/test_chat_completion.py::test_invalid_chat_completion_req[messages4]'
    'unit/test_chat_completion.py::test_invalid_chat_completion_req[messages5]'
    'unit/test_chat_completion.py::test_invalid_chat_completion_req[messages6]'
    'unit/test_tool_call.py::test_completion_without_tool_call_fast[meta-llama-Llama-3.3-70B-Instruct-128-tools0-None-CompletionMode.NORMAL]'
    'unit/test_tool_call.py::test_completion_without_tool_call_fast[meta-llama-Llama-3.3-70B-Instruct-128-tools1-None-CompletionMode.NORMAL]'
    'unit/test_tool_call.py::test_completion_without_tool_call_fast[meta-llama-Llama-3.3-70B-Instruct-128-tools2-none-CompletionMode.NORMAL]'
    'unit/test_ctx_shift.py::test_ctx_shift_disabled_stream'
)

# Tests that call the OpenAI SDK with an OpenAI model name: llmr serves SmolLM2 under that name.
OAI_MODELS=("gpt-3.5-turbo-instruct=$SMOLLM2")
OAI_ARGS=(--ctx-size 256 --slots 2)
OAI_TESTS=(
    'unit/test_chat_completion.py::test_logprobs'
)

# The embedding preset is "bert-bge-small"; the SDK tests ask for "text-embedding-3-small".
EMBED_MODELS=("bert-bge-small=$MINILM" "text-embedding-3-small=$MINILM")
EMBED_ARGS=()
EMBED_TESTS=(
    'unit/test_embedding.py::test_embedding_single'
    'unit/test_embedding.py::test_embedding_multiple'
    'unit/test_embedding.py::test_embedding_multiple_with_fa'
    'unit/test_embedding.py::test_embedding_mixed_input[string-False]'
    'unit/test_embedding.py::test_embedding_mixed_input[input2-False]'
    'unit/test_embedding.py::test_embedding_mixed_input[input4-True]'
    'unit/test_embedding.py::test_embedding_mixed_input[input6-True]'
    'unit/test_embedding.py::test_embedding_invalid_input[input0]'
    'unit/test_embedding.py::test_embedding_invalid_input[input1]'
    'unit/test_embedding.py::test_embedding_invalid_input[input2]'
    'unit/test_embedding.py::test_embedding_invalid_input[input3]'
    'unit/test_embedding.py::test_embedding_invalid_input[input4]'
    'unit/test_embedding.py::test_embedding_invalid_input[input5]'
    'unit/test_embedding.py::test_embedding_pooling_mean'
    'unit/test_embedding.py::test_embedding_pooling_mean_multiple'
    'unit/test_embedding.py::test_embedding_openai_library_single'
    'unit/test_embedding.py::test_embedding_openai_library_multiple'
    'unit/test_embedding.py::test_same_prompt_give_same_result'
    'unit/test_embedding.py::test_embedding_usage_single[I believe the meaning of life is-9]'
    'unit/test_embedding.py::test_embedding_usage_single[This is a test-6]'
    'unit/test_embedding.py::test_embedding_usage_multiple'
    'unit/test_embedding.py::test_embedding_openai_library_base64'
)

# test_security.py's API key.
SECURITY_MODELS=("tinyllama-2=$SMOLLM2")
SECURITY_ARGS=(--ctx-size 256 --slots 2 --api-key sk-this-is-the-secret-key)
SECURITY_TESTS=(
    'unit/test_security.py::test_access_public_endpoint[/health]'
)

GROUPS_TO_RUN=(BASIC OAI EMBED SECURITY)

# --- helpers ---------------------------------------------------------------------------------------
die() {
    echo "tests/llama-server/run.sh: error: $*" >&2
    exit 1
}
note() { echo "tests/llama-server/run.sh: $*" >&2; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd "$HERE/../.." && pwd -P)
expand() { # like conftest.py: ~ and $VARS expanded, relative paths relative to the repo
    local p=${1/#\~/$HOME}
    [[ $p == /* ]] || p=$REPO_ROOT/$p
    echo "$p"
}
LLMR=$(expand "${LLMR_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/llmr/target}/debug/llmr}")
MODEL_CACHE=$(expand "${LLMR_MODEL_CACHE:-$HOME/.cache/llmr/models}")
ENGINES=$(expand "${LLMR_ENGINES_DIR:-$REPO_ROOT/engines}")
CACHE=$(realpath -m -- "${LLMR_REFERENCE_CACHE:-$HOME/.cache/llmr/reference}")
VENV=${LLMR_LLAMA_TESTS_VENV:-$HOME/.cache/llmr/venv-llama-server-tests}
WORK=$CACHE/llama-server-tests-$LCP_VERSION
SUITE=$WORK/tests
case "$CACHE/" in "$REPO_ROOT/"*) die "the cache ($CACHE) must be outside the repository" ;; esac

[[ -x $LLMR ]] || die "the llmr binary $LLMR is missing: run 'cargo build -p llmr' (or set LLMR_BIN)"
compgen -G "$ENGINES/*/*/manifest.json" >/dev/null || die "no engine plugin under $ENGINES: run scripts/install-engines"
for f in "$SMOLLM2" "$MINILM"; do
    [[ -e $MODEL_CACHE/$f ]] || die "model $MODEL_CACHE/$f is missing: run 'scripts/fetch-models smollm2 minilm' (or set LLMR_MODEL_CACHE)"
done
command -v python3 >/dev/null || die "python3 is required"
for tool in tar sha256sum; do command -v $tool >/dev/null || die "'$tool' is required"; done

# --- 1. the venv -------------------------------------------------------------------------------------
if [[ ! -x $VENV/bin/python ]]; then
    python3 -c 'import venv, ensurepip' 2>/dev/null ||
        die "python3's venv module is missing: install it (Debian/Ubuntu: apt-get install python3-venv) and run again"
    note "creating the venv $VENV"
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV" || die "python3 -m venv $VENV failed"
fi
want=$(printf '%s\n' "$REQUIREMENTS" | sha256sum | cut -d' ' -f1)
if [[ "$(cat "$VENV/.llmr-requirements.sha256" 2>/dev/null)" != "$want" ]]; then
    note "installing the suite's requirements into $VENV"
    rm -f "$VENV/.llmr-requirements.sha256"
    req=$(mktemp)
    printf '%s\n' "$REQUIREMENTS" >"$req"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2 ||
        { rm -f "$req"; die "pip install failed"; }
    rm -f "$req"
    echo "$want" >"$VENV/.llmr-requirements.sha256"
fi

# --- 2. the sdist and its test suite (same download and check as bench/reference/build.sh) ----------
mkdir -p "$CACHE"
SDIST=$CACHE/$LCP_SDIST
sha_ok() { [[ -f $1 ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$LCP_SHA256" ]]; }
if [[ "$(cat "$WORK/.extracted" 2>/dev/null)" != "$LCP_SHA256" ]] || [[ ! -f $SUITE/utils.py ]]; then
    if ! sha_ok "$SDIST"; then
        rm -f "$SDIST"
        note "downloading llama-cpp-python==$LCP_VERSION (sdist) from PyPI"
        DL=$(mktemp -d "$CACHE/.download.XXXXXX")
        "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
            "llama-cpp-python==$LCP_VERSION" -d "$DL" >&2 || { rm -rf "$DL"; die "pip download failed"; }
        [[ -f $DL/$LCP_SDIST ]] || { rm -rf "$DL"; die "pip did not produce $LCP_SDIST"; }
        got=$(sha256sum "$DL/$LCP_SDIST" | cut -d' ' -f1)
        [[ $got == "$LCP_SHA256" ]] || { rm -rf "$DL"; die "sha256 mismatch for $LCP_SDIST: expected $LCP_SHA256, got $got"; }
        mv -f "$DL/$LCP_SDIST" "$SDIST"
        rm -rf "$DL"
    fi
    note "extracting tools/server/tests from $LCP_SDIST"
    rm -rf "$WORK"
    mkdir -p "$WORK"
    X=$(mktemp -d "$WORK/.extract.XXXXXX")
    top=llama_cpp_python-$LCP_VERSION
    tar -xzf "$SDIST" -C "$X" "$top/vendor/llama.cpp/tools/server/tests" ||
        { rm -rf "$X"; die "cannot extract the server tests from $SDIST"; }
    mv "$X/$top/vendor/llama.cpp/tools/server/tests" "$SUITE"
    rm -rf "$X"
    echo "$LCP_SHA256" >"$WORK/.extracted"
fi

# --- 3. the adaptation plugin (see the header) ------------------------------------------------------------
mkdir -p "$WORK/shim"
cat >"$WORK/shim/llmr_shim.py" <<'EOF'
"""Written by llmr's tests/llama-server/run.sh: adapts the suite's request helpers to llmr."""
import os

import utils

DEFAULT_MODEL = os.environ["LLMR_DEFAULT_MODEL"]
ROUTES = {"/chat/completions": "/v1/chat/completions", "/models": "/v1/models"}


GENERATING = ("/v1/chat/completions", "/v1/completions")


def _adapt(server, path, data):
    path = ROUTES.get(path, path)
    if isinstance(data, dict) and data.get("model") is None:
        data = {**data, "model": DEFAULT_MODEL}
    if isinstance(data, dict) and path in GENERATING:
        data = {"seed": server.seed, "temperature": server.temperature, **data}
    return path, data


_make_request = utils.ServerProcess.make_request
_make_stream_request = utils.ServerProcess.make_stream_request


def make_request(self, method, path, data=None, *args, **kwargs):
    path, data = _adapt(self, path, data)
    return _make_request(self, method, path, data, *args, **kwargs)


def make_stream_request(self, method, path, data=None, *args, **kwargs):
    path, data = _adapt(self, path, data)
    return _make_stream_request(self, method, path, data, *args, **kwargs)


utils.ServerProcess.make_request = make_request
utils.ServerProcess.make_stream_request = make_stream_request
EOF

# --- 4. servers and tests ----------------------------------------------------------------------------
RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/llmr-llama-server-tests.XXXXXX")
: >"$RUN_DIR/empty.toml"
mkdir -p "$RUN_DIR/store"
SERVER_PID=
stop_server() {
    [[ -n $SERVER_PID ]] || return 0
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 150); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
}
trap stop_server EXIT
trap 'stop_server; exit 130' INT TERM

start_server() { # $1 = log file, $2 = name of the models array, $3 = name of the args array
    local log=$1
    local -n models_ref=$2 args_ref=$3
    local cmd=("$LLMR" serve --host 127.0.0.1 --port 0 --engines-dir "$ENGINES" --store "$RUN_DIR/store"
        --config "$RUN_DIR/empty.toml" --cache-mib 0)
    local m
    for m in "${models_ref[@]}"; do cmd+=(--model "${m%%=*}=$MODEL_CACHE/${m#*=}"); done
    cmd+=("${args_ref[@]}")
    local unset_env=() v
    for v in $(compgen -e); do [[ $v == LLMR_* ]] && unset_env+=(-u "$v"); done
    echo "\$ ${cmd[*]}" >"$log"
    env "${unset_env[@]}" "${cmd[@]}" >>"$log" 2>&1 &
    SERVER_PID=$!
    local i
    for i in $(seq 900); do
        PORT_FOUND=$(sed -n 's/.*llmr listening on http:\/\/127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$log" | head -1)
        [[ -n $PORT_FOUND ]] && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$log" >&2; die "llmr serve exited before listening (log above)"; }
        sleep 0.1
    done
    cat "$log" >&2
    die "llmr serve printed no listening line in 90 s"
}

start=$(date +%s)
failed_groups=()
for group in "${GROUPS_TO_RUN[@]}"; do
    models_var=${group}_MODELS
    args_var=${group}_ARGS
    tests_var=${group}_TESTS[@]
    log=$RUN_DIR/${group,,}.log
    start_server "$log" "$models_var" "$args_var"
    first_model=${models_var}[0]
    default_model=${!first_model}
    default_model=${default_model%%=*}
    note "group ${group,,}: llmr on port $PORT_FOUND (model $default_model), log $log"
    rc=0
    (
        cd "$SUITE"
        DEBUG_EXTERNAL=1 PORT=$PORT_FOUND LLMR_DEFAULT_MODEL=$default_model \
            PYTHONPATH="$SUITE:$WORK/shim" PYTHONDONTWRITEBYTECODE=1 \
            "$VENV/bin/python" -m pytest -p no:cacheprovider -p llmr_shim -q -rfE --tb=short "${!tests_var}" "$@"
    ) || rc=$?
    stop_server
    [[ $rc -eq 0 ]] || failed_groups+=("${group,,} (pytest exit $rc)")
done
elapsed=$(($(date +%s) - start))

if ((${#failed_groups[@]})); then
    note "FAILED groups: ${failed_groups[*]}; server logs kept in $RUN_DIR (${elapsed}s)"
    exit 1
fi
rm -rf "$RUN_DIR"
note "all groups passed (${elapsed}s)"
