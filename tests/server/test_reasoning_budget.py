"""The reasoning budget as llama-server b11434 applies it (`common/reasoning-budget.cpp`):
`--reasoning-budget N`, `--reasoning-budget-message`, the request's `reasoning_budget_tokens`
(`thinking_budget_tokens`, Anthropic's `thinking.budget_tokens`) and `reasoning_budget_message`.
Inside a thinking span the prompt opened, N generated tokens are free; then the message and
`</think>` are forced token by token. Greedy decoding, so a budgeted reply's free tokens are the
first tokens of the same reply without a budget."""
import pytest

from conftest import Server, sse_lines

# Opens the thinking span itself (DeepSeek-R1, QwQ, Qwen3.6 with thinking on).
TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}"
    "{# the span ends with </think> #}"
)
MSGS = [{"role": "user", "content": "What is today?"}]


def thinking_server(tiny_path, tmp_path_factory, *flags):
    """The tiny file served with a template that opens a thinking span, reasoning left in the
    content."""
    t = tmp_path_factory.mktemp("budget") / "thinking.jinja"
    t.write_text(TEMPLATE)
    return Server(tiny_path, *flags, "--chat-template-file", str(t), "--reasoning-format", "none")


@pytest.fixture(scope="module")
def thinking(tiny_path, tmp_path_factory):
    s = thinking_server(tiny_path, tmp_path_factory, "-c", "512", "-np", "2")
    yield s
    s.stop()


def chat_tokens(s, **fields):
    body = {"messages": MSGS, "max_tokens": 24, "temperature": 0, "logprobs": True,
            "top_logprobs": 1, **fields}
    r = s.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    return [t["token"] for t in r.json()["choices"][0]["logprobs"]["content"]]


def forced_at(tokens, n, text):
    """The tokens from `n` on spell `text` at their start."""
    return "".join(tokens[n:])[: len(text)] == text


@pytest.mark.parametrize("n", [0, 1, 5])
def test_the_end_is_forced_after_n_free_tokens(thinking, n):
    free = chat_tokens(thinking)
    assert "</think>" not in "".join(free[:n + 3]), "the model ends its span itself: a weak test"
    got = chat_tokens(thinking, reasoning_budget_tokens=n)
    assert got[:n] == free[:n]
    assert forced_at(got, n, "</think>"), got


def test_the_message_comes_before_the_end(thinking):
    got = chat_tokens(thinking, reasoning_budget_tokens=2, reasoning_budget_message=" Enough.")
    assert forced_at(got, 2, " Enough.</think>"), got


def test_thinking_budget_tokens_is_its_other_name(thinking):
    assert chat_tokens(thinking, thinking_budget_tokens=3) == chat_tokens(
        thinking, reasoning_budget_tokens=3)


def test_no_budget_is_unlimited(thinking):
    assert chat_tokens(thinking, reasoning_budget_tokens=-1) == chat_tokens(thinking)


def test_anthropic_thinking_budget(thinking):
    free = chat_tokens(thinking)
    body = {"model": "m", "max_tokens": 24, "temperature": 0, "messages": MSGS,
            "thinking": {"type": "enabled", "budget_tokens": 2}}
    r = thinking.post("/v1/messages", body)
    assert r.status_code == 200, r.text
    text = "".join(b.get("text", "") for b in r.json()["content"])
    assert text.startswith("".join(free[:2]) + "</think>"), text


def test_the_server_flags_set_the_default(tiny_path, tmp_path):
    t = tmp_path / "thinking.jinja"
    t.write_text(TEMPLATE)
    s = Server(tiny_path, "-c", "512", "--chat-template-file", str(t), "--reasoning-format", "none",
               "--reasoning-budget", "3", "--reasoning-budget-message", " Stop.")
    try:
        got = chat_tokens(s)
        assert forced_at(got, 3, " Stop.</think>"), got
        # A request's own budget wins; -1 asks for the server's.
        assert forced_at(chat_tokens(s, reasoning_budget_tokens=1), 1, " Stop.</think>")
        assert chat_tokens(s, reasoning_budget_tokens=-1) == got
    finally:
        s.stop()


