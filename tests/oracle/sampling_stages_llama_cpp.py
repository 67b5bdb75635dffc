"""Goldens for bloomery's samplers beyond the default chain, from llama.cpp's own samplers
(through llama-cpp-python's low-level API; this script only calls the installed package).

Each case is a sampler configuration (bloomery's `SamplerParams` names), a token history and a
number of steps. The chain is built as llama-server's `common_sampler_init` builds it: logit
bias first; then, without Mirostat, the stages in the configured order and `adaptive-p` or `dist`
last; with Mirostat, the plain temperature and Mirostat. Every step applies the chain to fresh
logits, records the candidates left with their probabilities and the token llama.cpp selected,
and accepts that token into the chain (DRY's window, adaptive-p's average).

DRY cases use gemma-3-270m's vocabulary (`target/test-data/gemma-3-270m-q4_k_m.gguf`, loaded
vocab-only): they record the text of the candidate tokens (llama_detokenize, special tokens
rendered, once in `meta`) and llama.cpp's tokenization of every breaker's tails, which bloomery's test feeds to
its own breaker processing.

Usage: /work/oracle/venv/bin/python tests/oracle/sampling_stages_llama_cpp.py \
           target/test-data/gemma-3-270m-q4_k_m.gguf runtime/tests/fixtures/sampling_stages.json
"""

import ctypes
import json
import sys

import numpy as np
import llama_cpp as L

DEFAULTS = dict(
    top_k=40, typ_p=1.0, top_p=0.95, min_p=0.05, temp=0.8,
    dynatemp_range=0.0, dynatemp_exponent=1.0,
    penalty_last_n=64, penalty_repeat=1.0, penalty_freq=0.0, penalty_present=0.0,
    dry_multiplier=0.0, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=64,
    dry_sequence_breakers=["\n", ":", "\"", "*"],
    top_n_sigma=-1.0, xtc_probability=0.0, xtc_threshold=0.1,
    mirostat=0, mirostat_tau=5.0, mirostat_eta=0.1,
    adaptive_target=-1.0, adaptive_decay=0.9,
    logit_bias=[],
    samplers=["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
              "temperature"],
    min_keep=0, seed=0,
)

OPEN = dict(top_k=0, top_p=1.0, min_p=0.0, temp=1.0)

# name, vocab size (0: the DRY vocabulary's first 1100 ids), steps, params, history
CASES = [
    ("dist_seed_0", 200, 6, dict(seed=0), []),
    ("dist_seed_42_open", 200, 6, dict(OPEN, seed=42, top_k=40), []),
    ("dist_seed_123456_n400", 400, 6, dict(seed=123456, temp=1.3), []),
    ("logit_bias_ids_and_ban", 200, 4,
     dict(OPEN, top_k=20, seed=7, logit_bias=[[3, 5.0], [17, -2.5], [12, float("-inf")], [3, 1.0]]), []),
    ("logit_bias_pushes_into_top_k", 200, 3,
     dict(seed=8, logit_bias=[[150, 12.0], [151, 9.0]]), []),
    ("top_n_sigma_1", 200, 4, dict(OPEN, top_n_sigma=1.0, seed=3, top_k=50), []),
    ("top_n_sigma_0_5_default_chain", 400, 4, dict(top_n_sigma=0.5, seed=4), []),
    ("top_n_sigma_2_hot", 200, 3, dict(top_n_sigma=2.0, temp=1.5, seed=5), []),
    ("xtc_always", 200, 5, dict(xtc_probability=1.0, xtc_threshold=0.05, seed=11), []),
    ("xtc_half", 200, 8, dict(xtc_probability=0.5, xtc_threshold=0.1, seed=12, top_k=20), []),
    ("xtc_min_keep", 200, 4,
     dict(xtc_probability=1.0, xtc_threshold=0.02, min_keep=8, seed=13, top_k=10), []),
    ("dynatemp_range_0_5", 200, 3, dict(dynatemp_range=0.5, seed=21), []),
    ("dynatemp_range_1_5_exp_2", 200, 3,
     dict(dynatemp_range=1.5, dynatemp_exponent=2.0, seed=22, top_k=60), []),
    ("dynatemp_temp_0", 200, 3, dict(temp=0.0, dynatemp_range=0.6, seed=23), []),
    ("mirostat_v1", 400, 10, dict(mirostat=1, mirostat_tau=5.0, mirostat_eta=0.1, seed=31), []),
    ("mirostat_v1_low_tau", 200, 10,
     dict(mirostat=1, mirostat_tau=2.0, mirostat_eta=0.5, temp=0.7, seed=32), []),
    ("mirostat_v2", 400, 10, dict(mirostat=2, mirostat_tau=5.0, mirostat_eta=0.1, seed=33), []),
    ("mirostat_v2_low_tau_biased", 200, 10,
     dict(mirostat=2, mirostat_tau=1.5, mirostat_eta=0.3, seed=34, logit_bias=[[5, 3.0]]), []),
    ("adaptive_p", 200, 10,
     dict(adaptive_target=0.3, adaptive_decay=0.9, seed=41, top_k=30,
          samplers=["top_k", "min_p", "temperature", "adaptive_p"]), []),
    ("adaptive_p_low_decay", 400, 10,
     dict(adaptive_target=0.1, adaptive_decay=0.5, seed=42, top_k=50,
          samplers=["penalties", "top_k", "top_p", "temperature", "adaptive_p"]), []),
    ("adaptive_p_off_target", 200, 6,
     dict(adaptive_target=-1.0, seed=43, samplers=["top_k", "temperature", "adaptive_p"]), []),
    ("order_temperature_first", 200, 4,
     dict(seed=51, temp=1.8, min_p=0.1, samplers=["temperature", "top_k", "min_p"]), []),
    ("order_top_p_before_top_k", 200, 4,
     dict(seed=52, top_p=0.8, top_k=5, samplers=["top_p", "top_k", "temperature"]), []),
    ("order_xtc_first_then_sigma", 200, 4,
     dict(seed=53, xtc_probability=1.0, xtc_threshold=0.01, top_n_sigma=1.5, top_k=0,
          samplers=["xtc", "top_n_sigma", "temperature"]), []),
    ("dry_default_breakers", 0, 6,
     dict(dry_multiplier=0.8, seed=61, top_k=100, top_p=1.0, min_p=0.0, temp=1.0), "repeats"),
    ("dry_long_repeat_big_base", 0, 4,
     dict(dry_multiplier=1.0, dry_base=3.0, dry_allowed_length=1, seed=62, top_k=40, top_p=1.0,
          min_p=0.0, temp=1.0), "long"),
    ("dry_breaker_in_history", 0, 4,
     dict(dry_multiplier=2.0, seed=63, top_k=40, top_p=1.0, min_p=0.0, temp=1.0), "breaker"),
    ("dry_custom_breakers", 0, 4,
     dict(dry_multiplier=1.5, dry_base=1.5, seed=64, top_k=40, top_p=1.0, min_p=0.0, temp=1.0,
          dry_sequence_breakers=["a\":", "the"]), "tail"),
    ("dry_breaker_continues_the_repeat", 0, 3,
     dict(dry_multiplier=1.0, seed=67, top_k=40, top_p=1.0, min_p=0.0, temp=1.0), "breaker_next"),
    ("dry_short_window", 0, 4,
     dict(dry_multiplier=1.0, dry_penalty_last_n=8, seed=65, top_k=40, top_p=1.0, min_p=0.0,
          temp=1.0), "repeats"),
    ("dry_with_penalties_default_chain", 0, 5,
     dict(dry_multiplier=0.8, penalty_repeat=1.2, seed=66, temp=1.0), "repeats"),
]

