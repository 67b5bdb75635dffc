#!/usr/bin/env python3
"""Prompt-cache check and time to first token against a running `bloomery serve` (or
llama-server); scripts/server_bench.py measures concurrent streams.

  python3 scripts/prompt_cache_bench.py --url http://127.0.0.1:8080 --slots 4 [--vocab N] [--prefix 4000] [--checkpoints]

1. Prompt cache, exactness: a follow-up turn whose prefix the slot still holds, and the same turn
   after other requests overwrote every slot (so the prefix comes back from host RAM), must give
   the same greedy tokens, and `timings.cache_n` must count the restored prefix (`--checkpoints`,
   for models with recurrent state, which restore to a checkpoint: the same count both times,
   above zero and short of the follow-up).
2. Time to first token for a follow-up whose `--prefix`-token prefix is restored from the prompt
   cache, against the same request with `cache_prompt: false`.

Needs only `requests`. Exits non-zero when a check fails.
"""
import argparse
import random
import sys

import requests


def tok(rng, vocab):
    """A random token id, clear of the special ids at the ends of small vocabularies."""
    return rng.randrange(1000 if vocab > 2000 else 1, vocab - 8)


def complete(url, prompt, n, **extra):
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "return_tokens": True, **extra}
    r = requests.post(url + "/completion", json=body, timeout=600)
    if r.status_code != 200:
        sys.exit(f"/completion with a {len(prompt)}-token prompt: {r.status_code} {r.text}")
    return r.json()


def fill_slots(url, slots, rng, vocab):
    """Overwrites every slot with an unrelated short request."""
    for s in range(slots):
        complete(url, [tok(rng, vocab) for _ in range(24)], 1, id_slot=s)


def check_cache(url, slots, rng, vocab, n_prefix, checkpoints):
    prefix = [tok(rng, vocab) for _ in range(n_prefix)]
    first = complete(url, prefix, 4, id_slot=0)
    follow = prefix + first["tokens"] + [tok(rng, vocab) for _ in range(50)]
    complete(url, follow, 16, id_slot=0)
    # The slot holds all of `follow` but its last token: only that token is evaluated.
    held = complete(url, follow, 16, id_slot=0)
    fill_slots(url, slots, rng, vocab)
    # Every slot was overwritten: the same prefix now comes from host RAM.
    restored = complete(url, follow, 16, id_slot=0)
    fill_slots(url, slots, rng, vocab)
    cold = complete(url, follow, 16, id_slot=0, cache_prompt=False)
    n = len(follow) - 1
    held_n, restored_n = held["timings"]["cache_n"], restored["timings"]["cache_n"]
    counted = 0 < held_n == restored_n <= n if checkpoints else held_n == restored_n == n
    ok = restored["tokens"] == held["tokens"] and counted
    print(f"prompt cache: {len(follow)}-token follow-up; cache_n slot-held {held['timings']['cache_n']}, "
          f"restored from RAM {restored['timings']['cache_n']}; restored tokens equal slot-held: "
          f"{restored['tokens'] == held['tokens']}; not-cached tokens equal: {cold['tokens'] == held['tokens']} "
          f"(a batched prompt agrees within tolerance only)")
    print(f"time to first token: first turn ({len(prefix)} tokens) {first['timings']['prompt_ms']:.1f} ms; "
          f"follow-up ({len(follow)} tokens) restored from RAM {restored['timings']['prompt_ms']:.1f} ms, "
          f"held by the slot {held['timings']['prompt_ms']:.1f} ms, "
          f"not cached {cold['timings']['prompt_ms']:.1f} ms")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=151000)
    ap.add_argument("--prefix", type=int, default=4000)
    ap.add_argument("--checkpoints", action="store_true",
                    help="the model restores recurrent state from checkpoints")
    a = ap.parse_args()
    rng = random.Random(7)
    ok = check_cache(a.url, a.slots, rng, a.vocab, a.prefix, a.checkpoints)
    if not ok:
        print("FAIL: the restored prefix changed the tokens or was not counted", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
