#!/usr/bin/env python3
"""Compares /v1/systemone answers of servers on the same clef file: every probability of every
answer within --tol of the first server's (the reference, e.g. the CPU run), the same answers and
prompt lengths. Prints one line per server; exits 1 on a difference. Stdlib only.

usage: systemone_check.py [--tol 1e-4] REF_URL URL [URL ...]
"""

import argparse
import json
import sys
import urllib.request

REQUESTS = [
    {
        "state": "I was charged twice for my order last week and nobody has replied.",
        "questions": {
            "route": {
                "type": "choice",
                "instructions": "Which team should handle this?",
                "criteria": {"billing": "payments and refunds", "shipping": None, "technical": None},
            },
            "urgency": {
                "type": "score",
                "instructions": "How urgent is this?",
                "criteria": ["can wait", "this week", "today", "right now"],
            },
            "angry": {"type": "noul", "instructions": "Is the customer angry?"},
        },
    },
    {
        "state": {"order": 1234, "items": ["lamp", "cable"], "note": "the lamp arrived broken"},
        "questions": {
            "refund": {"type": "noul", "instructions": "Should we refund the lamp?"},
            "team": {
                "type": "choice",
                "instructions": "Who takes it?",
                "criteria": {"a": "returns", "b": "quality", "c": None, "d": "sales", "e": None},
            },
        },
    },
]


def answers(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url.rstrip("/") + "/v1/systemone",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def probabilities(res: dict) -> list:
    """Every answer's probabilities in order (a noul answer has none)."""
    out = []
    for a in res["answers"].values():
        p = a.get("probabilities", {})
        out.extend(p.values() if isinstance(p, dict) else p)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("urls", nargs="+")
    a = p.parse_args()
    if len(a.urls) < 2:
        p.error("give the reference and at least one other server")
    ref = [answers(a.urls[0], r) for r in REQUESTS]
    bad = 0
    for url in a.urls[1:]:
        worst, problems = 0.0, []
        for i, (body, want) in enumerate(zip(REQUESTS, ref)):
            got = answers(url, body)
            if got["usage"]["input_tokens"] != want["usage"]["input_tokens"]:
                problems.append(f"request {i}: {got['usage']['input_tokens']} prompt tokens, "
                                f"reference {want['usage']['input_tokens']}")
            if list(got["answers"]) != list(want["answers"]):
                problems.append(f"request {i}: answers {list(got['answers'])}")
                continue
            pg, pw = probabilities(got), probabilities(want)
            if len(pg) != len(pw):
                problems.append(f"request {i}: {len(pg)} probabilities, reference {len(pw)}")
                continue
            worst = max([worst] + [abs(x - y) for x, y in zip(pg, pw)])
        ok = not problems and worst <= a.tol
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {url}: max |dp| {worst:.2e} against {a.urls[0]} (tol {a.tol:.0e})"
              + ("; " + "; ".join(problems) if problems else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
