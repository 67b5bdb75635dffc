#!/usr/bin/env python3
"""Reference embeddings from llama.cpp's `llama-embedding`, as a JSON golden.

Runs a built `llama-embedding` (llama.cpp b11434) on a GGUF file once per pooling, all prompts in
one run (one sequence each, one batch), with `--embd-output-format json --verbose-prompt` and
`--no-repack` (the plain CPU weight layout, whose activation rounding bloomery's CPU kernels
follow; the repacked layouts round prompt rows in groups of four, and llama.cpp's own rows with
and without them differ by up to 1.7e-3 in cosine on this model's pooling `last`), and
keeps each prompt's token ids (from the verbose listing) and the rows as printed (`%1.7f`). The
pooled runs (mean, cls, last) normalize as the server does by default (`--embd-normalize 2`);
pooling `none` is run on one prompt without normalization (`--embd-normalize -1`), since
llama-server returns per-token rows as they are.

usage: llamacpp_embeddings.py LLAMA_EMBEDDING MODEL.gguf OUT.json PROMPT [PROMPT...]
"""
import json
import re
import subprocess
import sys

TOKEN_LINE = re.compile(r"^\s*(\d+) -> '")


def run(binary, model, prompts, pooling, normalize):
    out = subprocess.run(
        [binary, "-m", model, "-p", "\n".join(prompts), "--pooling", pooling,
         "--embd-normalize", str(normalize), "--embd-output-format", "json",
         "--verbose-prompt", "--no-repack", "-fa", "off", "-ctk", "f32", "-ctv", "f32", "-t", "2"],
        check=True, capture_output=True, text=True).stdout
    start = out.index('{\n  "object": "list"')
    rows = [d["embedding"] for d in json.loads(out[start:])["data"]]
    tokens, current = [], []
    for line in out[:start].splitlines():
        m = TOKEN_LINE.match(line)
        if m:
            current.append(int(m.group(1)))
        elif current and not line.strip():
            tokens.append(current)
            current = []
    if current:
        tokens.append(current)
    assert len(tokens) == len(prompts), (tokens, prompts)
    return tokens, rows


def main():
    binary, model, out_path, *prompts = sys.argv[1:]
    golden = {"prompts": prompts, "poolings": {}}
    for pooling in ("mean", "cls", "last"):
        tokens, rows = run(binary, model, prompts, pooling, 2)
        golden["tokens"] = tokens
        golden["poolings"][pooling] = {"embd_normalize": 2, "prompts": list(range(len(prompts))),
                                       "rows": rows}
    tokens, rows = run(binary, model, prompts[1:2], "none", -1)
    assert tokens[0] == golden["tokens"][1]
    golden["poolings"]["none"] = {"embd_normalize": -1, "prompts": [1], "rows": rows}
    with open(out_path, "w") as f:
        json.dump(golden, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
