"""Goldens for bloomery's sampler chain from llama.cpp's own samplers (through llama-cpp-python).

For fixed logits, a penalty history and a parameter set, runs llama.cpp's default chain
(penalties -> top-k -> typical -> top-p -> min-p -> temperature) and its `dist` sampler, and records the
candidates left with their probabilities (the token llama.cpp draws is not recorded: its RNG
cannot be matched, so only the distributions are compared).

Usage: /work/oracle/venv/bin/python tests/oracle/sampling_llama_cpp.py runtime/tests/fixtures/sampling_goldens.json
"""

import ctypes
import json
import sys

import numpy as np
import llama_cpp as L

N_VOCAB = 200

CASES = [
    # name, params, history
    ("defaults", dict(), []),
    ("defaults_repeat_penalty", dict(penalty_repeat=1.3), [3, 3, 17, 42, 199, 0]),
    ("freq_presence", dict(penalty_freq=0.4, penalty_present=0.7), [5, 5, 5, 9, 12]),
    ("window_shorter_than_history", dict(penalty_last_n=3, penalty_repeat=2.0), [1, 2, 3, 4, 5, 6, 7]),
    ("top_p_only", dict(top_k=0, top_p=0.5, min_p=0.0, temp=1.0), []),
    ("min_p_only", dict(top_k=0, top_p=1.0, min_p=0.2, temp=1.0), []),
    ("top_k_5", dict(top_k=5, top_p=1.0, min_p=0.0, temp=1.0), []),
    ("hot", dict(temp=1.7), []),
    ("cold", dict(temp=0.3), []),
    ("wide_open", dict(top_k=0, top_p=1.0, min_p=0.0, temp=1.0), []),
    ("greedy", dict(temp=0.0, penalty_repeat=1.5), [0, 1, 2]),
    ("typical", dict(typ_p=0.7), []),
    ("typical_only", dict(top_k=0, typ_p=0.5, top_p=1.0, min_p=0.0, temp=1.0), []),
    ("min_keep", dict(top_k=0, top_p=0.1, min_p=0.9, temp=1.0, min_keep=4), []),
]

DEFAULTS = dict(
    top_k=40, typ_p=1.0, top_p=0.95, min_p=0.05, temp=0.8,
    penalty_last_n=64, penalty_repeat=1.0, penalty_freq=0.0, penalty_present=0.0, min_keep=0,
)


def run(logits, p, history):
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    pen = L.llama_sampler_init_penalties(
        N_VOCAB, p["penalty_last_n"], p["penalty_repeat"], p["penalty_freq"], p["penalty_present"])
    for s in [
        pen,
        L.llama_sampler_init_top_k(p["top_k"]),
        L.llama_sampler_init_typical(p["typ_p"], p["min_keep"]),
        L.llama_sampler_init_top_p(p["top_p"], p["min_keep"]),
        L.llama_sampler_init_min_p(p["min_p"], p["min_keep"]),
        L.llama_sampler_init_temp_ext(p["temp"], 0.0, 1.0),
        L.llama_sampler_init_dist(1234),
    ]:
        L.llama_sampler_chain_add(chain, s)
    for t in history:
        L.llama_sampler_accept(pen, t)
    data = (L.llama_token_data * N_VOCAB)(
        *[L.llama_token_data(i, float(x), 0.0) for i, x in enumerate(logits)])
    arr = L.llama_token_data_array(data, N_VOCAB, -1, False)
    L.llama_sampler_apply(chain, ctypes.byref(arr))
    kept = [(data[i].id, data[i].p) for i in range(arr.size) if data[i].p > 0.0]
    kept.sort(key=lambda x: (-x[1], x[0]))
    L.llama_sampler_free(chain)
    return kept


def main(out):
    rng = np.random.default_rng(20261130)
    cases = []
    for name, over, history in CASES:
        logits = (rng.standard_normal(N_VOCAB) * 3.0).astype(np.float32)
        params = dict(DEFAULTS, **over)
        kept = run(logits, params, history)
        cases.append(dict(
            name=name, params=params, history=history,
            logits=[float(x) for x in logits],
            ids=[k[0] for k in kept], probs=[float(k[1]) for k in kept],
        ))
    meta = dict(llama_cpp_python=L.__version__, n_vocab=N_VOCAB)
    with open(out, "w") as f:
        json.dump(dict(meta=meta, cases=cases), f, indent=1)
    for c in cases:
        print(f"{c['name']:32} kept {len(c['ids'])}")


if __name__ == "__main__":
    main(sys.argv[1])
