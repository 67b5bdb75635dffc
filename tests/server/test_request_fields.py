"""Request fields of issue 41, each as llama-server b11434 reads it (tools/server/server-schema.cpp,
server-task.cpp, server-context.cpp of the pinned sdist) or refused with a 400 naming it."""
import json
import math

import pytest
import requests

from conftest import QWEN3_TEMPLATE, Server, sse_lines
from test_errors import error_of

# A grammar that never ends and puts a newline every third character.
LINES = 'root ::= ("ab\\n")+'


def sse_frames(r):
    return sse_frames_of(sse_lines(r))



def sse_frames_of(lines):
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


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
    # From 1 to the slot count (4 here).
    for n in (0, 5):
        e = error_of(tiny.post("/completion", {"prompt": "x", "n_cmpl": n}), 400, "invalid_request_error")
        assert "n_cmpl" in e["message"]


def test_several_completions_stream_each_with_its_index(tiny):
    # As llama-server b11434 streams child tasks (server-context.cpp handle_completions_impl):
    # every chunk is one completion's, with its index; each ends with its own final chunk.
    body = {"prompt": "x", "n_predict": 3, "n_cmpl": 3, "stream": True, "seed": 5}
    frames = sse_frames(requests.post(tiny.url + "/completion", json=body, stream=True))
    finals = [f for f in frames if f["stop"]]
    assert sorted(f["index"] for f in finals) == [0, 1, 2]
    for i in range(3):
        mine = [f for f in frames if f["index"] == i]
        assert [f["tokens_predicted"] for f in mine[:-1]] == [1, 2, 3] and mine[-1]["stop"]
    # The streamed tokens are each completion's: as the same request answers unstreamed.
    whole = tiny.post("/completion", {**body, "stream": False}).json()
    assert [w["content"] for w in whole] == ["".join(f["content"] for f in frames if f["index"] == i) for i in range(3)]
    # Two prompts, twice each: four completions, in prompt order.
    frames = sse_frames(requests.post(tiny.url + "/completion", json={**body, "prompt": ["x", "y"], "n_cmpl": 2}, stream=True))
    assert sorted(f["index"] for f in frames if f["stop"]) == [0, 1, 2, 3]

    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "n": 2, "stream": True, "seed": 5,
            "stream_options": {"include_usage": True}}
    lines = [l for l in sse_lines(requests.post(tiny.url + "/v1/chat/completions", json=chat, stream=True)) if l]
    assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1
    frames = sse_frames_of(lines)
    ends = [f["choices"][0] for f in frames if f["choices"] and f["choices"][0]["finish_reason"]]
    assert sorted(c["index"] for c in ends) == [0, 1]
    assert len([f for f in frames if "usage" in f]) == 2
    texts = ["".join(f["choices"][0]["delta"].get("content") or "" for f in frames
                     if f["choices"] and f["choices"][0]["index"] == i) for i in range(2)]
    unstreamed = tiny.post("/v1/chat/completions", {**chat, "stream": False}).json()["choices"]
    assert texts == [c["message"]["content"] for c in unstreamed]

    lines = [l for l in sse_lines(requests.post(tiny.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3, "n": 2,
                                                                                   "stream": True}, stream=True)) if l]
    assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1
    ends = [f["choices"][0] for f in sse_frames_of(lines) if f["choices"][0]["finish_reason"]]
    assert sorted(c["index"] for c in ends) == [0, 1]


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


