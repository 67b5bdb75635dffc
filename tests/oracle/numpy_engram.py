#!/usr/bin/env python3
"""Golden row ids and outputs of DeepSeek-V4.1-Flash's Engram (issue 49 item 6), in integer and
float64 numpy, as a JSON file. No engine runs V4.1, so this is written from the published math:

  * the hash: DeepSeek's Engram reference (`deepseek-ai/Engram`, `engram_demo_v1.py`,
    `NgramHashMapping`): token ids are mapped to the compressed vocabulary (`token_map`); for
    position t the context is the compressed ids of tokens t, t-1, t-2, t-3 (newest first), a
    position before the sequence start reading as the pad id (the demo pads its shifts with the
    compressed pad id); for each n-gram size n = 2..max_ngram the mix is
    XOR_{k<n} ctx_k * multipliers[k] in int64 (the multipliers are odd and below
    int64_max // compressed_vocab, so no product overflows), and each of that size's heads reads
    row `mix % prime + offset`, offset being the sum of the earlier heads' primes (the demo's
    `MultiHeadEmbedding` offsets); the demo's constants: multipliers r*2+1 with r drawn by
    `np.random.default_rng(seed + 10007*layer)` below `(int64_max // compressed_vocab) // 2`,
    primes the next unused primes above each n-gram size's table size, heads in order;
  * the gated read: the 24 rows of a site flattened head after head (24·D values) go through
    `engram_wkv` to hc keys and one value (`[key_0 | .. | key_{hc-1} | value]`, each n_embd
    wide); stream s adds gate_s·value, gate_s = sigmoid(sign(d)·sqrt(max(|d|, 1e-6))),
    d = sum(rms(h_s)·q_norm[s]·k_norm[s]·rms(key_s)) / sqrt(n_embd), rms(x) = x / sqrt(mean(x²) +
    eps) (the demo's per-stream norm1/norm2 with their weights; V4.1 applies it with no short
    convolution, as issue 49 and ../shared/reference/seed-repo.md §1.3 state it).

No quantized-table or fp8 emulation: the table is f32 here.

The constants are V4.1's layout at tiny sizes: 2 sites (layers 1 and 14), max n-gram 4 (2-, 3- and
4-grams), 8 heads per size (24 rows per site), rows of D = 16 values (V4.1: 256), n_embd 32
(V4.1: 5120), 4 streams. The token sequence holds the raw ids that map to the pad id, repeats and
the vocabulary's ends. The constants come from numpy's default_rng(SEED) (stored in the JSON);
the float inputs are splitmix64 streams (`draw`, exact in f32, not stored: the Rust test draws
them); the outputs are float64.

usage: numpy_engram.py OUT.json
"""
import json
import sys

import numpy as np

SEED = 4141
VOCAB = 300  # raw vocabulary
MAX_NGRAM = 4
HEADS = 8
LAYERS = [1, 14]
TABLE_SIZES = [61, 67, 71]  # per n-gram size before the prime search (the demo's engram_vocab_size)
D = 16
N_EMBD = 32
HC = 4
EPS = 1e-6
FLOOR = 1e-6
T = 41


def is_prime(n):
    if n < 2:
        return False
    f = 2
    while f * f <= n:
        if n % f == 0:
            return False
        f += 1
    return True


def next_prime(start, seen):
    c = start + 1
    while not (is_prime(c) and c not in seen):
        c += 1
    return c


