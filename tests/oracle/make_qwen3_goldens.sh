#!/usr/bin/env bash
# Regenerates host/tests/fixtures/qwen3_tiny_*.json: llama.cpp's logits on the synthetic tiny
# qwen3 file (seed 7) that the example plugin (examples/model-plugin, built outside the workspace)
# declares, written by the host with that plugin loaded from a second plugin folder. Needs a CPU
# llama.cpp from PyPI:
#   python3 -m venv /work/oracle/venv && /work/oracle/venv/bin/pip install llama-cpp-python==0.3.36 numpy
# usage: tests/oracle/make_qwen3_goldens.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${1:-/work/oracle/venv/bin/python}
cargo xtask plugins >/dev/null
cargo build -p bloomery
cargo build --manifest-path examples/model-plugin/Cargo.toml --target-dir examples/model-plugin/target
bin=target/debug/bloomery
dirs=(--plugin-dir target/debug/plugins --plugin-dir examples/model-plugin/target/debug)
tmp=$(mktemp -d)
seqs=("5,77,300,12,509,256,1" "3,4,5,6,100,200,300,400,450,257,258,259")
while read -r name t; do
  "$bin" "${dirs[@]}" synth --arch qwen3 --preset tiny --seed 7 \
    --attn "$t" --embd "$t" --output-type "$t" --dense "$t" -o "$tmp/$name.gguf"
  "$py" tests/oracle/llamacpp_logits.py "$tmp/$name.gguf" "host/tests/fixtures/qwen3_tiny_$name.json" "${seqs[@]}"
done <<'MIXES'
f32 F32
q8_0 Q8_0
MIXES
rm -rf "$tmp"
