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
# usage: tests/oracle/make_qwen35_mtp_goldens.sh [PYTHON]
#   PYTHON: the oracle venv (tests/oracle/setup_oracle_venv.sh): torch (CPU), transformers==5.24.0,
#   numpy, gguf
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${1:-/work/oracle/venv/bin/python}
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
for arch in qwen35moe qwen35; do
  "$bin" --plugin-dir "$plugins" synth --arch "$arch" --preset tiny-mtp --seed 7 -o "$tmp/$arch.gguf"
  "$py" tests/oracle/numpy_qwen35_mtp.py "$tmp/$arch.gguf" "$fx/${arch}_tiny_mtp_np.json" --check-hf "${seqs[@]}"
done
