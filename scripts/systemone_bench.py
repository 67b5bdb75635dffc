#!/usr/bin/env python3
"""Decisions per second of POST /v1/systemone under concurrent clients (issue 44's Speed section).

Starts each engine on the same clef GGUF, one after another, and sends requests of a state of
--state-tokens tokens of the served file (600 by default, counted by the first engine's
/tokenize: a synthetic vocabulary spells English in more pieces than Clef's, so a word count
would not say how long the prompt is; --state-words fixes the words instead) plus three
questions of four options each (two choices and a score) from 1, 8 and 32 concurrent clients;
reports requests/s and p50/p99 latency per engine and client count, and the decision head's own
time per request where the server logs it (bloomery logs "decision head on PLUGIN: ... in X ms"
at debug level, turned on here through RUST_LOG).

Engines (--engines, comma-separated):
  ours-p32      bloomery serve --parallel 32 (the head on the card with -ngl > 0)
  ours-p32-cpu  the same with --decision-head-device cpu (the head's time on the CPU)
  ours-p1       bloomery serve --parallel 1 (one decision at a time)
  llama         llama-server (--llama-server PATH) -np 32 on the same file

Every request's state is unique (a ticket number first), so no engine serves it from a cache.
--batch and --ubatch pass -b and -ub to every engine, so that both run passes of the same size
(without them bloomery keeps its defaults and llama-server gets -b 4096 -ub 4096).
Stdlib only. Example (on the GPU machine):
  scripts/systemone_bench.py --model /dev/shm/clef-flash-q8_0.gguf --bloomery dist/bloomery \
      --plugin-dir dist/plugins --llama-server /path/llama-server --ngl 99
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HEAD_LINE = re.compile(
    r"decision head on (\S+): (\d+) requests, (\d+) rows, (\d+) questions, (\d+) options in ([0-9.]+) ms")

WORDS = (
    "the customer wrote again about an order that arrived late and was missing one item while the "
    "invoice listed every item twice and the support page gave no phone number so they asked for a "
    "refund of the shipping cost and a call from someone who can fix the account before the next "
    "billing date because the card on file was charged on two different days last month"
).split()


def state_text(n_words: int, ticket: int) -> str:
    """A state of n_words words, led by a ticket number that makes it unique."""
    words = [WORDS[i % len(WORDS)] for i in range(n_words)]
    return f"Ticket {ticket}: " + " ".join(words) + "."


QUESTIONS = {
    "route": {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {
            "billing": "payments, invoices and refunds",
            "shipping": "deliveries and missing items",
            "technical": "the website and the account",
            "sales": "new orders and offers",
        },
    },
    "urgency": {
        "type": "score",
        "instructions": "How urgent is this ticket?",
        "criteria": ["can wait", "this week", "today", "right now"],
    },
    "tone": {
        "type": "choice",
        "instructions": "What is the customer's tone?",
        "criteria": {"calm": None, "annoyed": None, "angry": None, "polite": None},
    },
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(base: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready in {timeout:.0f} s")


def engine_command(name: str, a: argparse.Namespace, port: int) -> list:
    """The command line that serves a.model as engine `name` on `port`."""
    if name.startswith("ours"):
        slots = 1 if name == "ours-p1" else 32
        cmd = [a.bloomery]
        for d in a.plugin_dir:
            cmd += ["--plugin-dir", d]
        cmd += ["serve", "-m", a.model, "-ngl", str(a.ngl), "--parallel", str(slots),
                "-c", str(slots * a.ctx_per_slot), "--port", str(port), "--host", "127.0.0.1"]
        if name == "ours-p32-cpu":
            cmd += ["--decision-head-device", "cpu"]
        return cmd + batch_flags(a) + a.ours_args.split()
    if name == "llama":
        if not a.llama_server:
            raise SystemExit("engine llama needs --llama-server PATH")
        # llama-server reads a decision's question and options from one batch: by default -b and
        # -ub of 4096 hold them.
        batch = batch_flags(a) or ["-b", "4096", "-ub", "4096"]
        return [a.llama_server, "-m", a.model, "-ngl", str(a.ngl), "-np", "32",
                "-c", str(32 * a.ctx_per_slot)] + batch + [
                "--port", str(port), "--host", "127.0.0.1"] + a.llama_args.split()
    raise SystemExit(f"unknown engine {name}")


def batch_flags(a: argparse.Namespace) -> list:
    """-b and -ub as --batch and --ubatch ask, for every engine."""
    flags = []
    if a.batch:
        flags += ["-b", str(a.batch)]
    if a.ubatch:
        flags += ["-ub", str(a.ubatch)]
    return flags


def state_tokens(base: str, n_words: int, timeout: float) -> int:
    """Tokens of the served file in a state of n_words words, as the levels send it (a
    seven-digit ticket), by the server's /tokenize."""
    r = post(base + "/tokenize", {"content": state_text(n_words, 1_000_000)}, timeout)
    return len(r["tokens"])


