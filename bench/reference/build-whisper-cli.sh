#!/usr/bin/env bash
# Builds whisper.cpp's own command-line tool (whisper-cli) on the whisper.cpp library that the
# llmr whisper_cpp plugin links (the tree vendored in the crate whisper-rs-sys 0.15.0, whisper.cpp
# 1.8.3), with the cmake options that crate's build.rs uses in llmr's build, so that
# bench/speech_bench.py compares the two engine for engine. See bench/README.md ("Speech").
#
# The crate ships only the library (no examples/); the CLI's sources (examples/cli and the
# examples' common code) come from the whisper.cpp 1.9.1 tree inside the npm package
# nodejs-whisper@0.3.1 (`npm pack`). Four `case` lines of common-ggml.cpp name ggml types that
# 1.8.3's ggml does not have (NVFP4, Q1_0: quantisation only, never used by the CLI) and are
# deleted; everything else is used as shipped.
#
# Everything (crate tarball copy, npm tarball, sources, build) lives in a cache outside the repo:
#   ${LLMR_REFERENCE_CACHE:-$HOME/.cache/llmr/reference}
#
# stdout, one per line (progress and build logs go to stderr / a log file):
#   whisper-cli=PATH
#   whisper.cpp=X.Y.Z                  library version (CMakeLists.txt of the crate's tree)
#   whisper-rs-sys=0.15.0 (commit ...) the crate it came from
#   cli-sources=nodejs-whisper 0.3.1 (whisper.cpp X.Y.Z examples/)
#   ggml=X.Y.Z
#
# Environment:
#   LLMR_REFERENCE_CACHE   cache directory (default $HOME/.cache/llmr/reference)
#   LLMR_REFERENCE_JOBS    make jobs (default 2)
#   LLMR_REFERENCE_VERBOSE=1  stream the cmake/make output to stderr instead of only the log file
#
# A second run with the binary present only checks a stamp file and prints the lines above.
set -euo pipefail

# --- pins ------------------------------------------------------------------------------------
# The crate llmr's whisper_cpp plugin builds (Cargo.lock), and its sha256 there.
SYS_CRATE=whisper-rs-sys
SYS_VERSION=0.15.0
SYS_SHA256=6986c0fe081241d391f09b9a071fbcbb59720c3563628c3c829057cf69f2a56f
WHISPER_VERSION=1.8.3
# The CLI's sources.
NPM_PACKAGE=nodejs-whisper
NPM_VERSION=0.3.1
NPM_TGZ=nodejs-whisper-$NPM_VERSION.tgz
NPM_SHA256=92041caf2b26c74b7f489fedf37bd093f216eebd61df512045ec2d19d0531d37
CLI_WHISPER_VERSION=1.9.1
# What is taken from the npm package's package/cpp/whisper.cpp/examples/.
CLI_FILES=(
    cli/cli.cpp cli/CMakeLists.txt
    common.h common.cpp common-ggml.h common-ggml.cpp common-whisper.h common-whisper.cpp
    grammar-parser.h grammar-parser.cpp json.hpp miniaudio.h stb_vorbis.c
)

TARGETS=(whisper-cli)

# --- helpers ---------------------------------------------------------------------------------
die() {
    echo "bench/reference/build-whisper-cli.sh: error: $*" >&2
    exit 1
}
note() { echo "bench/reference/build-whisper-cli.sh: $*" >&2; }

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd "$SCRIPT_DIR/../.." && pwd -P)

CACHE=${LLMR_REFERENCE_CACHE:-$HOME/.cache/llmr/reference}
JOBS=${LLMR_REFERENCE_JOBS:-2}
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || die "LLMR_REFERENCE_JOBS must be a positive integer (got '$JOBS')"

CACHE=$(realpath -m -- "$CACHE") || die "cannot resolve the cache path '$CACHE'"
case "$CACHE/" in
    "$REPO_ROOT/"*) die "the cache ($CACHE) must be outside the repository ($REPO_ROOT)" ;;
