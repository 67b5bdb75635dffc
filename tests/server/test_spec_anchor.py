"""Draft decoding against llama-server b11434 itself: for each setup of
host/tests/fixtures/spec_counts.json (made by tests/oracle/make_spec_counts_golden.py, which ran
llama-server built from the PyPI sdist on the same synthetic files), bloomery serves the same file
with the same --spec-* flags (ungated, as llama-server drafts every step) and answers the same
greedy requests: every answer's tokens, draft_n and draft_n_accepted equal llama-server's."""
import hashlib
import json
from pathlib import Path

import pytest

from conftest import Server, run_cli

GOLDEN = json.loads((Path(__file__).resolve().parents[2] / "host/tests/fixtures/spec_counts.json").read_text())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The golden's synthetic files, written again and checked byte for byte by their SHA-256."""
    out = {}
    d = tmp_path_factory.mktemp("anchor")
    for name, f in GOLDEN["files"].items():
        p = d / (name + ".gguf")
        rc, text = run_cli("synth", *f["synth"], "-o", str(p))
        assert rc == 0, text
        assert hashlib.sha256(p.read_bytes()).hexdigest() == f["sha256"], f"{name}: not the golden's file"
        out[name] = p
    return out


@pytest.mark.parametrize("setup", GOLDEN["setups"], ids=[s["name"] for s in GOLDEN["setups"]])
def test_each_request_drafts_and_keeps_what_llama_server_does(files, setup):
    flags = list(setup["flags"])
    if setup["draft"] is not None:
        flags += ["-md", str(files[setup["draft"]])]
    s = Server(files[setup["model"]], "-np", "1", "-c", "512", "--spec-no-gate", *flags)
    try:
        for prompt, want in zip(GOLDEN["prompts"], setup["answers"]):
            r = s.post("/completion", {"prompt": prompt, "n_predict": GOLDEN["n_predict"], "temperature": 0,
                                       "return_tokens": True, "cache_prompt": False})
            assert r.status_code == 200, r.text
            j = r.json()
            t = j["timings"]
            got = (j["tokens"], t.get("draft_n", 0), t.get("draft_n_accepted", 0))
            assert got == (want["tokens"], want["draft_n"], want["draft_n_accepted"]), (prompt, got, want)
    finally:
        s.stop()
