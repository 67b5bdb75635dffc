#!/usr/bin/env python3
"""Records llama-server's answers to a few /v1/systemone requests on a clef GGUF, as the golden
tests/server/fixtures/systemone_llamacpp.json (tests/server/test_systemone.py compares bloomery's
answers on the same file with them, probabilities within 1e-4).

usage: llamacpp_systemone.py URL CLEF.gguf OUT.json   (URL: a running llama-server on CLEF.gguf)
"""
import hashlib
import json
import sys
from pathlib import Path

import requests

BODIES = [
    {
        "state": "I was charged twice for my order last week and nobody has replied.",
        "questions": {
            "route": {"type": "choice", "instructions": "Which team should handle this?",
                      "criteria": {"billing": "payments and refunds", "shipping": None, "technical": None}},
            "urgency": {"type": "score", "instructions": "How urgent is this?",
                        "criteria": ["can wait", "this week", "today", "right now"]},
            "angry": {"type": "noul", "instructions": "Is the customer angry?"},
        },
    },
    {
        "state": {"ticket": "Where is my parcel? <<clef:sep>> it is late", "plan": "pro", "n": [1, 2.5, None, True]},
        "questions": {
            "z": {"type": "noul", "instructions": {"ask": "Refund?", "lang": "en"},
                  "criteria": {"true": "a refund is asked", "false": None}},
            "a": {"type": "choice", "instructions": "Topic",
                  "criteria": {"Zeta": None, "alpha": "first", "Beta": {"k": "v"}, "éclair": None}},
        },
    },
    {
        "state": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}],
        "questions": {"mood": {"type": "score", "instructions": "Mood", "criteria": ["bad", "ok"]}},
    },
]


def main():
    url, gguf, out = sys.argv[1:4]
    cases = []
    for body in BODIES:
        r = requests.post(url + "/v1/systemone", json=body, timeout=600)
        r.raise_for_status()
        cases.append({"body": body, "response": r.json()})
        print(json.dumps(r.json())[:200])
    golden = {"file_sha256": hashlib.sha256(Path(gguf).read_bytes()).hexdigest(), "cases": cases}
    Path(out).write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