def constants(rng):
    # A compressed vocabulary of 180 ids: raw ids map onto it many-to-one, as the demo's
    # normalising tokenizer merges `apple` and ` apple`.
    compressed = 180
    token_map = rng.integers(0, compressed, size=VOCAB).astype(np.int64)
    token_map[:compressed] = np.arange(compressed)  # every compressed id is used
    rng.shuffle(token_map)
    raw_pad = 2
    pad = int(token_map[raw_pad])  # the demo maps its pad id through the lookup
    max_long = np.iinfo(np.int64).max
    half = max(1, (max_long // compressed) // 2)
    multipliers = {}
    for layer in LAYERS:
        g = np.random.default_rng(SEED + 10007 * layer)
        r = g.integers(low=0, high=half, size=(MAX_NGRAM,), dtype=np.int64)
        multipliers[layer] = r * 2 + 1
    seen, primes = set(), {}
    for layer in LAYERS:
        per = []
        for n in range(2, MAX_NGRAM + 1):
            start = TABLE_SIZES[n - 2] - 1
            for _ in range(HEADS):
                p = next_prime(start, seen)
                seen.add(p)
                per.append(p)
                start = p
        primes[layer] = np.array(per, dtype=np.int64)
    offsets = {l: np.concatenate([[0], np.cumsum(primes[l])[:-1]]).astype(np.int64) for l in LAYERS}
    return token_map, compressed, raw_pad, pad, multipliers, primes, offsets


def row_ids(tokens, token_map, pad, mult, primes, offsets):
    """[T] raw ids -> [T, (MAX_NGRAM-1)*HEADS] row ids of one site (the demo's shifts and mix)."""
    x = token_map[np.asarray(tokens, dtype=np.int64)][None, :]
    t = x.shape[1]
    shifts = [x] + [np.pad(x, ((0, 0), (k, 0)), constant_values=pad)[:, :t] for k in range(1, MAX_NGRAM)]
    cols = []
    for n in range(2, MAX_NGRAM + 1):
        mix = shifts[0] * mult[0]
        for k in range(1, n):
            mix = np.bitwise_xor(mix, shifts[k] * mult[k])
        assert (mix >= 0).all()
        for j in range(HEADS):
            c = (n - 2) * HEADS + j
            cols.append(mix % primes[c] + offsets[c])
    return np.stack(cols, axis=2)[0]


def rms(x):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS)


def gated_read(h, ids, table, wkv, q_norm, k_norm):
    """h [T, HC, N_EMBD], ids [T, 24] -> (new streams [T, HC, N_EMBD], gates [T, HC])."""
    emb = table[ids].reshape(ids.shape[0], -1)  # [T, 24*D], head after head
    kv = emb @ wkv.T  # wkv [(HC+1)*N_EMBD, 24*D]
    keys = kv[:, : HC * N_EMBD].reshape(-1, HC, N_EMBD)
    value = kv[:, HC * N_EMBD :]
    d = (rms(h) * (q_norm * k_norm)[None] * rms(keys)).sum(axis=-1) / np.sqrt(N_EMBD)
    signed = np.sign(d) * np.sqrt(np.maximum(np.abs(d), FLOOR))
    gate = 1.0 / (1.0 + np.exp(-signed))
    return h + gate[..., None] * value[:, None, :], gate


MASK = (1 << 64) - 1


def draw(seed, shape, a):
    """Values of the splitmix64 stream of `seed`: ((z >> 40) / 2^23 - 1) * a, a a power of 2, so
    exact in f32 (the stream of tests/oracle/numpy_kpool.py; the Rust test draws the same)."""
    n = int(np.prod(shape))
    out = np.empty(n, dtype=np.float64)
    state = seed & MASK
    for i in range(n):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        out[i] = ((z >> 40) / float(1 << 23) - 1.0) * a
    return out.reshape(shape)


def main(out):
    rng = np.random.default_rng(SEED)
    token_map, compressed, raw_pad, pad, mult, primes, offsets = constants(rng)
    tokens = rng.integers(0, VOCAB, size=T)
    # raw ids that map to the pad id, a repeat, the vocabulary's ends
    pads = np.nonzero(token_map == pad)[0]
    tokens[[3, 17]] = pads[0]
    tokens[18] = pads[-1]
    tokens[25:28] = tokens[10:13]
    tokens[30], tokens[31] = 0, VOCAB - 1
    sites = []
    for layer in LAYERS:
        ids = row_ids(tokens, token_map, pad, mult[layer], primes[layer], offsets[layer])
        rows = int(primes[layer].sum())
        base = 100 * layer
        table = draw(base + 1, (rows, D), 0.5)
        wkv = draw(base + 2, ((HC + 1) * N_EMBD, (MAX_NGRAM - 1) * HEADS * D), 0.0625)
        q_norm = draw(base + 3, (HC, N_EMBD), 2.0)
        k_norm = draw(base + 4, (HC, N_EMBD), 2.0)
        h = draw(base + 5, (T, HC, N_EMBD), 2.0)
        out_h, gate = gated_read(h, ids, table, wkv, q_norm, k_norm)
        # far from d = 0, where sign(0) = 0 (the demo's torch.sign) and copysign would differ
        assert np.abs(gate - 0.5).min() > 1e-3, np.abs(gate - 0.5).min()
        sites.append(
            {
                "layer": layer,
                "multipliers": [int(m) for m in mult[layer]],
                "primes": [int(p) for p in primes[layer]],
                "offsets": [int(o) for o in offsets[layer]],
                "rows": rows,
                "ids": ids.reshape(-1).tolist(),  # [T, 24] row-major: token after token
                # inputs (not stored): draw(100*layer + k, shape, a) with k, shape, a =
                # 1 table [rows, D] 0.5; 2 wkv [(HC+1)*N_EMBD, 24*D] (ggml [24*D, (HC+1)*N_EMBD])
                # 2^-4; 3 q_norm [HC, N_EMBD] 2; 4 k_norm 2; 5 h [T, HC, N_EMBD] 2
                "gate": gate.reshape(-1).tolist(),  # [T, HC]
                "out": [float(np.float32(v)) for v in out_h.reshape(-1)],  # f64 rounded to f32  # [T, HC, N_EMBD]
            }
        )
    doc = {
        "vocab": VOCAB,
        "compressed_vocab": compressed,
        "token_map": [int(v) for v in token_map],
        "raw_pad": raw_pad,
        "pad_id": pad,
        "max_ngram": MAX_NGRAM,
        "heads": HEADS,
        "d": D,
        "n_embd": N_EMBD,
        "hc": HC,
        "eps": EPS,
        "floor": FLOOR,
        "tokens": [int(t) for t in tokens],
        "sites": sites,
    }
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    gates = np.array([s["gate"] for s in sites])
    print(f"wrote {out}: {T} tokens, {len(sites)} sites, gate range {gates.min():.4f}..{gates.max():.4f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