def test_post_sampling_probs_are_the_chains_candidates(tiny):
    # As llama-server b11434 (server-context.cpp populate_token_probs, server-task.cpp
    # probs_vector_to_json): the candidates the sampler chain drew from, best first, none of
    # probability 0, under "prob" and "top_probs".
    body = {"prompt": "x", "n_predict": 6, "n_probs": 10, "post_sampling_probs": True,
            "temperature": 1.0, "top_k": 4, "top_p": 1.0, "min_p": 0.0, "seed": 3, "ignore_eos": False}
    r = tiny.post("/completion", body).json()
    assert r["generation_settings"]["post_sampling_probs"] is True
    toks = r["completion_probabilities"]
    assert len(toks) == 6
    for t in toks:
        assert "logprob" not in t and "top_logprobs" not in t
        top = t["top_probs"]
        # top-k 4 leaves four candidates, all of them reported (n_probs 10), summing to 1.
        assert len(top) == 4 and sum(p["prob"] for p in top) == pytest.approx(1.0, abs=1e-5)
        assert [p["prob"] for p in top] == sorted((p["prob"] for p in top), reverse=True)
        assert t["prob"] == pytest.approx(next(p["prob"] for p in top if p["id"] == t["id"]))
    # With the chain an identity (no cut, temperature 1) they are the softmax of the logits:
    # exp of the pre-sampling log-probabilities of the same draws.
    wide = {**body, "top_k": 0}
    post = tiny.post("/completion", wide).json()["completion_probabilities"]
    pre = tiny.post("/completion", {**wide, "post_sampling_probs": False}).json()["completion_probabilities"]
    assert [t["id"] for t in post] == [t["id"] for t in pre]
    for a, b in zip(post, pre):
        assert a["prob"] == pytest.approx(math.exp(b["logprob"]), rel=1e-4)
        assert [p["id"] for p in a["top_probs"]] == [p["id"] for p in b["top_logprobs"]]
    # Greedy leaves one candidate, of probability 1.
    greedy = tiny.post("/completion", {**body, "temperature": 0}).json()["completion_probabilities"]
    assert all(t["top_probs"] == [{**t["top_probs"][0], "id": t["id"], "prob": 1.0}] and t["prob"] == 1.0
               for t in greedy), greedy[0]
    # The OpenAI shape carries the same keys, streamed too.
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": True,
            "top_logprobs": 5, "post_sampling_probs": True, "temperature": 1.0, "top_k": 3}
    content = tiny.post("/v1/chat/completions", chat).json()["choices"][0]["logprobs"]["content"]
    assert content and all(0 < len(c["top_probs"]) <= 3 and 0 < c["prob"] <= 1 for c in content)
    frames = sse_frames(requests.post(tiny.url + "/v1/chat/completions", json={**chat, "stream": True}, stream=True))
    streamed = [c for f in frames if f.get("choices") and f["choices"][0].get("logprobs")
                for c in f["choices"][0]["logprobs"]["content"]]
    assert streamed and all("top_probs" in c and "prob" in c for c in streamed)


@pytest.fixture(scope="module")
def small_batches(tiny_path):
    """The tiny model with passes of 64 rows, so that a short prompt takes several."""
    s = Server(tiny_path, "-c", "1024", "-np", "1", "-b", "64", "-ub", "64")
    yield s
    s.stop()


def test_return_progress_streams_the_prompts_progress(small_batches):
    # As llama-server b11434 (server-context.cpp send_partial_response with is_progress): a
    # report when the slot takes the request (processed = cache) and one after each pass that
    # evaluates part of the prompt; the prompt here takes three passes of 64 rows.
    srv = small_batches
    body = {"prompt": [5] * 150, "n_predict": 2, "stream": True, "return_progress": True,
            "timings_per_token": True}

    def progress(route, body):
        frames = sse_frames(requests.post(srv.url + route, json=body, stream=True))
        return frames, [f for f in frames if "prompt_progress" in f]

    frames, reports = progress("/completion", body)
    seen = [(r["prompt_progress"]["total"], r["prompt_progress"]["cache"], r["prompt_progress"]["processed"])
            for r in reports]
    assert seen == [(150, 0, 0), (150, 0, 64), (150, 0, 128), (150, 0, 150)], seen
    assert all(r["content"] == "" and r["tokens"] == [] and r["stop"] is False for r in reports)
    assert reports[0]["timings"]["prompt_n"] == 0 and reports[0]["timings"]["prompt_ms"] == 0.0
    assert reports[-1]["timings"]["prompt_n"] == 150
    # Progress comes before the first token.
    assert frames.index(reports[-1]) < next(i for i, f in enumerate(frames) if f.get("tokens"))
    # The same prompt again: all but its last token come from the slot's cache.
    _, again = progress("/completion", body)
    assert [(r["prompt_progress"]["cache"], r["prompt_progress"]["processed"]) for r in again] == [(149, 149), (149, 150)]
    # Without a stream there is nothing to report to.
    whole = srv.post("/completion", {**body, "stream": False}).json()
    assert "prompt_progress" not in whole and whole["tokens_predicted"] == 2
    # The OpenAI shapes: a role delta, a text chunk and an in-progress event carry it.
    text = "x " * 100
    chat = {"messages": [{"role": "user", "content": text}], "max_tokens": 2, "stream": True,
            "return_progress": True, "cache_prompt": False}
    _, reports = progress("/v1/chat/completions", chat)
    assert len(reports) >= 3 and all(r["choices"][0]["delta"] == {"role": "assistant", "content": None} for r in reports)
    assert reports[-1]["prompt_progress"]["processed"] == reports[-1]["prompt_progress"]["total"]
    _, reports = progress("/v1/completions", {"prompt": text, "max_tokens": 2, "stream": True,
                                               "return_progress": True, "cache_prompt": False})
    assert len(reports) >= 3 and all(r["choices"][0]["text"] == "" for r in reports)
    events = sse_frames(requests.post(srv.url + "/v1/responses", json={
        "input": text, "max_output_tokens": 2, "stream": True, "return_progress": True,
        "timings_per_token": True, "cache_prompt": False}, stream=True))
    reports = [e for e in events if "prompt_progress" in e]
    assert len(reports) >= 3 and all(e["type"] == "response.in_progress" for e in reports)
    assert all("timings" in e for e in events if e["type"] == "response.output_text.delta")
    assert "timings" in events[-1] and events[-1]["type"] == "response.completed"


