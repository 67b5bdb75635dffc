"""Decisions (/v1/systemone) batched across requests on the synthetic tiny `clef` file: their
prompts share the scheduler's passes, the decision head runs once over every decision whose prompt
ends in the same pass (`llamacpp:decision_head_runs_total` against `decisions_total`), a state
prefix another decision evaluated comes from the slots or the prompt cache in host RAM
(`prompt_tokens_cached_total`, `prompt_cache_restores_total`) with the same answers, and a client
that goes away frees its slot."""

import concurrent.futures
import json
import socket
import string
import time

import pytest

from conftest import Server, run_cli
from test_systemone import QUESTIONS, STATE, check_answers

ONE_QUESTION = {"angry": {"type": "noul", "instructions": "Angry?"}}

OTHER_QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Refund?"},
    "tone": {"type": "choice", "instructions": "Tone?", "criteria": {"calm": None, "upset": None}},
}


@pytest.fixture(scope="module")
def clef_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "tiny-clef.gguf"
    rc, text = run_cli("synth", "--arch", "clef", "--preset", "tiny", "--seed", "7", "-o", str(out))
    assert rc == 0, text
    return out


def metric(server, name):
    for line in server.get("/metrics").text.splitlines():
        if line.startswith(f"llamacpp:{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def metrics(server, *names):
    return {n: metric(server, n) for n in names}


def decide(server, state, questions=QUESTIONS):
    r = server.post("/v1/systemone", {"state": state, "questions": questions})
    assert r.status_code == 200, r.text
    return r.json()


def assert_same(a, b, tol=1e-6):
    assert a["usage"] == b["usage"]
    assert list(a["answers"]) == list(b["answers"])
    for qid, x in a["answers"].items():
        y = b["answers"][qid]
        for k in ("noul", "score"):
            if k in x:
                assert abs(x[k] - y[k]) < tol, (qid, x, y)
        for k, v in x.get("probabilities", {}).items():
            assert abs(v - y["probabilities"][k]) < tol, (qid, x, y)


def letters(n):
    """A state of `n` one-letter words: one token each in the synthetic vocabulary."""
    return " ".join(string.ascii_lowercase[i % 26] for i in range(n))


def test_eight_concurrent_decisions_share_passes_and_head_runs(clef_path):
    """Eight decisions sent at once: the ones that arrive while a pass runs join the next passes
    together, and the head runs once over all whose prompts end in the same pass (before
    batching: eight head runs and eight passes of their own), each answer as it is alone within
    1e-6. How many arrive within one pass depends on the machine (the debug binary tokenizes on
    the cores the passes use), so this counts fewer runs and passes than decisions; the exact
    count (one run and one pass for eight decisions that start together) is
    host/tests/clef_head.rs `decisions_that_start_together_share_passes_and_one_head_run`.
    About 25 s: the debug binary evaluates ~230 prompt tokens/s, and each of the eight prompts
    (~460 tokens) runs alone first."""
    s = Server(clef_path, "-c", "8192", "-np", "8", "--metrics")
    try:
        bodies = [f"{STATE} #{i}" for i in range(8)]
        alone = [decide(s, b, ONE_QUESTION) for b in bodies]
        names = ("decisions_total", "decision_head_runs_total", "decision_rows_total", "n_decode_total")
        before = metrics(s, *names)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda b: decide(s, b, ONE_QUESTION), bodies))
        after = metrics(s, *names)
        delta = {n: after[n] - before[n] for n in names}
        assert delta["decisions_total"] == 8
        assert delta["decision_rows_total"] == sum(a["usage"]["input_tokens"] for a in alone)
        assert delta["decision_head_runs_total"] < 8, delta
        assert delta["n_decode_total"] < 8, delta
        for a, b in zip(alone, together):
            assert_same(a, b)
    finally:
        s.stop()


@pytest.fixture(scope="module")
def one_slot(clef_path):
    """One slot, passes of at most 64 rows."""
    s = Server(clef_path, "-c", "4096", "-np", "1", "-b", "64", "--metrics")
    yield s
    s.stop()


def test_a_shared_state_comes_from_the_slot_and_the_prompt_cache(one_slot):
    """Decisions on one state with other questions reuse the state's positions and final-norm
    rows: from the slot that evaluated them, and from the prompt cache in host RAM once another
    state has displaced them from the only slot; the answers equal the cold ones."""
    s = one_slot
    names = ("prompt_tokens_cached_total", "prompt_cache_restores_total", "prompt_tokens_total")
    state = f"{STATE} {letters(200)}"
    m0 = metrics(s, *names)
    cold = decide(s, state)
    m1 = metrics(s, *names)
    assert m1["prompt_tokens_cached_total"] == m0["prompt_tokens_cached_total"]
    # The same state, other questions: the state's tokens come from the slot.
    other = decide(s, state, OTHER_QUESTIONS)
    m2 = metrics(s, *names)
    reused = m2["prompt_tokens_cached_total"] - m1["prompt_tokens_cached_total"]
    assert reused > 200, reused
    evaluated = m2["prompt_tokens_total"] - m1["prompt_tokens_total"]
    assert evaluated + reused == other["usage"]["input_tokens"]
    # Another state displaces it; the first questions again restore it from host RAM.
    decide(s, "Something else entirely.", OTHER_QUESTIONS)
    warm = decide(s, state)
    m3 = metrics(s, *names)
    assert m3["prompt_cache_restores_total"] - m2["prompt_cache_restores_total"] == 1
    assert m3["prompt_tokens_cached_total"] - m2["prompt_tokens_cached_total"] >= reused
    assert_same(cold, warm)
    assert "cached)" in s.output()


def test_a_client_that_disconnects_frees_its_slot(one_slot):
    """A decision whose client closes the connection mid-prompt is cancelled: its slot is free
    again, the head never scores it, and the server keeps answering."""
    s = one_slot
    state = letters(2000)
    body = json.dumps({"state": state, "questions": QUESTIONS}).encode()
    before = metric(s, "decisions_total")
    conn = socket.create_connection(("127.0.0.1", s.port))
    conn.sendall(
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    deadline = time.time() + 30
    while not any(x["is_processing"] for x in s.get("/slots").json()):
        assert time.time() < deadline, "the decision never started"
        time.sleep(0.02)
    conn.close()
    while any(x["is_processing"] for x in s.get("/slots").json()):
        assert time.time() < deadline, "the slot stayed busy after its client left"
        time.sleep(0.05)
    assert "client went away" in s.output()
    assert metric(s, "decisions_total") == before
    check_answers(decide(s, STATE))
