"""A pytest plugin for running llama.cpp's server tests against bloomery (`-p suite_plugin`).

- The suite's session fixture starts every model preset once to download it; our models are
  local (the shim makes them), so that warm-up is turned off.
- Every test named in `skips.txt` is marked skipped with its reason class and reason; a test
  the list names that a whole-suite run did not collect fails the run, so the list cannot go
  stale unseen.
- Tests marked `slow` upstream (llama.cpp's CI leaves them out too) are skipped: each one
  downloads a real multi-GB model.
- `get_img_url` (test_vision_api.py, imported by other test files) downloads its test images from
  huggingface.co; the tests' own copies of it answer a small PNG made here instead (a URL id
  stays the URL), for tests that only check how an image is answered, not what it shows.
- `download_file` (test_speculative.py's draft model) answers the path the file would have been
  downloaded to, which the shim swaps for its stand-in; any other download fails naming it.
- At the end, one line gives the counts: passed, failed, and skipped by reason class.
"""
import base64
import struct
import sys
import zlib
from collections import Counter
from pathlib import Path

import pytest

SKIPS = Path(__file__).with_name("skips.txt")

# The reason classes `skips.txt` may use.
CLASSES = {
    "exact-text": "depends on the exact text or tokens of the stories260K/tinyllama models",
    "refused": "a feature bloomery refuses by name",
    "no-model": "needs a model kind we have no offline file for",
    "not-built": "a feature bloomery should have and has not built yet",
    "environment": "needs something outside the test machine",
}


def read_skips(path=SKIPS):
    """Parses `skips.txt`: `test id | class | reason` per line; `#` starts a comment. An id
    ending in `*` names every test whose id starts with what precedes it."""
    entries = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(" | ")]
        if len(parts) != 3 or parts[1] not in CLASSES or not parts[2]:
            raise pytest.UsageError(f"{path}:{n}: expected `test id | class | reason` "
                                    f"with a class of {sorted(CLASSES)}: {line}")
        entries.append(tuple(parts))
    return entries


def matches(pattern, nodeid):
    """Whether a skip-list id names this test."""
    if pattern.endswith("*"):
        return nodeid.startswith(pattern[:-1])
    return nodeid == pattern


class SuiteRun:
    """The skip list and the run's tallies."""

    def __init__(self):
        self.skips = read_skips()
        self.used = set()
        self.skip_class = {}
        self.outcome = {}
        self.collected_whole_suite = False

    def entry_for(self, nodeid):
        for e in self.skips:
            if matches(e[0], nodeid):
                self.used.add(e[0])
                return e
        return None


RUN = SuiteRun()


def offline_download(url, output_file_path=None):
    """`download_file` without the network, for the draft models the shim stands in for: the
    path the suite would have downloaded to (the shim swaps it for its stand-in). Other URLs
    fail, naming themselves."""
    name = url.split("/").pop()
    if name not in DRAFT_FILES:
        raise RuntimeError(f"suite_plugin: no offline stand-in for the download {url}")
    return f"./tmp/{name}" if output_file_path is None else output_file_path


# Downloads whose files the shim stands in for (its DRAFT_STAND_INS).
DRAFT_FILES = {"stories15M-q4_0.gguf"}


def pytest_sessionstart(session):
    utils = sys.modules.get("utils")
    if utils is not None:
        utils.ServerPreset.load_all = staticmethod(lambda: None)


def offline_png():
    """A 2x2 RGB PNG, written here."""
    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
    rows = b"".join(b"\x00" + bytes([200, 30, 30] * 2) for _ in range(2))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def offline_img_url(id):
    """`get_img_url` without the network: the base64 forms of the PNG above."""
    if id.startswith("IMG_URL_"):
        return f"https://huggingface.co/ggml-org/tinygemma3-GGUF/resolve/main/test/{id}.png"
    data = base64.b64encode(offline_png()).decode()
    return "data:image/png;base64," + data if id.startswith("IMG_BASE64_URI_") else data


def pytest_collection_modifyitems(config, items):
    for module in {item.module for item in items if getattr(item, "module", None) is not None}:
        if hasattr(module, "get_img_url"):
            module.get_img_url = offline_img_url
        if hasattr(module, "download_file"):
            module.download_file = offline_download
    RUN.collected_whole_suite = len({item.nodeid.split("::")[0] for item in items}) == len(
        list(Path(str(config.rootpath), "unit").glob("test_*.py")))
    for item in items:
        entry = RUN.entry_for(item.nodeid)
        if entry is not None:
            _, cls, reason = entry
            RUN.skip_class[item.nodeid] = cls
            item.add_marker(pytest.mark.skip(reason=f"{cls}: {reason}"))
        elif item.get_closest_marker("slow") is not None:
            RUN.skip_class[item.nodeid] = "slow"
            item.add_marker(pytest.mark.skip(reason="slow: marked slow upstream; downloads a real model"))


def pytest_runtest_logreport(report):
    if report.skipped:
        cls = RUN.skip_class.get(report.nodeid, "by the test itself")
        RUN.outcome[report.nodeid] = "skipped (" + cls + ")"
    elif report.failed:
        RUN.outcome[report.nodeid] = "failed" if report.when == "call" else "error"
    elif report.when == "call":
        RUN.outcome[report.nodeid] = "passed"


def pytest_sessionfinish(session):
    # A whole-suite run fails when skips.txt names a test the suite no longer has.
    if RUN.collected_whole_suite and any(e[0] not in RUN.used for e in RUN.skips):
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    counts = Counter(RUN.outcome.values())
    line = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    terminalreporter.write_line(f"llama.cpp server suite, {len(RUN.outcome)} tests: {line}")
    stale = [e[0] for e in RUN.skips if e[0] not in RUN.used]
    if stale and RUN.collected_whole_suite:
        terminalreporter.write_line(f"skips.txt names tests that were not collected: {stale}")
