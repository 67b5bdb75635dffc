"""Draft decoding as llama-server b11434 reports it (issue 48): `speculative` in /props'
default_generation_settings and in each /slots entry (true when the slots have a draft source),
`speculative.types` in the params, and the request's draft counts in its timings."""

import pytest

from conftest import QWEN3_TEMPLATE, Server, run_cli


@pytest.fixture(scope="module")
def mtp_path(tmp_path_factory):
    """The synthetic tiny qwen35moe with its MTP block (f32, seed 7)."""
    out = tmp_path_factory.mktemp("models") / "tiny-mtp-qwen35moe.gguf"
    rc, text = run_cli("synth", "--arch", "qwen35moe", "--preset", "tiny-mtp", "--seed", "7", "-o", str(out))
    assert rc == 0, text
    return out


def reported(server):
    """(/props' speculative, its params' speculative.types, every /slots entry's speculative)."""
    props = server.get("/props").json()["default_generation_settings"]
    slots = server.get("/slots").json()
    return props["speculative"], props["params"]["speculative.types"], [s["speculative"] for s in slots]


@pytest.mark.parametrize(
    "flags, want",
    [
        ((), (True, "draft-mtp")),
        (("--spec-type", "draft-mtp"), (True, "draft-mtp")),
        (("--spec-type", "none"), (False, "none")),
    ],
)
def test_a_file_with_mtp_layers_drafts_by_default_and_says_so(mtp_path, flags, want):
    s = Server(mtp_path, "-c", "512", "-np", "2", "--chat-template-file", str(QWEN3_TEMPLATE), *flags)
    try:
        spec, types, slots = reported(s)
        assert (spec, types) == want
        assert slots == [want[0]] * 2
        r = s.post("/completion", {"prompt": "Hello there", "n_predict": 6, "temperature": 0})
        assert r.status_code == 200, r.text
        t = r.json()["timings"]
        # llama-server gives the counts only when something was drafted.
        if want[0]:
            assert t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"], t
        else:
            assert "draft_n" not in t, t
    finally:
        s.stop()


def test_a_file_without_mtp_layers_does_not_draft(tiny):
    assert reported(tiny) == (False, "none", [False] * 4)
