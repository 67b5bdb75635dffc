#!/usr/bin/env python3
"""Reference prompt logits and greedy continuations from llama.cpp, as a JSON golden.

Runs llama.cpp (the CPU library that `pip install llama-cpp-python==0.3.36` builds from its
vendored llama.cpp 0c1e57098) on a GGUF file. For each prompt: the prompt is tokenized by
llama.cpp (BOS added, special tokens parsed), decoded in one batch with logits at every
position (the top 20 and a fixed set of ids are kept), then N tokens are generated greedily one
at a time (the same record is kept for each step's logits). KV cache f32, no flash attention, 2 threads.

`--no-repack` loads the weights without llama.cpp's repacked CPU layouts (its `--no-repack`
flag, `use_extra_bufts = false`): the repacked kernels quantize the activations of prompt rows in
groups of four with a different rounding than the one-row path, so llama.cpp's own logits then
depend on where a row falls in the batch.

usage: llamacpp_greedy.py [--no-repack] [-n N] MODEL.gguf OUT.json PROMPT [PROMPT...]
"""
import argparse
import json

import llama_cpp as L
import numpy as np

FIXED_IDS = [0, 1, 2, 3, 106]


def tokenize(vocab, text):
    raw = text.encode()
    buf = (L.llama_token * (len(raw) + 16))()
    n = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), True, True)
    assert n >= 0, "tokenize failed"
    return list(buf[:n])


def position_record(row):
    top = np.argsort(-row, kind="stable")[:20]
    return {
        "argmax": int(top[0]),
        "top": [[int(i), float(row[i])] for i in top],
        "fixed": [float(row[i]) for i in FIXED_IDS],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-repack", action="store_true")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("prompts", nargs="+")
    args = ap.parse_args()

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = not args.no_repack
    model = L.llama_model_load_from_file(args.model.encode(), mp)
    assert model, "llama.cpp refused the model"
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    result = {
        "reference": "llama.cpp 0c1e57098 via llama-cpp-python " + L.__version__,
        "repack": not args.no_repack,
        "kv_cache": "f32",
        "fixed_ids": FIXED_IDS,
        "cases": [],
    }
    for prompt in args.prompts:
        ids = tokenize(vocab, prompt)
        cp = L.llama_context_default_params()
        cp.n_ctx = 256
        cp.n_batch = 256
        cp.n_ubatch = 256
        cp.n_threads = 2
        cp.n_threads_batch = 2
        cp.type_k = L.GGML_TYPE_F32
        cp.type_v = L.GGML_TYPE_F32
        cp.flash_attn_type = 0
        ctx = L.llama_init_from_model(model, cp)
        assert ctx, "llama.cpp could not make a context"
        batch = L.llama_batch_init(len(ids), 0, 1)
        for i, t in enumerate(ids):
            batch.token[i] = t
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1
        batch.n_tokens = len(ids)
        assert L.llama_decode(ctx, batch) == 0, "llama_decode failed"
        positions = []
        for i in range(len(ids)):
            row = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
            positions.append(position_record(row.astype(np.float32)))
        L.llama_batch_free(batch)
        cont = [positions[-1]["argmax"]]
        steps = []
        one = L.llama_batch_init(1, 0, 1)
        while len(cont) < args.n:
            one.token[0] = cont[-1]
            one.pos[0] = len(ids) + len(cont) - 1
            one.n_seq_id[0] = 1
            one.seq_id[0][0] = 0
            one.logits[0] = 1
            one.n_tokens = 1
            assert L.llama_decode(ctx, one) == 0, "llama_decode failed"
            row = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, 0), shape=(n_vocab,))
            steps.append(position_record(row.astype(np.float32)))
            cont.append(steps[-1]["argmax"])
        L.llama_batch_free(one)
        L.llama_free(ctx)
        result["cases"].append(
            {
                "prompt": prompt,
                "ids": ids,
                "positions": positions,
                "continuation": cont,
                "steps": steps,
            }
        )
    L.llama_model_free(model)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
