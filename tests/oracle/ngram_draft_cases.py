"""Cases for tests/oracle/ngram_draft_dump.cpp: token histories with repeats (a small alphabet, so
n-grams recur), copied spans, and edge lengths around size_n + size_m + 1; one line each,
"SIZE_N SIZE_M SAMPLED T0 T1 ...". Deterministic (seeded)."""
import random

rng = random.Random(48)
out = []
for size_n, size_m in [(1, 1), (1, 4), (2, 3), (3, 8), (4, 16), (12, 48), (2, 1024)]:
    for _ in range(40):
        kind = rng.randrange(3)
        alphabet = rng.choice([2, 3, 5, 50])
        length = rng.randrange(0, 160)
        hist = [rng.randrange(alphabet) for _ in range(length)]
        if kind == 1 and length > 20:
            # A copied span: the history repeats a piece of itself at its end.
            a = rng.randrange(length // 2)
            b = rng.randrange(a + 1, length)
            hist += hist[a:b]
        if kind == 2:
            # Edge lengths around the minimum the lookup needs.
            hist = hist[: size_n + size_m + rng.randrange(-1, 3)]
        sampled = rng.choice(hist) if hist and rng.random() < 0.8 else rng.randrange(alphabet + 1)
        out.append(" ".join(str(x) for x in [size_n, size_m, sampled] + hist))
print("\n".join(out))