DRY_N = 1100


def dry_history(kind, rng):
    words = [int(x) for x in rng.integers(300, 600, size=6)]
    if kind == "repeats":
        return words + [700, 701] + words[:4] + [702] + words[:5]
    if kind == "long":
        return words * 3 + words[:3]
    if kind == "breaker":
        # the repeat crosses a newline (107) and a colon (296), which cut it
        return words[:3] + [107] + words + [900] + words[:2] + [296] + words[:4]
    if kind == "tail":
        # `ra` (601) then `":` (1083) spell the breaker `a":` as a head and a one-token tail:
        # the repeat at the end may reach back only to just after it
        a = words[:2] + [601, 1083] + words[2:4]
        return a + [words[4], 900, 901] + a
    if kind == "breaker_next":
        # the token that would continue the repeat is `:` (296), a breaker on its own: no penalty
        return words[:3] + [296] + words[3:6] + [902] + words[:3]
    raise ValueError(kind)


class Vocab:
    def __init__(self, path):
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.vocab_only = True
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        self.vocab = L.llama_model_get_vocab(self.model)

    def piece(self, i):
        buf = ctypes.create_string_buffer(512)
        toks = (L.llama_token * 1)(i)
        n = L.llama_detokenize(self.vocab, toks, 1, buf, 512, False, True)
        return buf.raw[:n]

    def tokenize(self, text):
        b = text.encode()
        out = (L.llama_token * 256)()
        n = L.llama_tokenize(self.vocab, b, len(b), out, 256, False, False)
        return [out[i] for i in range(n)]


