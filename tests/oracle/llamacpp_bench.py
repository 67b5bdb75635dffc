#!/usr/bin/env python3
"""llama-bench-style pp/tg figures from llama.cpp (the llama-cpp-python CPU build) on a GGUF file,
for side-by-side rows in docs/performance.md.

usage: llamacpp_bench.py MODEL.gguf [-p 512] [-n 128] [-r 3] [-t THREADS]
pp = one llama_decode of p random tokens; tg = n single-token decodes after a 1-token prompt.
"""
import argparse
import random
import statistics
import time

import llama_cpp


def ctx_for(model, n_ctx, threads):
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = n_ctx
    cp.n_ubatch = n_ctx
    cp.n_threads = threads
    cp.n_threads_batch = threads
    return llama_cpp.llama_init_from_model(model, cp)


def decode(ctx, tokens, start):
    b = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    for i, t in enumerate(tokens):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, 0
        b.seq_id[i][0] = 0
    b.logits[len(tokens) - 1] = 1
    b.n_tokens = len(tokens)
    assert llama_cpp.llama_decode(ctx, b) == 0
    llama_cpp.llama_batch_free(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-t", type=int, default=2)
    a = ap.parse_args()
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(a.model.encode(), llama_cpp.llama_model_default_params())
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    rng = random.Random(0)
    pp, tg = [], []
    for _ in range(a.r):
        ctx = ctx_for(model, a.p + 8, a.t)
        toks = [rng.randrange(n_vocab) for _ in range(a.p)]
        t0 = time.perf_counter()
        decode(ctx, toks, 0)
        pp.append(a.p / (time.perf_counter() - t0))
        llama_cpp.llama_free(ctx)
        ctx = ctx_for(model, a.n + 8, a.t)
        decode(ctx, [1], 0)
        t0 = time.perf_counter()
        for i in range(a.n):
            decode(ctx, [rng.randrange(n_vocab)], 1 + i)
        tg.append(a.n / (time.perf_counter() - t0))
        llama_cpp.llama_free(ctx)
    for name, v in ((f"pp{a.p}", pp), (f"tg{a.n}", tg)):
        sd = statistics.stdev(v) if len(v) > 1 else 0.0
        print(f"| llama.cpp 0c1e57098 | {name} | {statistics.mean(v):.2f} ± {sd:.2f} |")


if __name__ == "__main__":
    main()
