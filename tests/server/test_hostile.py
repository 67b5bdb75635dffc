"""Hostile requests on the real binary: every case of the hardening issue (40) and the bad input
handled before it, each followed by a normal request that must answer exactly as it did before
any case. Counts (requests tried, named errors, crashes, stalls) go to the run's summary."""
import json
import time

import pytest
import requests

from conftest import QWEN3_TEMPLATE, TALLY, Server

NORMAL = {"prompt": [5, 77, 300, 12], "n_predict": 8, "temperature": 0, "cache_prompt": False}
CASE_BOUND = 60  # seconds any request may take (a debug build on two shared cores)
NORMAL_BOUND = 20  # seconds the normal request may take after a case
VOCAB = 512  # the tiny model's
CTX = 1024  # per slot: -c 4096 over 4 slots


@pytest.fixture(scope="module")
def hostile(tiny_path, tmp_path_factory):
    s = Server(tiny_path, "-c", "4096", "-np", "4", "--chat-template-file", str(QWEN3_TEMPLATE),
               "--slot-save-path", str(tmp_path_factory.mktemp("slots")))
    s.want = s.post("/completion", NORMAL).json()["content"]
    yield s
    s.stop()


def send(s, method, path, body=None, raw=None, headers=None):
    """One hostile request, counted; None when no answer came."""
    started = time.time()
    try:
        r = requests.request(method, s.url + path, json=None if raw is not None else body, data=raw,
                             headers=headers, timeout=CASE_BOUND)
    except requests.RequestException:
        r = None
    TALLY.note(s, r, time.time() - started, CASE_BOUND)
    return r


def normal_answers_the_same(s):
    started = time.time()
    r = requests.post(s.url + "/completion", json=NORMAL, timeout=3 * NORMAL_BOUND)
    TALLY.note(s, None, time.time() - started, NORMAL_BOUND, normal=True)
    assert r.status_code == 200, r.text
    assert r.json()["content"] == s.want
    assert s.get("/health").json() == {"status": "ok"}


def chat(**extra):
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
BIG = "x" * (3 << 20)  # over the body limit this context sets (about 1.3 MB)
LONG = "word " * 60_000  # under the body limit, but at least 23,000 tokens: over a slot's 1024

