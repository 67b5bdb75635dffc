"""Starts the real `bloomery serve` binary on 127.0.0.1 for the server tests.

Environment (set by `cargo xtask test`):
  BLOOMERY_BIN              the bloomery binary (default: target/debug/bloomery)
  BLOOMERY_TEST_PLUGIN_DIR  its plugin folder (default: target/debug/plugins)
  BLOOMERY_GEMMA3           the gemma-3-270m Q4_K_M file (real weights, real text)
"""
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("BLOOMERY_BIN", str(ROOT / "target/debug/bloomery"))
PLUGINS = os.environ.get("BLOOMERY_TEST_PLUGIN_DIR", str(ROOT / "target/debug/plugins"))
QWEN3_TEMPLATE = ROOT / "text/tests/fixtures/templates/qwen3.jinja"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sse_lines(r):
    """A streamed response's lines as text. An SSE body is UTF-8, and llama-server sends it
    without a charset, which `requests` would read as ISO-8859-1, garbling every non-ASCII piece."""
    return (line.decode("utf-8") for line in r.iter_lines())


class Server:
    """One `bloomery serve` process."""

    def __init__(self, model, *flags, env=None, ca=None, prefix="", port=None):
        """`ca`: the certificate that signs the server's, for a server started with TLS; `prefix`:
        the `--api-prefix` it was given among `flags` (its routes' paths start with it); `port`:
        the port to serve on (a free one when None)."""
        self.port = port or free_port()
        self.root = f"{'https' if ca else 'http'}://127.0.0.1:{self.port}"
        self.url = self.root + prefix
        self.verify = str(ca) if ca else True
        cmd = [BIN, "--plugin-dir", PLUGINS, "serve", "-m", str(model), "--port", str(self.port), *flags]
        self.log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"bloomery-serve-{self.port}.log", "w+")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.wait_ready()

    def wait_ready(self, timeout=120):
        start = time.time()
        while time.time() - start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.output()}")
            try:
                if requests.get(self.url + "/health", timeout=1, verify=self.verify).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server did not become ready: " + self.output())

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def get(self, path, **kw):
        return requests.get(self.url + path, timeout=120, verify=self.verify, **kw)

    def post(self, path, body=None, **kw):
        return requests.post(self.url + path, json=body, timeout=300, verify=self.verify, **kw)

    def rss_kib(self):
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def run_cli(*args, timeout=60):
    """Runs bloomery with the test plugin folder; returns (returncode, output)."""
    p = subprocess.run([BIN, "--plugin-dir", PLUGINS, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


@pytest.fixture(scope="session")
def gemma3_path():
    path = os.environ.get("BLOOMERY_GEMMA3")
    assert path, "BLOOMERY_GEMMA3 must name the gemma-3-270m file (cargo xtask test sets it)"
    return path


def synth_file(tmp_path_factory, name, arch, preset="tiny", seed=7):
    """A synthetic file `bloomery synth` writes (random weights) under the test's temporary folder."""
    out = tmp_path_factory.mktemp("models") / name
    rc, text = run_cli("synth", "--arch", arch, "--preset", preset, "--seed", str(seed), "-o", str(out))
    assert rc == 0, text
    return out


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    """The synthetic tiny qwen3moe (f32, seed 7)."""
    return synth_file(tmp_path_factory, "tiny-qwen3moe.gguf", "qwen3moe")


@pytest.fixture(scope="session")
def hybrid_path(tmp_path_factory):
    """The synthetic tiny qwen35moe (Gated DeltaNet + attention hybrid; f32, seed 7)."""
    return synth_file(tmp_path_factory, "tiny-qwen35moe.gguf", "qwen35moe")


@pytest.fixture(scope="module")
def gemma3(gemma3_path):
    s = Server(gemma3_path, "-c", "2048", "-np", "2", "--metrics", "-a", "gemma3-270m", "-s", "42")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tiny(tiny_path):
    # --ignore-eos: the random weights sample an end-of-generation token about once in 250 tokens,
    # which cut a reply short of the length a test counts on (stop 62's CI failed on one).
    s = Server(tiny_path, "-c", "4096", "-np", "4", "--chat-template-file", str(QWEN3_TEMPLATE), "--metrics",
               "--ignore-eos")
    yield s
    s.stop()


class Tally:
    """Counts for the hostile suites, printed at the end of the run: requests tried, those
    answered with a named error (llama-server's JSON error shape with a message), crashes (the
    server process gone) and stalls (a request, or the normal request after a case, that took
    longer than its bound)."""

    def __init__(self):
        self.tried = self.normal = self.named = self.crashes = self.stalls = 0

    def note(self, server, r=None, elapsed=0.0, bound=None, normal=False):
        """Counts one request (its response `r`, or None when it got none) sent to `server`; a
        `normal` one is the check after a case."""
        if normal:
            self.normal += 1
        else:
            self.tried += 1
        if r is not None and r.status_code >= 400:
            try:
                e = r.json()["error"]
                if e["code"] == r.status_code and e["type"] and e["message"]:
                    self.named += 1
            except (ValueError, KeyError, TypeError):
                pass
        if server is not None and server.proc.poll() is not None:
            self.crashes += 1
        if bound is not None and elapsed > bound:
            self.stalls += 1

    def line(self):
        return (f"hostile requests: {self.tried} tried, {self.named} answered with a named error, "
                f"{self.normal} normal requests after them, {self.crashes} crashes, {self.stalls} stalls")


TALLY = Tally()


def pytest_terminal_summary(terminalreporter):
    if TALLY.tried:
        terminalreporter.write_line(TALLY.line())
