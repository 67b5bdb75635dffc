"""Request fields of issue 41, each as llama-server b11434 reads it (tools/server/server-schema.cpp,
server-task.cpp, server-context.cpp of the pinned sdist) or refused with a 400 naming it."""
import json

import requests

from test_errors import error_of

# A grammar that never ends and puts a newline every third character.
LINES = 'root ::= ("ab\\n")+'


def sse_frames(r):
    return [json.loads(line[6:]) for line in r.iter_lines(decode_unicode=True)
            if line.startswith("data: ") and line != "data: [DONE]"]


def test_chat_stream_sends_usage_only_with_include_usage(tiny):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    plain = sse_frames(requests.post(tiny.url + "/v1/chat/completions", json=body, stream=True))
    assert all("usage" not in f for f in plain), plain[-1]
    assert plain[-1]["choices"][0]["finish_reason"] == "length" and "timings" in plain[-1]
    body["stream_options"] = {"include_usage": True}
    frames = sse_frames(requests.post(tiny.url + "/v1/chat/completions", json=body, stream=True))
    assert frames[-1]["choices"] == [] and frames[-1]["usage"]["completion_tokens"] == 3
    body["stream_options"] = {"include_usage": "yes"}
    error_of(tiny.post("/v1/chat/completions", body), 400, "invalid_request_error")


def test_max_completion_tokens_comes_before_max_tokens(tiny):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "max_completion_tokens": 4}
    assert tiny.post("/v1/chat/completions", body).json()["usage"]["completion_tokens"] == 4


def test_t_max_predict_ms_ends_at_a_newline_once_the_time_is_up(tiny):
    body = {"prompt": "x", "n_predict": 60, "grammar": LINES, "temperature": 0}
    full = tiny.post("/completion", body).json()
    assert full["tokens_predicted"] == 60
    cut = tiny.post("/completion", {**body, "t_max_predict_ms": 1}).json()
    assert cut["tokens_predicted"] < 60 and cut["stop_type"] == "limit", cut
    assert cut["content"].endswith("\n")
    error_of(tiny.post("/completion", {**body, "t_max_predict_ms": -2}), 400, "invalid_request_error")


def test_n_keep_is_held_to_llama_servers_limits(tiny):
    assert tiny.post("/completion", {"prompt": "x", "n_predict": 1, "n_keep": -1}).status_code == 200
    e = error_of(tiny.post("/completion", {"prompt": "x", "n_predict": 1, "n_keep": -2}), 400, "invalid_request_error")
    assert "n_keep" in e["message"]


def test_several_completions_with_n_cmpl_and_n(tiny):
    r = tiny.post("/completion", {"prompt": "x", "n_predict": 2, "n_cmpl": 3}).json()
    assert [x["index"] for x in r] == [0, 1, 2]
    r = tiny.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 2}).json()
    assert [c["index"] for c in r["choices"]] == [0, 1]
    r = tiny.post("/v1/completions", {"prompt": "x", "max_tokens": 2, "n": 2}).json()
    assert len(r["choices"]) == 2
    # From 1 to the slot count (4 here), and not streamed.
    for n in (0, 5):
        e = error_of(tiny.post("/completion", {"prompt": "x", "n_cmpl": n}), 400, "invalid_request_error")
        assert "n_cmpl" in e["message"]
    e = error_of(tiny.post("/completion", {"prompt": "x", "n_cmpl": 2, "stream": True}), 400, "invalid_request_error")
    assert "stream" in e["message"]


def test_timings_per_token_puts_the_timings_so_far_in_every_token_chunk(tiny):
    body = {"prompt": "x", "n_predict": 4, "stream": True, "timings_per_token": True}
    frames = sse_frames(requests.post(tiny.url + "/completion", json=body, stream=True))
    assert [f["timings"]["predicted_n"] for f in frames[:-1]] == [1, 2, 3, 4]
    assert all(f["timings"]["prompt_n"] == frames[-1]["timings"]["prompt_n"] for f in frames)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
            "timings_per_token": True}
    frames = sse_frames(requests.post(tiny.url + "/v1/chat/completions", json=chat, stream=True))
    assert "timings" not in frames[0]
    # A token whose text the splitter holds back (a possible tag) sends no chunk of its own.
    seen = [f["timings"]["predicted_n"] for f in frames[1:-1] if f["choices"][0]["delta"]]
    assert seen and seen == sorted(set(seen)) and seen[-1] <= 3, seen
    plain = sse_frames(requests.post(tiny.url + "/completion", json={**body, "timings_per_token": False}, stream=True))
    assert all("timings" not in f for f in plain[:-1])


def test_unbuilt_switches_are_refused_by_name(tiny):
    for field in ("post_sampling_probs", "return_progress", "verbose"):
        for route, body in (("/completion", {"prompt": "x"}),
                            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
            e = error_of(tiny.post(route, {**body, "max_tokens": 1, field: True}), 400, "invalid_request_error")
            assert field in e["message"]
            assert tiny.post(route, {**body, "max_tokens": 1, field: False}).status_code == 200


def test_unbuilt_numbers_are_refused_by_name_above_zero(tiny):
    for field in ("n_indent", "n_cache_reuse"):
        e = error_of(tiny.post("/completion", {"prompt": "x", "n_predict": 1, field: 4}), 400, "invalid_request_error")
        assert field in e["message"]
        assert tiny.post("/completion", {"prompt": "x", "n_predict": 1, field: 0}).status_code == 200


def test_apply_template_reads_add_generation_prompt(tiny):
    msgs = [{"role": "user", "content": "hi"}]
    assert tiny.post("/apply-template", {"messages": msgs}).json()["prompt"].endswith("<|im_start|>assistant\n")
    off = tiny.post("/apply-template", {"messages": msgs, "add_generation_prompt": False}).json()["prompt"]
    assert "<|im_start|>assistant" not in off


def test_two_trailing_assistant_messages_are_refused(tiny):
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "assistant", "content": "c"}]
    e = error_of(tiny.post("/v1/chat/completions", {"messages": msgs}), 400, "invalid_request_error")
    assert "assistant messages" in e["message"]


def test_tools_on_a_template_without_tools_are_refused_by_name(gemma3):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "tools": [tool]}
    e = error_of(gemma3.post("/v1/chat/completions", body), 400, "invalid_request_error")
    assert "tools" in e["message"]
    assert gemma3.post("/v1/chat/completions", {**body, "tools": []}).status_code == 200
