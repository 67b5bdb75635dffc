#!/usr/bin/env python3
"""Golden outputs of the k-pool DSA indexer op (`Op::KPoolSelect`, GLM-5.3's indexer), in float64
numpy, as a JSON file.

Written from the op's definition in plugin-api/src/op.rs, which was checked against llama.cpp
b11434 (`src/models/glm5-next.cpp` `build_kpool_select`, `src/llama-memory-hybrid-idx.cpp`
`set_input_kpool`) and transformers 5.24 `glm5_next` (`Glm5NextTextIndexer`):

  * cache rows are [key | gate | pooled], dh values each, row `position` of the row's slot;
  * pool g is positions g*kpool .. g*kpool + kpool - 1; its pooled key is, per dimension d,
    sum_t softmax_t(gate[t, d] + ape[d, t]) * key[t, d] (softmax over the pool's positions);
  * a row at position p scores each complete pool (g*kpool + kpool - 1 <= p) as
    sum_h w[h] * relu(q_h . pooled_g), keeps the min(n_top, complete) best (ties: lower pool),
    lists them in descending score order, each pool's positions ascending, -1 up to kpool*n_top;
    with `tail` then the (p + 1) % kpool positions after the last complete pool, ascending, -1 up
    to n_sel = kpool*n_top + kpool - 1.

Inputs are not stored: every tensor is drawn from splitmix64 streams that the Rust tests
reproduce (`draw` below; values are multiples of 2^-23 in [-a, a), exact in f32).

With --check-transformers it also runs transformers' own `Glm5NextTextIndexer` on random hidden
states (one sequence, no cache) and compares its selection, entry by entry, with this reference
fed the indexer's own q, k, gate and weights.

usage: numpy_kpool.py OUT.json [--check-transformers]
"""
import json
import sys

import numpy as np

MASK = (1 << 64) - 1


def draw(seed, n, a):
    """n values from the splitmix64 stream of `seed`: ((z >> 40) / 2^23 - 1) * a, a a power of 2."""
    out = np.empty(n, dtype=np.float64)
    state = seed & MASK
    for i in range(n):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        out[i] = ((z >> 40) / float(1 << 23) - 1.0) * a
    return out


def pooled_key(key, gate, ape):
    """key, gate [kpool, dh]; ape [kpool, dh] (ape[t, d] = the GGUF's ape[d, t]) -> [dh]."""
    logits = gate + ape
    logits = logits - logits.max(axis=0, keepdims=True)
    e = np.exp(logits)
    p = e / e.sum(axis=0, keepdims=True)
    return (p * key).sum(axis=0)


def select(q, w, pooled, p, kpool, n_top, tail):
    """One row: q [n_head, dh], w [n_head], pooled [n_pools, dh] of its slot -> (sel, scores)."""
    complete = (p + 1) // kpool
    scores = np.array([np.sum(w * np.maximum(q @ pooled[g], 0.0)) for g in range(complete)])
    # Ranked as f32 values, ties to the lower pool.
    ranked = sorted(range(complete), key=lambda g: (-np.float32(scores[g]), g))[: min(n_top, complete)]
    sel = []
    for g in ranked:
        sel.extend(range(g * kpool, g * kpool + kpool))
    sel += [-1] * (kpool * n_top - len(sel))
    if tail:
        n_tail = (p + 1) % kpool
        t = list(range(p + 1 - n_tail, p + 1))
        sel += t + [-1] * (kpool - 1 - len(t))
    return sel, scores


def short(x):
    """x to 12 significant digits (the tests compare within 1e-6)."""
    return float(f"{x:.12g}")


def run_case(c):
    dh, n_head, kpool, n_top, tail = c["head_dim"], c["n_head"], c["kpool"], c["n_top"], c["tail"]
    slots, positions = c["slots"], c["positions"]
    n_slots, length, rows = c["n_slots"], c["len"], len(slots)
    s = c["seed"]
    q = draw(s + 1, dh * n_head * rows, 1.0).reshape(rows, n_head, dh)
    w = draw(s + 2, n_head * rows, 1.0).reshape(rows, n_head)
    cache = draw(s + 3, 3 * dh * length * n_slots, 2.0).reshape(n_slots, length, 3, dh)
    ape = draw(s + 4, dh * kpool, 1.0).reshape(kpool, dh)
    # Every pool of every slot, as the call completes them (a test's call holds each slot's rows
    # from position 0).
    pooled = {}
    for slot in range(n_slots):
        top = max([p for sl, p in zip(slots, positions) if sl == slot], default=-1)
        n_pools = (top + 1) // kpool
        pooled[slot] = np.array(
            [pooled_key(cache[slot, g * kpool:(g + 1) * kpool, 0], cache[slot, g * kpool:(g + 1) * kpool, 1], ape)
             for g in range(n_pools)]
        ).reshape(n_pools, dh)
    sel, scores = [], []
    for r in range(rows):
        o, sc = select(q[r], w[r], pooled[slots[r]], positions[r], kpool, n_top, tail)
        sel.append(o)
        scores.append([short(x) for x in sc])
    return {
        **c,
        "n_sel": kpool * n_top + (kpool - 1 if tail else 0),
        "selected": sel,
        "scores": scores,
        "pooled": {str(k): [[short(x) for x in row] for row in v] for k, v in pooled.items()},
    }


