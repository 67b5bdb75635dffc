#!/usr/bin/env python3
"""Total generation throughput of `bloomery serve` with 1, 2 and 4 concurrent streams.

Starts the server once per stream count (`-np N`), warms it up with one request, then runs
`--rounds` rounds of N clients at once, each generating `-n` tokens (greedy, end-of-generation
ignored) after its own short prompt. For each round it reports total tok/s (all tokens over the
wall time of the round); from the server's own timings, per-stream decode tok/s and the slowest
stream's time to its first token; and from its /metrics the round's forward passes, their mean
forward time and the mean wall time per pass (what the server spends beyond the model's passes).
The first round meets batch shapes the server has not run before (it prepares and captures them
then); later rounds show the steady state.

usage: scripts/server_bench.py [--bin dist/bloomery] [--plugins dist/plugins] [-n 64] [--streams 1,2,4]
                               [--rounds 1] [--server-args "-ngl 99"] [--server-log FILE] MODEL.gguf
Needs `requests` (pip install requests==2.34.2).
"""
import argparse
import concurrent.futures
import socket
import subprocess
import time

import requests

PROMPTS = [
    "The history of the printing press begins",
    "In a quiet village by the mountains,",
    "Rust is a systems programming language that",
    "The three longest rivers in Europe are",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def passes_and_forward(url):
    """The server's forward passes so far and their total time in seconds (its /metrics)."""
    vals = {}
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            vals[name.split(":")[-1]] = float(value)
    return vals["n_decode_total"], vals["prompt_seconds_total"] + vals["tokens_predicted_seconds_total"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="dist/bloomery")
    ap.add_argument("--plugins", default="dist/plugins")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--streams", default="1,2,4")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=1, help="concurrent rounds per stream count")
    ap.add_argument("--server-args", default="", help="more `serve` flags, e.g. '-ngl 99 -cmoe'")
    ap.add_argument("--server-log", help="append each server's output here (e.g. with RUST_LOG=bloomery=debug)")
    ap.add_argument("model")
    a = ap.parse_args()
    print("| streams | round | total tok/s | per-stream decode tok/s (server timings) | wall s "
          "| passes | forward ms / pass | wall ms / pass | slowest first token ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    log = open(a.server_log, "a") if a.server_log else subprocess.DEVNULL
    for n in [int(x) for x in a.streams.split(",")]:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([a.bin, "--plugin-dir", a.plugins, "serve", "-m", a.model, "--port", str(port),
                                 "-np", str(n), "-c", str(a.ctx), "--metrics", *a.server_args.split()], stdout=log, stderr=log)
        try:
            while True:
                try:
                    if requests.get(url + "/health", timeout=1).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                if proc.poll() is not None:
                    raise SystemExit(f"the server exited with {proc.returncode}")
                time.sleep(0.1)

            def one(i):
                body = {"prompt": PROMPTS[i % len(PROMPTS)], "n_predict": a.n, "temperature": 0,
                        "ignore_eos": True, "cache_prompt": False}
                return requests.post(url + "/completion", json=body, timeout=600).json()

            one(0)  # warm-up
            for rnd in range(1, a.rounds + 1):
                passes0, fwd0 = passes_and_forward(url)
                t0 = time.time()
                with concurrent.futures.ThreadPoolExecutor(n) as ex:
                    results = list(ex.map(one, range(n)))
                wall = time.time() - t0
                passes1, fwd1 = passes_and_forward(url)
                passes = max(passes1 - passes0, 1)
                total = sum(r["tokens_predicted"] for r in results)
                per = [r["timings"]["predicted_per_second"] for r in results]
                first = max(r["timings"]["prompt_ms"] for r in results)
                print(f"| {n} | {rnd} | {total / wall:.1f} | {', '.join(f'{p:.1f}' for p in per)} | {wall:.2f} "
                      f"| {passes:.0f} | {(fwd1 - fwd0) * 1e3 / passes:.3f} | {wall * 1e3 / passes:.3f} | {first:.1f} |",
                      flush=True)
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
