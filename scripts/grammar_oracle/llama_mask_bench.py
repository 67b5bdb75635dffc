#!/usr/bin/env python3
"""llama.cpp's side of the mask timing: its grammar sampler applied to the whole vocabulary at every
token of grammar sentences (what llama-server does when the chain's pick is refused), timed per
token, on the vocabulary of a GGUF file (loaded vocab-only). The sentences are the ones
`mask_bench` walks (this crate's grammar samples, seeds 0..N-1), passed in as JSON lines.

Usage: llama_mask_bench.py MODEL.gguf GRAMMAR.gbnf SENTENCES.jsonl
"""
import ctypes
import json
import sys
import time

import llama_cpp as L


def main():
    model_path, gbnf_path, sentences_path = sys.argv[1:4]
    L.llama_backend_init()
    p = L.llama_model_default_params()
    p.vocab_only = True
    model = L.llama_model_load_from_file(model_path.encode(), p)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    gbnf = open(gbnf_path).read().encode()
    data = (L.llama_token_data * n_vocab)()
    fresh = (L.llama_token_data * n_vocab)()
    for t in range(n_vocab):
        fresh[t].id = t
    if L.llama_sampler_init_grammar(vocab, gbnf, b"root") is None:
        sys.exit("llama.cpp refuses the grammar")
    total, tokens, worst = 0.0, 0, 0.0
    for line in open(sentences_path):
        text = json.loads(line).encode()
        ids = (L.llama_token * (len(text) + 8))()
        n = L.llama_tokenize(vocab, text, len(text), ids, len(ids), False, False)
        smpl = L.llama_sampler_init_grammar(vocab, gbnf, b"root")
        for i in range(n):
            ctypes.memmove(data, fresh, ctypes.sizeof(data))
            arr = L.llama_token_data_array(data, n_vocab, -1, False)
            t0 = time.perf_counter()
            L.llama_sampler_apply(smpl, ctypes.byref(arr))
            dt = time.perf_counter() - t0
            total, tokens, worst = total + dt, tokens + 1, max(worst, dt)
            L.llama_sampler_accept(smpl, ids[i])
        L.llama_sampler_free(smpl)
    print(f"llama.cpp: vocabulary {n_vocab}, {tokens} tokens: grammar apply {1e3 * total / tokens:.3f} ms "
          f"per token (worst {1e3 * worst:.1f} ms)")


if __name__ == "__main__":
    main()
