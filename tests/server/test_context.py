"""Context shift (`--context-shift`, `--keep`, `n_keep`/`n_discard`) through the real binary."""
import pytest

from conftest import Server


def test_generation_goes_past_the_context_with_context_shift(tiny_path):
    prompt = list(range(20, 40))
    body = {"prompt": prompt, "n_predict": 100, "temperature": 0, "ignore_eos": True}
    plain = Server(tiny_path, "-c", "128", "-np", "2")
    try:
        cut = plain.post("/completion", body).json()
    finally:
        plain.stop()
    assert cut["truncated"] is True and cut["timings"]["predicted_n"] < 50
    s = Server(tiny_path, "-c", "128", "-np", "2", "--context-shift", "--keep", "4")
    try:
        r = s.post("/completion", body).json()
        assert r["timings"]["predicted_n"] == 100 and r["truncated"] is True
        assert r["content"].startswith(cut["content"])
        assert "context shift, n_keep = 4" in s.output()
        # A request's own n_keep and n_discard, held to llama-server's limits.
        r = s.post("/completion", {**body, "n_keep": -1, "n_discard": 10}).json()
        assert r["timings"]["predicted_n"] == 100
        assert s.post("/completion", {**body, "n_discard": -1}).status_code == 400
    finally:
        s.stop()


@pytest.mark.parametrize("which,flags,why", [
    ("hybrid", [], "cannot shift"),
    ("tiny", ["-ctk", "q8_0"], "-ctk f16"),
])
def test_context_shift_is_refused_by_name_where_the_cache_cannot_move(which, flags, why, tiny_path, hybrid_path):
    path = hybrid_path if which == "hybrid" else tiny_path
    with pytest.raises(RuntimeError) as e:
        Server(path, "-c", "256", "--context-shift", *flags)
    assert "--context-shift" in str(e.value) and why in str(e.value)