def test_ignore_eos_bans_every_end_of_generation_token_by_a_logit_bias(tiny):
    # As llama-server b11434 (server-schema.cpp's ignore_eos handler, common.cpp's
    # logit_bias_eog): the biases are listed in generation_settings, -inf shown as null.
    body = {"prompt": "x", "n_predict": 4, "temperature": 0, "ignore_eos": False}
    assert tiny.post("/completion", body).json()["generation_settings"]["logit_bias"] == []
    banned = tiny.post("/completion", {**body, "ignore_eos": True}).json()["generation_settings"]["logit_bias"]
    assert banned and all(b["bias"] is None for b in banned)
    eog = [b["token"] for b in banned]
    # An end-of-generation token pushed to the top ends the reply at once, unless ignore_eos bans it.
    pushed = {**body, "logit_bias": [[eog[0], 100]]}
    r = tiny.post("/completion", pushed).json()
    assert r["stop_type"] == "eos" and r["tokens_predicted"] == 1
    r = tiny.post("/completion", {**pushed, "ignore_eos": True, "return_tokens": True}).json()
    assert r["stop_type"] == "limit" and r["tokens_predicted"] == 4 and not set(r["tokens"]) & set(eog)
    assert r["generation_settings"]["logit_bias"][0] == {"bias": 100.0, "token": eog[0]}


def test_verbose_adds_the_native_answer_as_llama_server_does(tiny):
    """`verbose` (llama-server's server-task.cpp): OpenAI answers carry `__verbose`, the native
    answer of the request; a streamed chat's finish chunk carries it with empty text, and each
    streamed completion token carries its partial native object."""
    chat = {"messages": [{"role": "system", "content": "Book"}, {"role": "user", "content": "best book?"}],
            "max_tokens": 3, "temperature": 0}
    on = tiny.post("/v1/chat/completions", {**chat, "verbose": True}).json()
    v = on["__verbose"]
    assert "Book" in v["prompt"] and v["prompt"].endswith("<|im_start|>assistant\n")
    assert v["tokens_predicted"] == on["usage"]["completion_tokens"] and v["stop"] is True
    assert v["tokens_evaluated"] == on["usage"]["prompt_tokens"]
    assert v["content"] == on["choices"][0]["message"]["content"]
    assert "__verbose" not in tiny.post("/v1/chat/completions", {**chat, "verbose": False}).json()
    assert "__verbose" not in tiny.post("/v1/chat/completions", chat).json()
    frames = sse_frames(requests.post(tiny.url + "/v1/chat/completions", json={**chat, "verbose": True, "stream": True}, stream=True))
    carrying = [f for f in frames if "__verbose" in f]
    assert len(carrying) == 1 and carrying[0]["choices"][0]["finish_reason"] is not None
    assert carrying[0]["__verbose"]["content"] == "" and carrying[0]["__verbose"]["tokens"] == []
    cmpl = {"prompt": "Once upon", "max_tokens": 3, "temperature": 0}
    whole = tiny.post("/v1/completions", {**cmpl, "verbose": True}).json()
    assert whole["__verbose"]["prompt"] == "Once upon" and whole["__verbose"]["content"] == whole["choices"][0]["text"]
    frames = sse_frames(requests.post(tiny.url + "/v1/completions", json={**cmpl, "verbose": True, "stream": True}, stream=True))
    tokens = [f for f in frames if f["choices"][0]["finish_reason"] is None]
    assert len(tokens) == 3
    assert [f["__verbose"]["tokens_predicted"] for f in tokens] == [1, 2, 3]
    assert all(f["__verbose"]["content"] == f["choices"][0]["text"] and len(f["__verbose"]["tokens"]) == 1
               and f["__verbose"]["stop"] is False for f in tokens)
    assert frames[-1]["__verbose"]["stop"] is True and frames[-1]["__verbose"]["tokens_predicted"] == 3


