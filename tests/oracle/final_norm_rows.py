#!/usr/bin/env python3
"""Reference final-norm rows (the rows a decision head reads) of a tiny `qwen35` GGUF, from two
independent oracles on the same token ids, as one JSON golden.

  * llama.cpp b11434's `llama-embedding --pooling none --embd-normalize -1` (the plain CPU path:
    `--no-repack`, flash attention off, f32 K/V), through `run` of llamacpp_embeddings.py; its
    verbose prompt listing gives the token ids of each prompt;
  * transformers `Qwen3_5ForCausalLM` built from the same file by `build` of hf_qwen35.py (CPU f32),
    `output_hidden_states=True`, the last hidden state (after the final norm: the script checks
    that the output head applied to it gives the model's logits).

Writes {reference, file_sha256, sequences: [{prompt, tokens, llamacpp, transformers}]} (rows per
position, `n_embd` values each, to 7 decimals as llama-embedding prints them) and prints the largest |a-b| between the oracles per sequence.

usage: final_norm_rows.py LLAMA_EMBEDDING MODEL.gguf OUT.json PROMPT [PROMPT...]
(run with a Python that has torch, transformers 5.24 and gguf, e.g. /work/notes/hf-venv)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from hf_qwen35 import build, sha256  # noqa: E402
from llamacpp_embeddings import run  # noqa: E402


def main():
    binary, model_path, out_path, *prompts = sys.argv[1:]
    if not prompts:
        sys.exit(__doc__)
    torch.manual_seed(0)
    model = build(model_path)
    out = {
        "reference": f"llama.cpp b11434 llama-embedding (--pooling none, --no-repack, -fa off, f32 K/V); "
                     f"transformers {transformers.__version__}, torch {torch.__version__}, CPU f32",
        "file_sha256": sha256(model_path),
        "sequences": [],
    }
    for prompt in prompts:
        tokens, rows = run(binary, model_path, [prompt], "none", -1)
        tokens = tokens[0]
        assert len(rows) == len(tokens), (len(rows), len(tokens))
        with torch.no_grad():
            res = model(torch.tensor([tokens]), use_cache=False, output_hidden_states=True)
        hidden = res.hidden_states[-1][0]
        # The last hidden state is the final norm's output: the head applied to it gives the logits.
        logits = model.lm_head(hidden)
        assert torch.allclose(logits, res.logits[0], atol=1e-5), "hidden_states[-1] is not after the norm"
        hf = hidden.float().numpy()
        d = np.abs(hf - np.array(rows)).max()
        print(f"{prompt!r}: {len(tokens)} positions, llama.cpp vs transformers max |d| {d:.2e}")
        # Seven decimals, as llama-embedding prints its rows.
        out["sequences"].append({"prompt": prompt, "tokens": tokens, "llamacpp": rows,
                                 "transformers": [[round(float(x), 7) for x in r] for r in hf]})
    with open(out_path, "w") as f:
        json.dump(out, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