def words_for(base: str, n_tokens: int, timeout: float) -> int:
    """The fewest words whose state holds at least n_tokens tokens of the served file."""
    hi = 1
    while state_tokens(base, hi, timeout) < n_tokens:
        if hi > 1 << 16:
            raise RuntimeError(f"no state of up to {hi} words holds {n_tokens} tokens")
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if state_tokens(base, mid, timeout) < n_tokens:
            lo = mid
        else:
            hi = mid
    return hi


def run_level(url: str, clients: int, total: int, a: argparse.Namespace, first_ticket: int) -> dict:
    """`total` requests from `clients` threads; latencies, wall time, prompt sizes, failures."""
    lat, tokens, errors = [], [], []
    lock = threading.Lock()
    next_ticket = [first_ticket]

    def worker() -> None:
        while True:
            with lock:
                if next_ticket[0] >= first_ticket + total:
                    return
                ticket = next_ticket[0]
                next_ticket[0] += 1
            body = {"state": state_text(a.state_words, ticket), "questions": QUESTIONS}
            t0 = time.perf_counter()
            try:
                r = post(url, body, a.timeout)
                dt = time.perf_counter() - t0
                if list(r.get("answers", {}).keys()) != list(QUESTIONS):
                    raise RuntimeError(f"answers {list(r.get('answers', {}))}")
                with lock:
                    lat.append(dt)
                    tokens.append(r["usage"]["input_tokens"])
            except urllib.error.HTTPError as e:
                with lock:
                    errors.append(f"{e}: {e.read()[:300]!r}")
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                with lock:
                    errors.append(str(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat.sort()

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(round(p / 100 * (len(lat) - 1))))] * 1e3 if lat else float("nan")

    return {
        "clients": clients,
        "requests": len(lat),
        "failed": len(errors),
        "first_error": errors[0] if errors else None,
        "wall_s": wall,
        "rps": len(lat) / wall if wall > 0 else 0.0,
        "p50_ms": pct(50),
        "p99_ms": pct(99),
        "input_tokens": statistics.mean(tokens) if tokens else 0,
    }


def head_times(log_path: str) -> dict:
    """The head's time from a bloomery log: plugin, runs, median and mean ms per run, requests
    per run, and ms per request (each run scores every decision whose prompt ended in a pass)."""
    ms, reqs, plugins = [], [], set()
    with open(log_path, errors="replace") as f:
        for line in f:
            m = HEAD_LINE.search(line)
            if m:
                plugins.add(m.group(1))
                reqs.append(int(m.group(2)))
                ms.append(float(m.group(6)))
    if not ms:
        return {}
    return {"plugin": ",".join(sorted(plugins)), "calls": len(ms), "median_ms": statistics.median(ms),
            "mean_ms": statistics.mean(ms), "requests_per_run": statistics.mean(reqs),
            "ms_per_request": sum(ms) / sum(reqs)}