def test_a_raw_completion_names_its_span(thinking):
    free = thinking.post("/completion", {"prompt": "Hello", "n_predict": 12, "temperature": 0,
                                         "return_tokens": True}).json()
    # The span opens with the model's own first token, so its budget counts from the second.
    first = thinking.post("/detokenize", {"tokens": free["tokens"][:1]}).json()["content"]
    body = {"prompt": "Hello", "n_predict": 12, "temperature": 0, "reasoning_budget_tokens": 2,
            "reasoning_budget_start_tag": first, "reasoning_budget_end_tags": ["</think>"]}
    r = thinking.post("/completion", body)
    assert r.status_code == 200, r.text
    free_text = thinking.post("/detokenize", {"tokens": free["tokens"][:3]}).json()["content"]
    assert r.json()["content"].startswith(free_text + "</think>"), (free_text, r.json()["content"])


@pytest.mark.parametrize("path,field,value", [
    ("/v1/chat/completions", "reasoning_budget_tokens", -2),
    ("/v1/chat/completions", "reasoning_budget_tokens", "many"),
    # Only OpenAI chat answers carry the id /v1/chat/completions/control names.
    ("/v1/messages", "reasoning_control", True),
    ("/completion", "reasoning_control", True),
])
def test_bad_or_unbuilt_fields_are_refused_by_name(thinking, path, field, value):
    r = thinking.post(path, {"messages": MSGS, "prompt": "Hi", "max_tokens": 4, field: value})
    assert r.status_code == 400
    assert field in r.json()["error"]["message"]


def control(s, cmpl_id, action="reasoning_end"):
    return s.post("/v1/chat/completions/control", {"id": cmpl_id, "action": action})


@pytest.fixture(scope="module")
def long_thinking(tiny_path, tmp_path_factory):
    s = thinking_server(tiny_path, tmp_path_factory, "-c", "8192", "-np", "1")
    yield s
    s.stop()


def streamed(s, body, on_first):
    """A streamed chat answer's id and text; `on_first(id)` runs once the first token arrives,
    while the rest is still being generated."""
    import json

    import requests

    text, cmpl_id = [], None
    with requests.post(s.url + "/v1/chat/completions", json={**body, "stream": True}, stream=True,
                       timeout=300) as r:
        assert r.status_code == 200, r.text
        for line in sse_lines(r):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            c = json.loads(line[len("data: "):])
            delta = c["choices"][0]["delta"] if c.get("choices") else {}
            if delta.get("content"):
                if cmpl_id is None:
                    cmpl_id = c["id"]
                    on_first(cmpl_id)
                text.append(delta["content"])
    return cmpl_id, "".join(text)


def test_reasoning_control_ends_the_span_of_a_running_completion(long_thinking):
    """llama-server's reasoning_control: POST /v1/chat/completions/control {id, "reasoning_end"}
    forces the span's end (the budget's forced sequence) at the completion's next token; the
    tokens before are the free answer's."""
    body = {"messages": MSGS, "max_tokens": 1500, "temperature": 0}
    free = long_thinking.post("/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
    assert "</think>" not in free, "the model ends its span itself: a weak test"
    answers = []
    cmpl_id, text = streamed(long_thinking, {**body, "reasoning_control": True},
                             lambda i: answers.append(control(long_thinking, i).json()))
    assert answers == [{"success": True}], answers
    cut = text.find("</think>")
    assert 0 < cut < len(free) and text[:cut] == free[:cut], (cut, text[:80], free[:80])
    # Finished: no completion of that id runs any more.
    assert control(long_thinking, cmpl_id).json() == {
        "success": False, "message": "no active completion for this id"}


def test_control_of_a_completion_that_did_not_ask_for_it_is_refused(long_thinking):
    body = {"messages": MSGS, "max_tokens": 300, "temperature": 0}
    answers = []
    _, text = streamed(long_thinking, body, lambda i: answers.append(control(long_thinking, i).json()))
    assert answers == [{"success": False, "message": "reasoning control not enabled for this completion"}]
    assert "</think>" not in text


@pytest.mark.parametrize("body,message", [
    ({"action": "reasoning_end"}, "missing completion id"),
    ({"id": "chatcmpl-x", "action": "stop"}, "unknown control action"),
])
def test_control_requests_name_what_is_wrong(long_thinking, body, message):
    r = long_thinking.post("/v1/chat/completions/control", body)
    assert r.status_code == 400 and r.json()["error"]["message"] == message, r.text


def test_a_budget_below_minus_one_is_refused_at_start(tiny_path):
    with pytest.raises(RuntimeError) as e:
        Server(tiny_path, "-c", "256", "--reasoning-budget", "-2")
    assert "--reasoning-budget" in str(e.value)