esac
mkdir -p "$CACHE" || die "cannot create cache directory $CACHE"

WORK=$CACHE/whisper-cli-$WHISPER_VERSION
SRC=$WORK/whisper.cpp
BUILD=$WORK/build
BIN=$BUILD/bin
STAMP=$BUILD/.llmr-reference-stamp
LOG=$BUILD/build.log
CARGO_HOME_DIR=${CARGO_HOME:-$HOME/.cargo}

# --- cmake configuration (mirrors whisper-rs-sys 0.15.0 build.rs + the cmake crate) ------------
# What llmr's build ran (target/release/build/whisper-rs-sys-*/stderr, "running: ... cmake"):
#   -DBUILD_SHARED_LIBS=OFF -DWHISPER_ALL_WARNINGS=OFF -DWHISPER_ALL_WARNINGS_3RD_PARTY=OFF
#   -DWHISPER_BUILD_TESTS=OFF -DWHISPER_BUILD_EXAMPLES=OFF -DGGML_METAL=OFF
#   -DCMAKE_BUILD_TYPE=Release -DGGML_OPENMP=OFF  (the plugin turns whisper-rs' default features,
#   openmp among them, off) and the cc crate's flags below. GGML_NATIVE stays at whisper.cpp's
#   default (ON: -march=native for ggml-cpu), as in the plugin.
CC_BIN=$(command -v cc || true)
CXX_BIN=$(command -v c++ || true)
ARCH=$(uname -m)
case "$ARCH" in
    x86_64) BASE_FLAGS=" -ffunction-sections -fdata-sections -fPIC -m64 -march=x86-64 -w" ;;
    *) BASE_FLAGS=" -ffunction-sections -fdata-sections -fPIC -w" ;;
esac

CMAKE_ARGS=(
    -G "Unix Makefiles"
    -DBUILD_SHARED_LIBS=OFF
    -DWHISPER_ALL_WARNINGS=OFF
    -DWHISPER_ALL_WARNINGS_3RD_PARTY=OFF
    -DWHISPER_BUILD_TESTS=OFF
    -DGGML_METAL=OFF
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_OPENMP=OFF
    "-DCMAKE_C_FLAGS=$BASE_FLAGS"
    "-DCMAKE_C_COMPILER=$CC_BIN"
    "-DCMAKE_CXX_FLAGS=$BASE_FLAGS"
    "-DCMAKE_CXX_COMPILER=$CXX_BIN"
    "-DCMAKE_ASM_FLAGS=$BASE_FLAGS"
    "-DCMAKE_ASM_COMPILER=$CC_BIN"
    # Different from the crate, needed for the tool: the examples directory (only the CLI).
    -DWHISPER_BUILD_EXAMPLES=ON
    -DWHISPER_SDL2=OFF
    -DWHISPER_FFMPEG=OFF
    -DWHISPER_CURL=OFF
)

STAMP_CONTENT=$(printf '%s\n' "crate=$SYS_CRATE-$SYS_VERSION sha256=$SYS_SHA256" \
    "npm=$NPM_TGZ sha256=$NPM_SHA256" "${CLI_FILES[@]}" "${CMAKE_ARGS[@]}")

version_of() { # $1 = CMakeLists.txt with project("whisper.cpp" VERSION X)
    sed -n 's/^project("whisper.cpp" VERSION \([0-9.]*\)).*/\1/p' "$1" 2>/dev/null | head -n1
}
ggml_version_of() { # $1 = ggml source dir
    local f=$1/CMakeLists.txt ma mi pa
    [[ -f $f ]] || { echo unknown; return; }
    ma=$(sed -n 's/^set(GGML_VERSION_MAJOR \([0-9]*\)).*/\1/p' "$f")
    mi=$(sed -n 's/^set(GGML_VERSION_MINOR \([0-9]*\)).*/\1/p' "$f")
    pa=$(sed -n 's/^set(GGML_VERSION_PATCH \([0-9]*\)).*/\1/p' "$f")
    echo "${ma:-?}.${mi:-?}.${pa:-?}"
}

