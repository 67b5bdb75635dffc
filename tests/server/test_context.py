"""Context shift (`--context-shift`, `--keep`, `n_keep`/`n_discard`) and cache reuse
(`--cache-reuse`, `n_cache_reuse`) through the real binary."""
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


A, D, B, E = list(range(20, 30)), list(range(100, 108)), list(range(200, 220)), [7, 8, 9]


def test_cache_reuse_moves_a_cached_run_to_where_the_prompt_has_it(tiny_path):
    # No prompt cache: each request sees only what the slot holds.
    s = Server(tiny_path, "-c", "256", "-np", "1", "--cache-ram", "0")
    try:
        first = {"prompt": A + D + B, "n_predict": 1, "temperature": 0}
        assert s.post("/completion", first).status_code == 200
        # A is the common prefix; B moved from 18 to 10 and is reused with n_cache_reuse 8.
        r = s.post("/completion", {"prompt": A + B + E, "n_predict": 1, "n_cache_reuse": 8}).json()
        assert r["timings"]["cache_n"] == len(A) + len(B)
        assert r["timings"]["prompt_n"] == len(E)
        # Without it only the common prefix is kept.
        r = s.post("/completion", first).json()
        assert r["timings"]["cache_n"] == len(A)
        # A run shorter than n_cache_reuse is evaluated again.
        r = s.post("/completion", {"prompt": A + B + E, "n_predict": 1, "n_cache_reuse": 21}).json()
        assert r["timings"]["cache_n"] == len(A)
    finally:
        s.stop()
    s = Server(tiny_path, "-c", "256", "-np", "1", "--cache-reuse", "8")
    try:
        s.post("/completion", {"prompt": A + D + B, "n_predict": 1})
        r = s.post("/completion", {"prompt": A + B + E, "n_predict": 1}).json()
        assert r["timings"]["cache_n"] == len(A) + len(B)
    finally:
        s.stop()


@pytest.mark.parametrize("which,flags,why", [
    ("hybrid", ["--context-shift"], "cannot shift"),
    ("hybrid", ["--cache-reuse", "16"], "cannot shift"),
    ("tiny", ["--context-shift", "-ctk", "q8_0"], "-ctk f16"),
])
def test_moving_the_cache_is_refused_by_name_where_it_cannot_move(which, flags, why, tiny_path, hybrid_path):
    path = hybrid_path if which == "hybrid" else tiny_path
    with pytest.raises(RuntimeError) as e:
        Server(path, "-c", "256", *flags)
    assert flags[0] in str(e.value) and why in str(e.value)


def test_a_requests_cache_reuse_is_refused_by_name_where_the_cache_cannot_move(hybrid_path):
    s = Server(hybrid_path, "-c", "256")
    try:
        r = s.post("/completion", {"prompt": "x", "n_predict": 1, "n_cache_reuse": 4})
        assert r.status_code == 400 and "n_cache_reuse" in r.json()["error"]["message"]
        assert s.post("/completion", {"prompt": "x", "n_predict": 1, "n_cache_reuse": 0}).status_code == 200
    finally:
        s.stop()
