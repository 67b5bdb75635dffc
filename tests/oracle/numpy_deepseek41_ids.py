#!/usr/bin/env python3
"""Golden Engram row ids of a `deepseek41` GGUF file (issue 49, V4.1), in integer numpy, read from
the file's own `deepseek41.engram.*` keys with the `gguf` package, as a JSON file.

The hash is DeepSeek's Engram reference (`deepseek-ai/Engram`, `engram_demo_v1.py`,
`NgramHashMapping`), as `tests/oracle/numpy_engram.py` states it: raw ids map through
`token_map`; the context of position t is the mapped ids of t, t-1, ..., newest first, a position
before the sequence start reading as `pad_id`; for each n-gram size n = 2..max_ngram_size the mix
is XOR_{k<n} ctx_k * multiplier_k in int64, and each of that size's `head_count` heads reads row
`mix % prime + offset`. The array layouts are docs/deepseek41-plan.md's Choice: per Engram site
(the layers carrying `blk.N.engram_embd`, in order), `max_ngram_size` multipliers and
`(max_ngram_size - 1) * head_count` primes and offsets, site after site. The ids of one token are
site after site, head after head.

The token sequence: every raw id that maps to the pad id, repeats, and the vocabulary's ends.

usage: numpy_deepseek41_ids.py TINY.gguf OUT.json
  (TINY.gguf from `bloomery synth --arch deepseek41 --preset tiny`; its constants do not depend
  on the seed)
"""
import json
import sys

import gguf
import numpy as np


def field(reader, key):
    f = reader.fields[key]
    vals = [f.parts[i].tolist() for i in f.data]
    return [v[0] if isinstance(v, list) else v for v in vals]


def site_ids(tokens, token_map, pad, mult, primes, offsets, max_ngram, heads):
    """[T] raw ids -> [T, (max_ngram-1)*heads] row ids of one site."""
    x = token_map[np.asarray(tokens, dtype=np.int64)]
    t = len(x)
    ctx = [np.concatenate([np.full(k, pad, dtype=np.int64), x[: t - k]]) for k in range(max_ngram)]
    cols = []
    for n in range(2, max_ngram + 1):
        mix = np.zeros(t, dtype=np.int64)
        for k in range(n):
            mix = np.bitwise_xor(mix, ctx[k] * np.int64(mult[k]))
        assert (mix >= 0).all()
        for j in range(heads):
            c = (n - 2) * heads + j
            cols.append(mix % np.int64(primes[c]) + np.int64(offsets[c]))
    return np.stack(cols, axis=1)


def main():
    src, out = sys.argv[1], sys.argv[2]
    r = gguf.GGUFReader(src)
    k = "deepseek41.engram."
    max_ngram = field(r, k + "max_ngram_size")[0]
    heads = field(r, k + "head_count")[0]
    pad = field(r, k + "pad_id")[0]
    token_map = np.array(field(r, k + "token_map"), dtype=np.int64)
    mult = field(r, k + "multipliers")
    primes = field(r, k + "primes")
    offsets = field(r, k + "offsets")
    n_layer = field(r, "deepseek41.block_count")[0]
    names = {t.name for t in r.tensors}
    sites = [il for il in range(n_layer) if f"blk.{il}.engram_embd.weight" in names]
    per = (max_ngram - 1) * heads
    vocab = len(token_map)
    pads = [int(t) for t in np.nonzero(token_map == pad)[0]]
    tokens = [5, 300, 7, 7, 1] + pads + [0, vocab - 1, 42, 42, 42, 9] + pads[:1] + [3, 319, 2]
    ids = np.concatenate(
        [
            site_ids(
                tokens,
                token_map,
                pad,
                mult[s * max_ngram : (s + 1) * max_ngram],
                primes[s * per : (s + 1) * per],
                offsets[s * per : (s + 1) * per],
                max_ngram,
                heads,
            )
            for s in range(len(sites))
        ],
        axis=1,
    )
    with open(out, "w") as f:
        json.dump(
            {
                "source": "tests/oracle/numpy_deepseek41_ids.py on synth --arch deepseek41 --preset tiny",
                "sites": sites,
                "pads": pads,
                "tokens": tokens,
                "ids": [[int(v) for v in row] for row in ids],
            },
            f,
            indent=1,
        )
        f.write("\n")


if __name__ == "__main__":
    main()
