"""/infill's prompt as llama-server b11434 builds it: on every setup of infill_cases.py (FIM tokens
given by --override-kv, with and without the repository tokens, PSM and SPM, a small batch and
context that cut the parts, BOS on) each request's status and evaluated prompt length equal
llama-server's, and its first token's likeliest ids and log-probabilities agree (host/tests/fixtures/infill.json, made by
tests/oracle/make_infill_golden.py)."""
import json

import pytest

import infill_cases
from conftest import ROOT, Server

GOLDEN = json.loads((ROOT / "host/tests/fixtures/infill.json").read_text())["answers"]


@pytest.mark.parametrize("setup", list(infill_cases.SETUPS))
def test_infill_answers_as_llama_server(tiny_path, setup):
    s = Server(tiny_path, "-np", "1", *infill_cases.SETUPS[setup])
    try:
        got = [infill_cases.ask(s.url, body) for body in infill_cases.REQUESTS]
    finally:
        s.stop()
    for i, (g, w) in enumerate(zip(got, GOLDEN[setup], strict=True)):
        assert infill_cases.same(g, w), (i, g, w)


def test_a_model_without_fim_tokens_is_refused_by_name(tiny):
    r = tiny.post("/infill", {"input_prefix": "a", "input_suffix": "b"})
    assert r.status_code == 501
    assert r.json()["error"]["message"] == ("Infill is not supported by this model: prefix token is missing. "
                                            "suffix token is missing. middle token is missing. ")