def test_verbose_flag_makes_it_the_default(tiny_path):
    s = Server(tiny_path, "-c", "1024", "--chat-template-file", str(QWEN3_TEMPLATE), "--verbose")
    try:
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        assert "__verbose" in s.post("/v1/chat/completions", chat).json()
        assert "__verbose" not in s.post("/v1/chat/completions", {**chat, "verbose": False}).json()
    finally:
        s.stop()


def test_a_final_assistant_message_is_continued(tiny, tiny_path):
    """llama-server's assistant prefill (on by default) and `continue_final_message`: the prompt
    ends with the message's text instead of a new assistant turn; the rules of
    server-common.cpp's oaicompat_chat_params_parse are 400s."""
    msgs = [{"role": "user", "content": "Name a book"}, {"role": "assistant", "content": "The best book is"}]
    r = tiny.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "verbose": True}).json()
    prompt = r["__verbose"]["prompt"]
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nThe best book is"), prompt
    assert tiny.post("/apply-template", {"messages": msgs}).json()["prompt"] == prompt
    # The answer goes on from the prefilled text: it is content, not a thinking span.
    assert r["choices"][0]["message"].get("reasoning_content") is None
    explicit = tiny.post("/apply-template", {"messages": msgs, "continue_final_message": True,
                                             "add_generation_prompt": False}).json()["prompt"]
    assert explicit == prompt
    thinking = [msgs[0], {"role": "assistant", "content": "", "reasoning_content": "Let me think"}]
    t = tiny.post("/v1/chat/completions", {"messages": thinking, "max_tokens": 2, "verbose": True}).json()
    assert t["__verbose"]["prompt"].endswith("<|im_start|>assistant\n<think>\nLet me think")
    assert t["choices"][0]["message"]["reasoning_content"] is not None
    for body, needle in (
        ({"messages": msgs, "continue_final_message": True}, "Cannot set both add_generation_prompt"),
        ({"messages": msgs + [{"role": "assistant", "content": "x"}]}, "2 or more assistant messages"),
        ({"messages": [msgs[0], {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, "contains tool calls"),
        ({"messages": msgs, "continue_final_message": "everything", "add_generation_prompt": False}, "continue_final_message"),
    ):
        e = error_of(tiny.post("/v1/chat/completions", {**body, "max_tokens": 1}), 400, "invalid_request_error")
        assert needle in e["message"], e
    s = Server(tiny_path, "-c", "1024", "--chat-template-file", str(QWEN3_TEMPLATE), "--no-prefill-assistant")
    try:
        whole_turn = s.post("/apply-template", {"messages": msgs}).json()["prompt"]
        assert whole_turn.endswith("The best book is<|im_end|>\n<|im_start|>assistant\n"), whole_turn
    finally:
        s.stop()


def test_unbuilt_numbers_are_refused_by_name_above_zero(tiny):
    for field in ("n_indent",):
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


def test_tools_on_a_template_without_tools_are_described_and_read_back(gemma3):
    # llama-server b11434 passes tools to such a template, which drops them, and reads the reply
    # as content. bloomery describes them in the system message and holds the reply to one JSON
    # object of calls (or, with auto, an answer), read back into tool calls.
    tool = {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    prompt = gemma3.post("/apply-template", {"messages": msgs, "tools": [tool]}).json()["prompt"]
    assert "get_weather" in prompt and '"response"' in prompt
    plain = gemma3.post("/apply-template", {"messages": msgs, "tools": [tool], "tool_choice": "none"}).json()["prompt"]
    assert "get_weather" not in plain
    body = {"messages": msgs, "tools": [tool], "tool_choice": "required", "parallel_tool_calls": False,
            "max_tokens": 60, "temperature": 0}
    r = gemma3.post("/v1/chat/completions", body).json()["choices"][0]
    assert r["finish_reason"] == "tool_calls", r
    [call] = r["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
    frames = sse_frames(requests.post(gemma3.url + "/v1/chat/completions", json={**body, "stream": True}, stream=True))
    deltas = [f["choices"][0]["delta"] for f in frames if f["choices"]]
    streamed = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert streamed[0]["function"]["name"] == "get_weather"
    assert "".join(t["function"]["arguments"] for t in streamed) == call["function"]["arguments"]
    assert not any(d.get("content") for d in deltas)
    msg = gemma3.post("/v1/messages", {"messages": msgs, "max_tokens": 60, "temperature": 0,
                                       "tools": [{"name": "get_weather", "input_schema": tool["function"]["parameters"]}],
                                       "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}).json()
    assert msg["stop_reason"] == "tool_use" and msg["content"][-1]["name"] == "get_weather", msg


@pytest.mark.parametrize("field, value", [
    ("backend_sampling", True), ("parse_tool_calls", True), ("echo", True), ("grammar_lazy", True),
    ("chat_format", 2), ("chat_parser", "peg"), ("generation_prompt", "<think>"),
    ("lora", [{"id": 0, "scale": 1.0}]), ("grammar_triggers", [{"type": 1, "value": "<tool_call>"}]),
    ("preserved_tokens", ["<tool_call>"]),
])
def test_llama_server_fields_not_built_are_refused_by_name_and_their_defaults_accepted(tiny, field, value):
    # The fields of llama-server b11434's request schema (tools/server/server-schema.cpp) that ask
    # for what bloomery has not built: a 400 naming the field, never accepted and ignored.
    body = {"prompt": "x", "n_predict": 1}
    e = error_of(tiny.post("/completion", {**body, field: value}), 400, "invalid_request_error")
    assert e["message"].startswith(f'"{field}": '), e
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, field: value}
    e = error_of(tiny.post("/v1/chat/completions", chat), 400, "invalid_request_error")
    assert e["message"].startswith(f'"{field}": '), e
    default = {bool: False, int: 0, str: "", list: []}[type(value)]
    assert tiny.post("/completion", {**body, field: default}).status_code == 200


def test_special_shows_special_tokens_text_as_llama_servers_sp(tiny, tiny_path):
    # llama-server b11434's -sp/--special: every special token's text in the output and in the
    # probabilities (the tokenizer's <|im_start|> here, pushed to the top); without it such a
    # token reads as "" in both.
    body = {"prompt": "x", "n_predict": 2, "logit_bias": [[510, 100]], "temperature": 0, "return_tokens": True,
            "n_probs": 1}
    plain = tiny.post("/completion", body).json()
    assert plain["tokens"] == [510, 510] and plain["content"] == "", plain
    assert plain["completion_probabilities"][0]["token"] == "", plain["completion_probabilities"][0]
    s = Server(tiny_path, "-c", "512", "-sp")
    try:
        shown = s.post("/completion", body).json()
        assert shown["content"] == "<|im_start|><|im_start|>", shown
        assert shown["completion_probabilities"][0]["token"] == "<|im_start|>", shown
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0,
                "logit_bias": {"510": 100}}
        msg = s.post("/v1/chat/completions", chat).json()["choices"][0]["message"]
        assert msg["content"] == "<|im_start|><|im_start|>", msg
    finally:
        s.stop()