# (name, method, path, JSON body or raw bytes, expected status)
CASES = [
    # Handled before the issue.
    ("malformed JSON", "POST", "/completion", b"{not json", 400),
    ("invalid UTF-8", "POST", "/completion", b'{"prompt": "\xff\xfe"}', 400),
    ("array body", "POST", "/completion", [1, 2], 400),
    ("nested 100k deep", "POST", "/completion", b"[" * 100_000, 400),
    ("wrong type", "POST", "/completion", {"prompt": "hi", "temperature": "hot"}, 400),
    ("no prompt", "POST", "/completion", {"n_predict": 3}, 400),
    ("object prompt", "POST", "/completion", {"prompt": {}}, 400),
    ("token out of vocab", "POST", "/completion", {"prompt": [10**9]}, 400),
    ("negative token", "POST", "/completion", {"prompt": [-1]}, 400),
    ("ids over the context", "POST", "/completion", {"prompt": [5] * 1100, "n_predict": 1}, 400),
    ("stop of numbers", "POST", "/completion", {"prompt": "hi", "stop": [1]}, 400),
    ("fractional n_predict", "POST", "/completion", {"prompt": "hi", "n_predict": 1.5}, 400),
    ("messages not a list", "POST", "/v1/chat/completions", {"messages": "hi"}, 400),
    ("message without role", "POST", "/v1/chat/completions", {"messages": [{"content": "x"}]}, 400),
    ("anthropic without messages", "POST", "/v1/messages", {"max_tokens": 3}, 400),
    ("detokenize huge id", "POST", "/detokenize", {"tokens": [2**40]}, 400),
    ("tokenize a number", "POST", "/tokenize", {"content": 5}, 400),
    ("unknown route", "GET", "/v2/nothing", None, 404),
    ("slot name traversal", "POST", "/slots/0?action=save", {"filename": "../escape.bin"}, 400),
    ("slot name absolute", "POST", "/slots/0?action=save", {"filename": "/etc/passwd"}, 400),
    ("slot name empty", "POST", "/slots/0?action=restore", {"filename": ""}, 400),
    ("slot out of range", "POST", "/slots/9?action=erase", {}, 400),
    ("slot action bogus", "POST", "/slots/0?action=bogus", {}, 400),
    ("embeddings", "POST", "/v1/embeddings", {"input": "x"}, 501),
    ("infill without FIM", "POST", "/infill", {"input_prefix": "a", "input_suffix": "b"}, 501),
    ("long stop string", "POST", "/completion", {"prompt": "hi", "n_predict": 4, "stop": ["a" * 200_000]}, 200),
    ("many stop strings", "POST", "/completion", {"prompt": "hi", "n_predict": 4, "stop": ["ab"] * 50_000}, 200),
    # 1. Numbers held to llama-server's limits.
    ("n_probs 1e300", "POST", "/completion", {"prompt": "hi", "n_predict": 2, "n_probs": 1e300}, 200),
    ("n_probs 2^62", "POST", "/completion", {"prompt": "hi", "n_predict": 2, "n_probs": 2**62}, 200),
    ("n_probs negative", "POST", "/completion", {"prompt": "hi", "n_predict": 2, "n_probs": -5}, 200),
    ("repeat_last_n -1", "POST", "/completion", {"prompt": "hi", "repeat_last_n": -1}, 400),
    ("repeat_last_n 1e12", "POST", "/completion", {"prompt": "hi", "repeat_last_n": 1e12}, 400),
    ("repeat_last_n 2^31-1", "POST", "/completion",
     {"prompt": "hi", "n_predict": 4, "repeat_last_n": 2**31 - 1, "repeat_penalty": 1.1}, 200),
    ("min_keep negative", "POST", "/completion", {"prompt": "hi", "min_keep": -1}, 400),
    ("min_keep 2^40", "POST", "/completion", {"prompt": "hi", "min_keep": 2**40}, 400),
    ("n_predict -2", "POST", "/completion", {"prompt": "hi", "n_predict": -2}, 400),
    ("max_tokens 1e300", "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 1e300}, 400),
    ("temperature -1", "POST", "/completion", {"prompt": "hi", "n_predict": 4, "temperature": -1}, 200),
    ("temperature 1e300", "POST", "/completion", {"prompt": "hi", "n_predict": 4, "temperature": 1e300}, 200),
    ("top_p 7", "POST", "/completion", {"prompt": "hi", "n_predict": 4, "top_p": 7}, 200),
    ("min_p -3", "POST", "/completion", {"prompt": "hi", "n_predict": 4, "min_p": -3}, 200),
    ("top_k 1e300", "POST", "/completion", {"prompt": "hi", "n_predict": 4, "top_k": 1e300}, 200),
    ("top_k negative", "POST", "/completion", {"prompt": "hi", "n_predict": 4, "top_k": -5}, 200),
    ("typical_p 0", "POST", "/completion", {"prompt": "hi", "n_predict": 4, "typical_p": 0}, 200),
    ("typical_p 1e300", "POST", "/completion", {"prompt": "hi", "n_predict": 4, "typical_p": 1e300}, 200),
    ("repeat_penalty 0", "POST", "/completion", {"prompt": "hi", "n_predict": 4, "repeat_penalty": 0}, 200),
    ("repeat_penalty 1e300", "POST", "/completion", {"prompt": "hi", "n_predict": 4, "repeat_penalty": 1e300}, 200),
    ("penalties -1e300", "POST", "/completion",
     {"prompt": "hi", "n_predict": 4, "presence_penalty": -1e300, "frequency_penalty": 1e300}, 200),
    ("seed 1e300", "POST", "/completion", {"prompt": "hi", "n_predict": 4, "seed": 1e300}, 200),
    ("seed negative", "POST", "/completion", {"prompt": "hi", "n_predict": 4, "seed": -5}, 200),
    ("top_logprobs 1e300", "POST", "/v1/chat/completions", chat(logprobs=True, top_logprobs=1e300), 200),
    ("logprobs 1e300", "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "logprobs": 1e300}, 200),
    ("max_output_tokens -5", "POST", "/v1/responses", {"input": "hi", "max_output_tokens": -5}, 400),
    # 2. Probabilities of the whole vocabulary, streamed.
    ("n_probs = vocab, streamed", "POST", "/completion",
     {"prompt": "hi", "n_predict": 4, "n_probs": VOCAB, "stream": True}, 200),
    # 3. Big prompts are refused before they are read whole or tokenized.
    ("body over the limit", "POST", "/completion", {"prompt": BIG}, 413),
    ("text over the context", "POST", "/completion", {"prompt": LONG}, 400),
    ("chat over the context", "POST", "/v1/chat/completions", chat(messages=[{"role": "user", "content": LONG}]), 400),
    ("infill over the context", "POST", "/infill", {"input_prefix": LONG}, 501),
    ("count_tokens of a long chat", "POST", "/v1/messages/count_tokens",
     chat(messages=[{"role": "user", "content": LONG}]), 200),
    # 7. The smaller ones.
    ("id_slot 99", "POST", "/completion", {"prompt": "hi", "id_slot": 99}, 400),
    ("id_slot 2^62", "POST", "/completion", {"prompt": "hi", "id_slot": 2**62}, 400),
    ("id_slot -7 means any", "POST", "/completion", {"prompt": "hi", "n_predict": 2, "id_slot": -7}, 200),
    ("chat id_slot 99", "POST", "/v1/chat/completions", chat(id_slot=99), 400),
    ("completions id_slot 99", "POST", "/v1/completions", {"prompt": "hi", "id_slot": 99}, 400),
    ("responses id_slot 99", "POST", "/v1/responses", {"input": "hi", "id_slot": 99}, 400),
    ("anthropic id_slot 99", "POST", "/v1/messages", chat(id_slot=99), 400),
    ("GET a POST route", "GET", "/completion", None, 405),
    ("DELETE a chat", "DELETE", "/v1/chat/completions", None, 405),
    ("responses image part", "POST", "/v1/responses",
     {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}, 400),
    ("responses part without text", "POST", "/v1/responses",
     {"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, 400),
    ("tools not a list", "POST", "/v1/chat/completions", chat(tools="x"), 400),
    ("tool not an object", "POST", "/v1/chat/completions", chat(tools=[1]), 400),
    ("tool without function", "POST", "/v1/chat/completions", chat(tools=[{"type": "function"}]), 400),
    ("tool without name", "POST", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"parameters": {}}}]), 400),
    ("tool of another type", "POST", "/v1/chat/completions", chat(tools=[{"type": "retrieval"}]), 400),
    ("tool parameters a string", "POST", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]), 400),
    ("anthropic tool without name", "POST", "/v1/messages", chat(tools=[{"input_schema": {}}]), 400),
    ("apply-template bad tools", "POST", "/apply-template", {"messages": [{"role": "user", "content": "x"}], "tools": [1]}, 400),
    ("good tools", "POST", "/v1/chat/completions", chat(tools=[TOOL]), 200),
    ("message without content", "POST", "/v1/chat/completions", chat(messages=[{"role": "user"}]), 400),
    ("tool message without content", "POST", "/v1/chat/completions",
     chat(messages=[{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "1"}]), 400),
    ("null content", "POST", "/v1/chat/completions", chat(messages=[{"role": "user", "content": None}]), 200),
    ("kwargs set messages", "POST", "/v1/chat/completions", chat(chat_template_kwargs={"messages": []}), 400),
    ("kwargs set tools", "POST", "/v1/chat/completions", chat(chat_template_kwargs={"tools": [1]}), 400),
    ("kwargs set add_generation_prompt", "POST", "/v1/chat/completions",
     chat(chat_template_kwargs={"add_generation_prompt": False}), 400),
    ("kwargs not an object", "POST", "/apply-template",
     {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": "x"}, 400),
]


@pytest.mark.parametrize("name,method,path,body,expected", CASES, ids=[c[0] for c in CASES])
def test_a_hostile_request_is_answered_and_the_next_normal_one_is_unchanged(hostile, name, method, path, body,
                                                                          expected):
    raw = body if isinstance(body, bytes) else None
    r = send(hostile, method, path, body=None if raw is not None else body, raw=raw)
    assert r is not None, f"{name}: no answer"
    assert r.status_code == expected, f"{name}: {r.status_code} {r.text[:300]}"
    if expected >= 400:
        e = r.json()["error"]
        assert e["code"] == expected and e["type"] and e["message"], e
    normal_answers_the_same(hostile)


def test_n_probs_past_the_vocabulary_reports_the_whole_vocabulary_best_first(hostile):
    r = send(hostile, "POST", "/completion", {"prompt": "hi", "n_predict": 2, "n_probs": 2**62, "temperature": 0})
    probs = r.json()["completion_probabilities"]
    assert len(probs) == 2 and all(len(p["top_logprobs"]) == VOCAB for p in probs)
    top = [t["logprob"] for t in probs[0]["top_logprobs"]]
    assert top == sorted(top, reverse=True)
    assert probs[0]["top_logprobs"][0]["id"] == probs[0]["id"]  # greedy: the best one
    normal_answers_the_same(hostile)


def test_405_and_413_answer_in_the_error_shape(hostile):
    r = send(hostile, "GET", "/v1/chat/completions")
    assert r.status_code == 405 and r.headers["allow"].upper().startswith("POST")
    assert r.json()["error"]["code"] == 405
    r = send(hostile, "POST", "/completion", raw=b"x" * (4 << 20), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == 413
    normal_answers_the_same(hostile)


def test_slots_is_current_right_after_erase_and_restore(hostile):
    r = send(hostile, "POST", "/completion", {"prompt": list(range(10, 40)), "n_predict": 2, "id_slot": 3})
    assert r.json()["id_slot"] == 3
    assert send(hostile, "POST", "/slots/3?action=save", {"filename": "s3.bin"}).status_code == 200
    assert send(hostile, "POST", "/slots/3?action=erase").status_code == 200
    assert send(hostile, "GET", "/slots").json()[3]["n_cached"] == 0
    restored = send(hostile, "POST", "/slots/3?action=restore", {"filename": "s3.bin"}).json()
    assert send(hostile, "GET", "/slots").json()[3]["n_cached"] == restored["n_restored"] > 0
    normal_answers_the_same(hostile)


def test_chat_routes_honour_id_slot(hostile):
    for i, (path, body) in enumerate([("/v1/chat/completions", chat(max_tokens=2)),
                                      ("/v1/completions", {"prompt": "a prompt", "max_tokens": 2}),
                                      ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
                                      ("/v1/messages", chat(max_tokens=2))]):
        slot = i % 4
        assert send(hostile, "POST", f"/slots/{slot}?action=erase").status_code == 200
        r = send(hostile, "POST", path, {**body, "id_slot": slot})
        assert r.status_code == 200, r.text
        assert send(hostile, "GET", "/slots").json()[slot]["n_cached"] > 0, path
    normal_answers_the_same(hostile)


def test_bearer_is_case_insensitive(tiny_path):
    s = Server(tiny_path, "-c", "256", "--api-key", "k1")
    try:
        for auth, code in [("bearer k1", 200), ("BEARER k1", 200), ("Bearer k2", 401), ("Basic k1", 401), ("k1", 401)]:
            r = send(s, "POST", "/completion", {"prompt": "x", "n_predict": 1}, headers={"Authorization": auth})
            assert r.status_code == code, auth
    finally:
        s.stop()


def test_a_dropped_stream_shows_its_slot_idle(hostile):
    """A client that drops its stream frees its slot, and /slots says so even when that left
    every slot idle (the scheduler then waits for a job with no pass to publish the change)."""
    for i in range(12):
        body = {"prompt": [7, 8, 9, i], "n_predict": 400, "ignore_eos": True, "stream": True}
        with requests.post(hostile.url + "/completion", json=body, stream=True, timeout=CASE_BOUND) as r:
            for n, _ in enumerate(r.iter_lines()):
                if n >= 2:
                    break
        TALLY.note(hostile, None)
        deadline = time.time() + 5
        while any(v["is_processing"] for v in hostile.get("/slots").json()):
            assert time.time() < deadline, f"round {i}: /slots still shows the dropped request's slot busy"
            time.sleep(0.02)
    normal_answers_the_same(hostile)
