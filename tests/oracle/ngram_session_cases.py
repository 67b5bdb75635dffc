"""Sessions for tests/oracle/ngram_session_dump.cpp: one or two sequences whose prompts repeat
pieces of themselves and whose "truth" (what the target samples) copies spans of the prompt with
changes, so drafts are made, kept in part and refused; for ngram-simple and ngram-mod (short
n_match, so chains form). Deterministic (seeded)."""
import random

rng = random.Random(4848)


def text(n, alphabet):
    out = [rng.randrange(alphabet) for _ in range(n // 3)]
    while len(out) < n:
        if rng.random() < 0.6 and len(out) > 8:
            a = rng.randrange(len(out) - 4)
            out += out[a:a + rng.randrange(4, 24)]
        else:
            out.append(rng.randrange(alphabet))
    return out[:n]


def truth_after(prompt, n, alphabet):
    out = []
    while len(out) < n:
        if rng.random() < 0.7:
            a = rng.randrange(len(prompt) - 4)
            span = prompt[a:a + rng.randrange(4, 40)]
            # A change now and then, so some drafts are refused part way.
            span = [t if rng.random() > 0.05 else rng.randrange(alphabet) for t in span]
            out += span
        else:
            out.append(rng.randrange(alphabet))
    return out[:n]


lines = []
heads = ["simple 1 4", "simple 2 8", "simple 3 16", "mod 1 8 0", "mod 2 16 4", "mod 3 64 8",
         "mod 4 12 12", "mod 2 0 0", "mod 24 64 48"]
for head in heads:
    for _ in range(12):
        alphabet = rng.choice([4, 16, 300])
        seqs = []
        for _ in range(rng.choice([1, 2])):
            prompt = text(rng.randrange(30, 400), alphabet)
            seqs.append(" ".join(map(str, prompt)) + " | " + " ".join(map(str, truth_after(prompt, rng.randrange(10, 200), alphabet))))
        lines.append(head + " ; " + " ; ".join(seqs))
print("\n".join(lines))