print_result() {
    echo "whisper-cli=$BIN/whisper-cli"
    echo "whisper.cpp=$(version_of "$SRC/CMakeLists.txt")"
    echo "whisper-rs-sys=$SYS_VERSION (commit $(cat "$WORK/.crate-commit" 2>/dev/null || echo unknown))"
    echo "cli-sources=$NPM_PACKAGE $NPM_VERSION (whisper.cpp $CLI_WHISPER_VERSION examples/)"
    echo "ggml=$(ggml_version_of "$SRC/ggml")"
}

binaries_present() {
    local t
    for t in "${TARGETS[@]}"; do
        [[ -x $BIN/$t ]] || return 1
    done
}

# --- fast path -----------------------------------------------------------------------------------
if [[ -f $STAMP ]] && binaries_present && [[ "$(cat "$STAMP")" == "$STAMP_CONTENT" ]]; then
    print_result
    exit 0
fi

# --- slow path: serialise concurrent runs ---------------------------------------------------------
exec 9>"$CACHE/.lock-whisper-cli"
if command -v flock >/dev/null; then
    flock 9 || die "cannot lock $CACHE/.lock-whisper-cli"
    if [[ -f $STAMP ]] && binaries_present && [[ "$(cat "$STAMP")" == "$STAMP_CONTENT" ]]; then
        print_result
        exit 0
    fi
fi

# --- tools ---------------------------------------------------------------------------------------
if ! command -v cmake >/dev/null; then
    note "cmake is missing; installing it with apt-get"
    if [[ $(id -u) -eq 0 ]]; then
        apt-get install -y cmake >&2 || die "apt-get install -y cmake failed"
    else
        sudo apt-get install -y cmake >&2 || die "apt-get install -y cmake failed"
    fi
fi
for tool in make tar sha256sum npm cargo; do
    command -v "$tool" >/dev/null || die "'$tool' is required but not installed"
done
[[ -n $CC_BIN && -n $CXX_BIN ]] || die "a C/C++ compiler ('cc' and 'c++') is required"

