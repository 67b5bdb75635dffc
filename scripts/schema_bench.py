#!/usr/bin/env python3
"""Structured-output speed, the issue's benchmark: one JSON-schema answer (10 objects x 8 fixed
keys, enum and number values) from `bloomery serve` with schemajump on and off and from
llama-server, the same file, prompt, schema and greedy settings, measured the same way over HTTP
(answer time = the request's wall time; tokens/s from `timings`; "no pass" = the tokens generated
without a pass of their own: `timings.forced_n` (the grammar admitted only them) plus
`timings.draft_n_accepted` (drafted from the text the grammar fixes and confirmed by sampling), over
`predicted_n`; "drafted" = `draft_n_accepted` / `draft_n`). Every server of one file runs in the
same call; the answers of all bloomery servers must be the same tokens (checked: schemajump must
not change the output), so a row that differs stops the script.

Usage:
  scripts/schema_bench.py --bloomery dist/bloomery --plugins dist/plugins \\
      [--llama-server PATH] [--reps 3] [--n-predict 600] \\
      FILE[::FLAGS] ...
FLAGS are extra server flags for that file, shared by both servers where they make sense, e.g.
  synth-30b.gguf::-ngl 99            (every expert on the card)
  synth-30b.gguf::-ngl 99 -cmoe      (every expert on the host)
  gemma-3-270m-q4_k_m.gguf::         (the CPU)
Prints a markdown table for docs/performance.md.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

OBJ = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "kind": {"enum": ["alpha", "beta", "gamma"]},
        "score": {"type": "number"},
        "status": {"enum": ["active", "inactive", "pending"]},
        "weight": {"type": "number"},
        "level": {"enum": ["low", "medium", "high"]},
        "ratio": {"type": "number"},
        "flag": {"enum": ["yes", "no"]},
    },
    "required": ["id", "kind", "score", "status", "weight", "level", "ratio", "flag"],
    "additionalProperties": False,
}
SCHEMA = {"type": "array", "minItems": 10, "maxItems": 10, "items": OBJ}
PROMPT = "List ten inventory records as JSON.\n"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=600):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Server:
    def __init__(self, cmd, port):
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(f"/tmp/schema-bench-{port}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        start = time.time()
        while time.time() - start < 900:
            if self.proc.poll() is not None:
                sys.exit(f"{cmd[0]} exited: see {self.log.name}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        sys.exit(f"{cmd[0]} did not become ready")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def measure(server, reps, n_predict):
    """The median run's (answer seconds, tokens, tokens without a pass, drafted, accepted,
    tokens/s, the grammar's milliseconds or None) and the answer's content."""
    body = {"prompt": PROMPT, "json_schema": SCHEMA, "n_predict": n_predict, "temperature": 0,
            "seed": 1, "cache_prompt": False}
    post(server.url + "/completion", body)  # warm-up (graphs, masks of this grammar)
    rows = []
    for _ in range(reps):
        t = time.perf_counter()
        out = post(server.url + "/completion", body)
        wall = time.perf_counter() - t
        tm = out["timings"]
        accepted = tm.get("draft_n_accepted", 0)
        rows.append((wall, tm["predicted_n"], tm.get("forced_n", 0) + accepted,
                     tm.get("draft_n", 0), accepted, tm["predicted_per_second"], tm.get("grammar_ms"),
                     out["content"]))
    rows.sort()
    return rows[len(rows) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bloomery", required=True)
    ap.add_argument("--plugins", required=True)
    ap.add_argument("--llama-server")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=600)
    ap.add_argument("--strict", action="store_true", help="stop when on and off differ")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    print("| file | flags | server | answer s | tokens | no pass | drafted | tok/s | grammar |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for spec in a.files:
        path, _, flags = spec.partition("::")
        flags = flags.split()
        runs = [("bloomery", [a.bloomery, "--plugin-dir", a.plugins, "serve", "-m", path, *flags]),
                ("bloomery --no-schemajump",
                 [a.bloomery, "--plugin-dir", a.plugins, "serve", "-m", path, "--no-schemajump", *flags])]
        if a.llama_server:
            runs.append(("llama-server b11434", [a.llama_server, "-m", path, *flags]))
        answers = {}
        for name, cmd in runs:
            port = free_port()
            s = Server([*cmd, "--port", str(port), "-c", "4096", "-np", "1"], port)
            try:
                wall, n, no_pass, drafted, accepted, tps, gms, content = measure(
                    s, a.reps, a.n_predict)
            finally:
                s.stop()
            answers[name] = content
            shown = f"{accepted}/{drafted}" if drafted else "-"
            # The grammar's share of the answer's decode time (bloomery's timings only).
            share = f"{100.0 * gms / (1e3 * wall):.1f}%" if gms is not None else "-"
            print(f"| {os.path.basename(path)} | {' '.join(flags)} | {name} | {wall:.2f} | {n} | "
                  f"{100.0 * no_pass / max(n, 1):.0f}% | {shown} | {tps:.1f} | {share} |", flush=True)
        ours = {v for k, v in answers.items() if k.startswith("bloomery")}
        if len(ours) != 1:
            a_on, a_off = answers["bloomery"], answers["bloomery --no-schemajump"]
            at = next((i for i, (x, y) in enumerate(zip(a_on, a_off)) if x != y),
                      min(len(a_on), len(a_off)))
            print(f"| {os.path.basename(path)} | {' '.join(flags)} | DIFFERENT answers on and off, "
                  f"from character {at} of {len(a_on)} | | | | | | |", flush=True)
            if a.strict:
                sys.exit(f"{path}: schemajump on and off gave different answers: {answers}")


if __name__ == "__main__":
    main()