def cases():
    def interleave(lengths):
        """Rows of several slots, each from position 0, interleaved slot by slot."""
        slots, positions = [], []
        for p in range(max(lengths)):
            for slot, n in enumerate(lengths):
                if p < n:
                    slots.append(slot)
                    positions.append(p)
        return slots, positions

    out = []
    # top_k 8: dense below position 11 (top_k + kpool - 1), sparse from there.
    s, p = interleave([30, 21])
    out.append(dict(name="top_k 8, tail, 32 heads, 2 slots", seed=100, head_dim=128, n_head=32, kpool=4,
                    n_top=2, tail=True, n_slots=2, len=32, slots=s, positions=p))
    s, p = interleave([50, 37, 9])
    out.append(dict(name="top_k 16, tail, 32 heads, 3 slots", seed=200, head_dim=128, n_head=32, kpool=4,
                    n_top=4, tail=True, n_slots=3, len=64, slots=s, positions=p))
    s, p = interleave([44, 26])
    out.append(dict(name="top_k 16, no tail, 8 heads, 2 slots", seed=300, head_dim=128, n_head=8, kpool=4,
                    n_top=4, tail=False, n_slots=2, len=48, slots=s, positions=p))
    s, p = interleave([33])
    out.append(dict(name="top_k 8, no tail, 4 heads, 1 slot", seed=400, head_dim=128, n_head=4, kpool=4,
                    n_top=2, tail=False, n_slots=1, len=40, slots=s, positions=p))
    return out


def check_transformers():
    """transformers' indexer against `select` on random hidden states: selections equal."""
    import torch
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextIndexer

    torch.manual_seed(0)

    class Cfg:
        hidden_size = 64
        index_n_heads = 8
        index_head_dim = 32
        qk_rope_head_dim = 0
        index_topk = 16
        q_lora_rank = 48
        index_kpool = 4
        index_kpool_always_select_tail = True

    cfg = Cfg()
    for tail in (True, False):
        cfg.index_kpool_always_select_tail = tail
        m = Glm5NextTextIndexer(cfg, 0).double()
        with torch.no_grad():
            for prm in m.parameters():
                prm.copy_(torch.randn_like(prm) * 0.5)
        seq = 37
        x = torch.randn(1, seq, cfg.hidden_size, dtype=torch.float64)
        qr = torch.randn(1, seq, cfg.q_lora_rank, dtype=torch.float64)
        mask = torch.ones(1, seq, dtype=torch.bool)
        got = m(x, qr, mask, None)[0].numpy()
        with torch.no_grad():
            q = m.wq_b(qr).view(seq, cfg.index_n_heads, cfg.index_head_dim).numpy()
            k = m.k_norm(m.wk(x))[0].numpy()
            g = torch.nn.functional.linear(x, m.index_kpool_compress_gate)[0].numpy()
            w = (m.weights_proj(x)[0] * cfg.index_n_heads ** -0.5 * cfg.index_head_dim ** -0.5).numpy()
            ape = m.index_kpool_compress_ape.detach().numpy()
        kp = cfg.index_kpool
        pooled = np.array([pooled_key(k[j * kp:(j + 1) * kp], g[j * kp:(j + 1) * kp], ape) for j in range(seq // kp)])
        n_top = cfg.index_topk // kp
        for r in range(seq):
            want, _ = select(q[r], w[r], pooled, r, kp, n_top, tail)
            # 37 rows make 9 pools, more than n_top: transformers' layout is the op's, so the
            # lists agree entry by entry (pools in descending score order, the tail ascending).
            assert list(got[r]) == want, (tail, r, got[r], want)
        print(f"transformers Glm5NextTextIndexer (tail {tail}): {seq} rows, selections equal entry by entry")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if "--check-transformers" in sys.argv[2:]:
        check_transformers()
    result = {
        "reference": "tests/oracle/numpy_kpool.py (float64 numpy, from plugin-api's Op::KPoolSelect doc)",
        "generator": "splitmix64; tensor seeds: q seed+1 [dh, n_head, rows], w seed+2 [n_head, rows], "
                     "cache seed+3 [3*dh, len, n_slots] scale 2 (pooled sections ignored), ape seed+4 [dh, kpool]",
        "cases": [run_case(c) for c in cases()],
    }
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