sha_ok() { [[ -f $1 ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$2" ]]; }

# --- 1. the crate (cargo's own download, checked against Cargo.lock's pin) -------------------------
crate_file() {
    local f
    for f in "$CARGO_HOME_DIR"/registry/cache/*/"$SYS_CRATE-$SYS_VERSION.crate"; do
        sha_ok "$f" "$SYS_SHA256" && { echo "$f"; return 0; }
    done
    return 1
}
CRATE=$(crate_file || true)
if [[ -z $CRATE ]]; then
    grep -q "name = \"$SYS_CRATE\"" "$REPO_ROOT/Cargo.lock" ||
        die "$SYS_CRATE is not in $REPO_ROOT/Cargo.lock any more; update the pins"
    note "$SYS_CRATE $SYS_VERSION is not in the cargo registry cache: running 'cargo fetch' in the repo"
    (cd "$REPO_ROOT" && cargo fetch --locked >&2) || die "cargo fetch failed"
    CRATE=$(crate_file) || die "cargo fetch did not bring $SYS_CRATE-$SYS_VERSION.crate with sha256 $SYS_SHA256"
fi

# --- 2. the npm package with the CLI's sources ----------------------------------------------------
NPM_FILE=$CACHE/$NPM_TGZ
if ! sha_ok "$NPM_FILE" "$NPM_SHA256"; then
    if [[ -f $NPM_FILE ]]; then
        note "cached $NPM_TGZ has the wrong sha256; downloading it again"
        rm -f "$NPM_FILE"
    fi
    note "downloading $NPM_PACKAGE@$NPM_VERSION from npm (npm pack)"
    DL=$(mktemp -d "$CACHE/.download.XXXXXX")
    trap 'rm -rf "$DL"' EXIT
    (cd "$DL" && npm pack --silent "$NPM_PACKAGE@$NPM_VERSION" >&2) || die "npm pack $NPM_PACKAGE@$NPM_VERSION failed"
    [[ -f $DL/$NPM_TGZ ]] || die "npm pack did not produce $NPM_TGZ (got: $(ls "$DL"))"
    got=$(sha256sum "$DL/$NPM_TGZ" | cut -d' ' -f1)
    [[ $got == "$NPM_SHA256" ]] || die "sha256 mismatch for $NPM_TGZ: expected $NPM_SHA256, got $got"
    mv -f "$DL/$NPM_TGZ" "$NPM_FILE"
    rm -rf "$DL"
    trap - EXIT
fi

# --- 3. the source tree: the crate's whisper.cpp + the CLI's examples/ ---------------------------
EXTRACTED="$SYS_SHA256 $NPM_SHA256"
if [[ ! -f $WORK/.extracted ]] || [[ "$(cat "$WORK/.extracted")" != "$EXTRACTED" ]]; then
    note "extracting whisper.cpp from $(basename "$CRATE") and examples/ from $NPM_TGZ"
    rm -rf "$SRC" "$BUILD" "$WORK/.extracted" "$WORK/.crate-commit"
    mkdir -p "$WORK"
    X=$(mktemp -d "$WORK/.extract.XXXXXX")
    trap 'rm -rf "$X"' EXIT
    top=$SYS_CRATE-$SYS_VERSION
    tar -xzf "$CRATE" -C "$X" "$top/whisper.cpp" "$top/.cargo_vcs_info.json" ||
        die "cannot extract whisper.cpp from $CRATE"
    v=$(version_of "$X/$top/whisper.cpp/CMakeLists.txt")
    [[ $v == "$WHISPER_VERSION" ]] || die "the crate vendors whisper.cpp $v, the pins say $WHISPER_VERSION"
    sed -n 's/.*"sha1": *"\([0-9a-f]*\)".*/\1/p' "$X/$top/.cargo_vcs_info.json" | head -c 12 >"$WORK/.crate-commit"
    [[ ! -e $X/$top/whisper.cpp/examples ]] || die "the crate unexpectedly ships examples/; review this script"
    mkdir -p "$X/npm"
    npm_top=package/cpp/whisper.cpp
    tar -xzf "$NPM_FILE" -C "$X/npm" "$npm_top/CMakeLists.txt" "${CLI_FILES[@]/#/$npm_top/examples/}" ||
        die "cannot extract the CLI's sources from $NPM_TGZ"
    v=$(version_of "$X/npm/$npm_top/CMakeLists.txt")
    [[ $v == "$CLI_WHISPER_VERSION" ]] || die "$NPM_TGZ has whisper.cpp $v, the pins say $CLI_WHISPER_VERSION"
    ex=$X/$top/whisper.cpp/examples
    mkdir -p "$ex"
    for f in "${CLI_FILES[@]}"; do
        mkdir -p "$ex/$(dirname "$f")"
        cp "$X/npm/$npm_top/examples/$f" "$ex/$f"
    done
    # ggml types newer than the crate's ggml (quantisation tables of common-ggml.cpp only).
    before=$(wc -l <"$ex/common-ggml.cpp")
    sed -i -E '/^[[:space:]]*case GGML_(FTYPE_MOSTLY|TYPE)_(NVFP4|Q1_0):[[:space:]]*$/d' "$ex/common-ggml.cpp"
    removed=$((before - $(wc -l <"$ex/common-ggml.cpp")))
    [[ $removed -eq 4 ]] || die "expected to delete 4 case lines from common-ggml.cpp, deleted $removed"
    # The examples' CMakeLists: the common library and the CLI only (upstream's lists every
    # example, most of whose sources are not taken).
    cat >"$ex/CMakeLists.txt" <<'EOF'
# Written by bench/reference/build-whisper-cli.sh: the `common` library and whisper-cli only,
# as in whisper.cpp's examples/CMakeLists.txt without SDL2, FFmpeg or the other examples.
find_package(Threads REQUIRED)

set(TARGET common)
add_library(${TARGET} STATIC
    common.h
    common.cpp
    common-ggml.h
    common-ggml.cpp
    common-whisper.h
    common-whisper.cpp
    grammar-parser.h
    grammar-parser.cpp
    )
include(DefaultTargetOptions)
target_link_libraries(${TARGET} PRIVATE whisper ${CMAKE_DL_LIBS})
set_target_properties(${TARGET} PROPERTIES POSITION_INDEPENDENT_CODE ON)

add_library(json_cpp INTERFACE)
target_include_directories(json_cpp INTERFACE ${CMAKE_CURRENT_SOURCE_DIR})

include_directories(${CMAKE_CURRENT_SOURCE_DIR})
add_subdirectory(cli)
EOF
    mv "$X/$top/whisper.cpp" "$SRC"
    rm -rf "$X"
    trap - EXIT
    echo "$EXTRACTED" >"$WORK/.extracted"
fi

# --- 4. configure and build ------------------------------------------------------------------------
mkdir -p "$BUILD"
rm -f "$STAMP"
if [[ -f $BUILD/CMakeCache.txt ]] && [[ "$(cat "$BUILD/.llmr-configured" 2>/dev/null)" != "$STAMP_CONTENT" ]]; then
    note "cmake options changed; reconfiguring from scratch"
    find "$BUILD" -mindepth 1 -delete
fi

run_logged() { # runs "$@" with output appended to $LOG (and to stderr when verbose)
    if [[ ${LLMR_REFERENCE_VERBOSE:-0} == 1 ]]; then
        "$@" 2>&1 | tee -a "$LOG" >&2
        return "${PIPESTATUS[0]}"
    else
        "$@" >>"$LOG" 2>&1
    fi
}
fail_with_log() {
    echo "---- last 40 lines of $LOG ----" >&2
    tail -n 40 "$LOG" >&2 || true
    die "$1"
}

: >"$LOG"
start=$(date +%s)
# As in cargo's build: no SOURCE_DATE_EPOCH (it would turn GGML_NATIVE's default off), no
# inherited parallelism; GIT_CEILING_DIRECTORIES keeps cmake's git probes inside the cache.
export GIT_CEILING_DIRECTORIES=$WORK
unset SOURCE_DATE_EPOCH CMAKE_BUILD_PARALLEL_LEVEL MAKEFLAGS

if [[ ! -f $BUILD/CMakeCache.txt ]]; then
    note "configuring whisper.cpp $WHISPER_VERSION with whisper-cli (log: $LOG)"
    run_logged nice -n 19 cmake -S "$SRC" -B "$BUILD" "${CMAKE_ARGS[@]}" ||
        fail_with_log "cmake configure failed"
    printf '%s\n' "$STAMP_CONTENT" >"$BUILD/.llmr-configured"
fi

note "building ${TARGETS[*]} with $JOBS jobs under nice (a few minutes; log: $LOG)"
run_logged nice -n 19 cmake --build "$BUILD" --config Release -j "$JOBS" --target "${TARGETS[@]}" ||
    fail_with_log "build failed"
binaries_present || fail_with_log "build finished but not all of ${TARGETS[*]} are in $BIN"

# Sanity: the CLI runs, and its ggml is the crate's (no OpenMP, as in the plugin).
"$BIN/whisper-cli" --help >/dev/null 2>&1 || die "$BIN/whisper-cli --help fails"
grep -q '^GGML_OPENMP:BOOL=OFF' "$BUILD/CMakeCache.txt" || die "GGML_OPENMP is not OFF in $BUILD/CMakeCache.txt"

printf '%s\n' "$STAMP_CONTENT" >"$STAMP"
note "built in $(($(date +%s) - start)) s"
print_result