def bench_engine(name: str, a: argparse.Namespace, levels: list) -> dict:
    port = free_port()
    log_path = os.path.join(a.log_dir, f"systemone-{name}.log")
    env = dict(os.environ)
    env.setdefault("RUST_LOG", "bloomery=info,bloomery_exec::decision=debug")
    cmd = engine_command(name, a, port)
    print(f"== {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc, a.ready_timeout)
        if a.state_words is None:
            # Sized once, by the first engine: every engine gets the same requests.
            a.state_words = words_for(base, a.state_tokens, a.timeout)
        a.state_tokens_seen = state_tokens(base, a.state_words, a.timeout)
        print(f"   state: {a.state_words} words, {a.state_tokens_seen} tokens by /tokenize",
              file=sys.stderr, flush=True)
        url = base + "/v1/systemone"
        run_level(url, 1, a.warmup, a, 0)
        rows, ticket = [], 1_000_000
        for c in levels:
            total = max(a.min_requests, a.per_client * c)
            r = run_level(url, c, total, a, ticket)
            ticket += total
            r["engine"] = name
            rows.append(r)
            print(f"   {c:>2} clients: {r['rps']:.2f} req/s, p50 {r['p50_ms']:.1f} ms, "
                  f"p99 {r['p99_ms']:.1f} ms ({r['requests']} ok, {r['failed']} failed)",
                  file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"engine": name, "rows": rows, "head": head_times(log_path) if name.startswith("ours") else {},
            "log": log_path}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the clef GGUF every engine serves")
    p.add_argument("--bloomery", default="dist/bloomery")
    p.add_argument("--plugin-dir", action="append", default=None, help="bloomery's plugin folder(s)")
    p.add_argument("--llama-server", default=None, help="llama-server binary (engine llama)")
    p.add_argument("--engines", default="ours-p32,ours-p32-cpu,ours-p1,llama")
    p.add_argument("--clients", default="1,8,32")
    p.add_argument("--ngl", type=int, default=99)
    p.add_argument("--ctx-per-slot", type=int, default=2048)
    p.add_argument("--state-tokens", type=int, default=600,
                   help="the state's length in tokens of the served file (found by /tokenize)")
    p.add_argument("--state-words", type=int, default=None,
                   help="the state's length in words instead of --state-tokens")
    p.add_argument("--batch", type=int, default=None, help="-b for every engine")
    p.add_argument("--ubatch", type=int, default=None, help="-ub for every engine")
    p.add_argument("--per-client", type=int, default=4, help="requests per client at each level")
    p.add_argument("--min-requests", type=int, default=16)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--ready-timeout", type=float, default=600)
    p.add_argument("--ours-args", default="", help="extra flags for bloomery serve")
    p.add_argument("--llama-args", default="", help="extra flags for llama-server")
    p.add_argument("--log-dir", default=".", help="where each server's log goes")
    p.add_argument("--json", default=None, help="write every row here")
    a = p.parse_args()
    a.plugin_dir = a.plugin_dir or ["dist/plugins"]
    levels = [int(c) for c in a.clients.split(",")]
    results = [bench_engine(e, a, levels) for e in a.engines.split(",") if e]

    prompts = [r["input_tokens"] for res in results for r in res["rows"] if r["requests"]]
    prompt = f"{statistics.mean(prompts):.0f}" if prompts else "no"
    batch = " ".join(batch_flags(a)) or "bloomery's defaults, llama-server -b 4096 -ub 4096"
    print(f"model {a.model}, -ngl {a.ngl}, batch: {batch}")
    print(f"requests: a state of {a.state_words} words ({getattr(a, 'state_tokens_seen', '?')} tokens "
          f"by /tokenize) plus 3 questions x 4 options: {prompt} prompt tokens (usage.input_tokens)")
    print("| engine | clients | requests | failed | req/s | p50 ms | p99 ms | prompt tokens |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for res in results:
        for r in res["rows"]:
            print(f"| {r['engine']} | {r['clients']} | {r['requests']} | {r['failed']} | {r['rps']:.2f} "
                  f"| {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['input_tokens']:.0f} |")
    for res in results:
        h = res["head"]
        if h:
            print(f"head time, {res['engine']}: on {h['plugin']}, median {h['median_ms']:.2f} ms, "
                  f"mean {h['mean_ms']:.2f} ms a run over {h['calls']} runs of "
                  f"{h['requests_per_run']:.1f} requests: {h['ms_per_request']:.2f} ms a request")
    by = {res["engine"]: {r["clients"]: r for r in res["rows"]} for res in results}
    top = max(levels)
    ours = by.get("ours-p32", {}).get(top)
    for other, goal in (("ours-p1", 4.0), ("llama", 1.5)):
        theirs = by.get(other, {}).get(top)
        if ours and theirs and theirs["rps"] > 0:
            print(f"at {top} clients: ours-p32 / {other} = {ours['rps'] / theirs['rps']:.2f}x (goal {goal}x)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    failed = sum(r["failed"] for res in results for r in res["rows"])
    if failed:
        first = next(r["first_error"] for res in results for r in res["rows"] if r["first_error"])
        print(f"{failed} requests failed; the first: {first}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