def build(p, n_vocab, vocab):
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    add = lambda s: L.llama_sampler_chain_add(chain, s)
    if p["logit_bias"]:
        arr = (L.llama_logit_bias * len(p["logit_bias"]))(
            *[L.llama_logit_bias(int(t), float(b)) for t, b in p["logit_bias"]])
        add(L.llama_sampler_init_logit_bias(n_vocab, len(p["logit_bias"]), arr))
    if p["mirostat"] == 0:
        for st in p["samplers"]:
            if st == "penalties":
                add(L.llama_sampler_init_penalties(n_vocab, p["penalty_last_n"], p["penalty_repeat"],
                                                   p["penalty_freq"], p["penalty_present"]))
            elif st == "dry":
                br = [s.encode() for s in p["dry_sequence_breakers"]]
                c_br = (ctypes.c_char_p * len(br))(*br)
                add(L.llama_sampler_init_dry(vocab.vocab if vocab else None, p["dry_multiplier"],
                                             p["dry_base"], p["dry_allowed_length"],
                                             p["dry_penalty_last_n"], c_br, len(br)))
            elif st == "top_n_sigma":
                add(L.llama_sampler_init_top_n_sigma(p["top_n_sigma"]))
            elif st == "top_k":
                add(L.llama_sampler_init_top_k(p["top_k"]))
            elif st == "typ_p":
                add(L.llama_sampler_init_typical(p["typ_p"], p["min_keep"]))
            elif st == "top_p":
                add(L.llama_sampler_init_top_p(p["top_p"], p["min_keep"]))
            elif st == "min_p":
                add(L.llama_sampler_init_min_p(p["min_p"], p["min_keep"]))
            elif st == "xtc":
                add(L.llama_sampler_init_xtc(p["xtc_probability"], p["xtc_threshold"],
                                             p["min_keep"], p["seed"]))
            elif st == "temperature":
                add(L.llama_sampler_init_temp_ext(p["temp"], p["dynatemp_range"],
                                                  p["dynatemp_exponent"]))
            elif st == "adaptive_p":
                pass
            else:
                raise ValueError(st)
        if "adaptive_p" in p["samplers"]:
            add(L.llama_sampler_init_adaptive_p(p["adaptive_target"], p["adaptive_decay"], p["seed"]))
        else:
            add(L.llama_sampler_init_dist(p["seed"]))
    elif p["mirostat"] == 1:
        add(L.llama_sampler_init_temp(p["temp"]))
        add(L.llama_sampler_init_mirostat(n_vocab, p["seed"], p["mirostat_tau"], p["mirostat_eta"], 100))
    else:
        add(L.llama_sampler_init_temp(p["temp"]))
        add(L.llama_sampler_init_mirostat_v2(p["seed"], p["mirostat_tau"], p["mirostat_eta"]))
    return chain


def f32(x):
    """The shortest decimal that reads back as the same float32."""
    return float(str(np.float32(x)))


def step(chain, logits):
    n = len(logits)
    data = (L.llama_token_data * n)(*[L.llama_token_data(i, float(x), 0.0) for i, x in enumerate(logits)])
    arr = L.llama_token_data_array(data, n, -1, False)
    L.llama_sampler_apply(chain, ctypes.byref(arr))
    cur = [(arr.data[i].id, arr.data[i].p) for i in range(arr.size)]
    selected = arr.data[arr.selected].id
    kept = sorted([c for c in cur if c[1] > 0.0], key=lambda x: (-x[1], x[0]))
    return kept, selected


def tails(vocab, breakers):
    """llama.cpp's tokenization of every proper tail of every breaker (cut to 40 bytes)."""
    out = {}
    for b in breakers:
        b = b.encode()[:40]
        for k in range(1, len(b)):
            s = b[k:].decode("utf-8", errors="replace")
            out[s] = vocab.tokenize(s)
    return out


def main(gguf, out):
    vocab = Vocab(gguf)
    rng = np.random.default_rng(20261206)
    cases = []
    for name, n_vocab, steps, over, history in CASES:
        p = dict(DEFAULTS, **over)
        dry = None
        if n_vocab == 0:
            n_vocab = DRY_N
            history = dry_history(history, rng)
            dry = dict(tails=tails(vocab, p["dry_sequence_breakers"]))
        chain = build(p, n_vocab, vocab if dry else None)
        for t in history:
            L.llama_sampler_accept(chain, t)
        recorded = []
        for _ in range(steps):
            logits = (rng.standard_normal(n_vocab) * 3.0).astype(np.float32)
            if dry:
                # the history's tokens are likely, and the tokens that would continue a repeat
                # of its end most likely, so DRY bites
                for t in set(history):
                    logits[t] += 4.0
                for j in range(len(history) - 1):
                    if history[j] == history[-1]:
                        logits[history[j + 1]] += 9.0
            kept, selected = step(chain, logits)
            L.llama_sampler_accept(chain, selected)
            if dry:
                history = history + [selected]
            recorded.append(dict(
                logits=[f32(x) for x in logits],
                ids=[k[0] for k in kept], probs=[f32(k[1]) for k in kept],
                selected=selected,
            ))
        L.llama_sampler_free(chain)
        lb = [[t, b if np.isfinite(b) else "-inf"] for t, b in p["logit_bias"]]
        cases.append(dict(name=name, n_vocab=n_vocab, params=dict(p, logit_bias=lb),
                          history=history[:len(history) - steps] if dry else history,
                          dry=dry, steps=recorded))
        print(f"{name:36} steps {steps} kept {[len(s['ids']) for s in recorded]}")
    meta = dict(llama_cpp_python=L.__version__, dry_vocab="gemma-3-270m-q4_k_m.gguf",
                dry_pieces=[list(vocab.piece(i)) for i in range(DRY_N)])
    with open(out, "w") as f:
        json.dump(dict(meta=meta, cases=cases), f, separators=(",", ":"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
