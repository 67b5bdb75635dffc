#!/usr/bin/env bash
# Regenerates host/tests/fixtures/qwen3moe_tiny_*.json: llama.cpp's logits on bloomery's synthetic
# tiny qwen3moe files (seed 7) in five type mixes. Needs a CPU llama.cpp from PyPI:
#   python3 -m venv /work/oracle/venv && /work/oracle/venv/bin/pip install llama-cpp-python==0.3.36 numpy
# usage: tests/oracle/make_qwen3moe_goldens.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${1:-/work/oracle/venv/bin/python}
cargo xtask plugins >/dev/null
bin=target/debug/bloomery
plugins=target/debug/plugins
tmp=$(mktemp -d)
seqs=("5,77,300,12,509,256,1" "3,4,5,6,100,200,300,400,450,257,258,259")
while read -r name experts attn embd output; do
  "$bin" --plugin-dir "$plugins" synth --arch qwen3moe --preset tiny --seed 7 \
    --experts "$experts" --attn "$attn" --embd "$embd" --output-type "$output" -o "$tmp/$name.gguf"
  "$py" tests/oracle/llamacpp_logits.py "$tmp/$name.gguf" "host/tests/fixtures/qwen3moe_tiny_$name.json" "${seqs[@]}"
done <<'MIXES'
f32 F32 F32 F32 F32
q8_0 Q8_0 Q8_0 Q8_0 Q8_0
q4_k Q4_K Q8_0 Q8_0 Q8_0
q6_k Q6_K Q6_K Q8_0 Q6_K
q5_0 Q5_0 Q5_0 Q8_0 Q5_0
MIXES
rm -rf "$tmp"
