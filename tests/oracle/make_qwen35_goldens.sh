#!/usr/bin/env bash
# Regenerates host/tests/fixtures/qwen35moe_tiny_*.json and qwen35_tiny_*.json: reference logits on
# bloomery's synthetic tiny qwen35moe / qwen35 files (seed 7) in two type mixes, from two independent
# oracles on the same GGUF file:
#   <arch>_tiny_<mix>.json      llama.cpp b11739 (llama-cpp-py-sync 0.11739, CPU), one decode per sequence
#   <arch>_tiny_<mix>_hf.json   transformers 5.24.0 Qwen3_5MoeForCausalLM / Qwen3_5ForCausalLM, CPU f32
#                               (tensors dequantized by gguf.quants; see hf_qwen35.py); qwen35moe's
#                               also hold each layer's routed experts per position (router_ids)
# and checks llama.cpp one-token-per-decode (recurrent state carried between decodes) against both.
# For the f32 mix, every pair must agree within 1e-4 relative (max|a-b|/max|b|) with equal argmax;
# for q8_0, llama.cpp also rounds activations to Q8_0 in its matmuls while transformers works on the
# dequantized f32 weights, so that pair is only printed, and so is a diagnostic run of transformers
# that rounds its matmul inputs the same way (hf_qwen35.py --q8-act; not written as a golden).
# Needs the oracle venv: tests/oracle/setup_oracle_venv.sh. The mapping is validated without bloomery
# by tests/oracle/check_qwen35_roundtrip.py.
# usage: tests/oracle/make_qwen35_goldens.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${1:-/work/oracle/venv/bin/python}
cargo build -q --bin bloomery
cargo xtask plugins >/dev/null
bin=target/debug/bloomery
plugins=target/debug/plugins
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
seqs=("5,77,300,12,509,256,1" "3,4,5,6,100,200,300,400,450,257,258,259")
fx=host/tests/fixtures
compare() { # compare A.json B.json LABEL TOL(or -)
  "$py" - "$@" <<'EOF'
import json, sys
import numpy as np
a, b, label, tol = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3], sys.argv[4]
assert a["file_sha256"] == b["file_sha256"], "different files"
bad = False
for x, y in zip(a["sequences"], b["sequences"]):
    assert x["tokens"] == y["tokens"]
    x, y = np.array(x["logits"]), np.array(y["logits"])
    rel = np.abs(x - y).max() / np.abs(y).max()
    same = (x.argmax(-1) == y.argmax(-1)).mean()
    print(f"  {label}: rel {rel:.2e}, argmax agreement {same:.3f} ({len(x)} positions)")
    bad |= tol != "-" and (rel > float(tol) or same < 1.0)
sys.exit(1 if bad else 0)
EOF
}
while read -r arch mix experts attn embd output dense tol; do
  name=${arch}_tiny_$mix
  echo "== $name"
  "$bin" --plugin-dir "$plugins" synth --arch "$arch" --preset tiny --seed 7 \
    --experts "$experts" --attn "$attn" --embd "$embd" --output-type "$output" --dense "$dense" -o "$tmp/$name.gguf"
  "$py" tests/oracle/llamacpp_sync_logits.py "$tmp/$name.gguf" "$fx/$name.json" "${seqs[@]}"
  "$py" tests/oracle/llamacpp_sync_logits.py --per-token "$tmp/$name.gguf" "$tmp/${name}_tok.json" "${seqs[@]}"
  "$py" tests/oracle/hf_qwen35.py "$tmp/$name.gguf" "$fx/${name}_hf.json" "${seqs[@]}"
  compare "$fx/${name}_hf.json" "$fx/$name.json" "transformers vs llama.cpp" "$tol"
  compare "$tmp/${name}_tok.json" "$fx/$name.json" "llama.cpp per-token vs batch" 1e-4
  compare "$tmp/${name}_tok.json" "$fx/${name}_hf.json" "llama.cpp per-token vs transformers" "$tol"
  if [ "$mix" != f32 ]; then
    "$py" tests/oracle/hf_qwen35.py "$tmp/$name.gguf" "$tmp/${name}_hfq.json" --q8-act "${seqs[@]}"
    compare "$tmp/${name}_hfq.json" "$fx/$name.json" "transformers with Q8_0-rounded activations vs llama.cpp" -
  fi
done <<'MIXES'
qwen35moe f32 F32 F32 F32 F32 F32 1e-4
qwen35moe q8_0 Q8_0 Q8_0 Q8_0 Q8_0 Q8_0 -
qwen35 f32 F32 F32 F32 F32 F32 1e-4
qwen35 q8_0 Q8_0 Q8_0 Q8_0 Q8_0 Q8_0 -
MIXES
