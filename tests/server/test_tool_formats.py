"""Tool calls in each family's format against the real server: the tiny random-weight model served
with each of the five templates (Hermes JSON, Qwen XML, GLM XML, DeepSeek DSML, Solar) must answer
`tool_choice` required, named and single with calls that the server parses back and that validate
against the tool's schema (`jsonschema`); streamed calls, joined by the official SDKs, equal the
whole answer; and the committed jinja2 renders the Rust tests read are what jinja2 writes."""
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import openai
import anthropic
import pytest

from conftest import ROOT, Server

TEMPLATES = ["qwen3", "qwen3.5", "glm-4.7-flash", "deepseek-v4", "solar-open-100b"]
FIXTURES = ROOT / "host/tests/fixtures/tool_calls"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "note": {"type": "string", "enum": ["sum", "total"]}},
        "required": ["a", "b"], "additionalProperties": False}}},
]
BY_NAME = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
# The random model never closes a think span by chance: the prompt closes it.
NO_THINKING = {"enable_thinking": False}


@pytest.fixture(scope="module", params=TEMPLATES)
def server(request, tiny_path):
    template = ROOT / f"text/tests/fixtures/templates/{request.param}.jinja"
    s = Server(tiny_path, "-c", "4096", "-np", "2", "--jinja", "--chat-template-file", str(template))
    yield s
    s.stop()


def chat(server, seed, **extra):
    r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "call a tool"}],
                                             "tools": TOOLS, "max_tokens": 400, "seed": seed, "temperature": 1.0,
                                             "chat_template_kwargs": NO_THINKING, **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


@pytest.mark.parametrize("seed", range(3))
def test_required_named_and_single_calls_parse_and_validate(server, seed):
    for extra, names, most in [
        ({"tool_choice": "required"}, set(BY_NAME), None),
        ({"tool_choice": {"type": "function", "function": {"name": "add"}}}, {"add"}, None),
        ({"tool_choice": "required", "parallel_tool_calls": False}, set(BY_NAME), 1),
    ]:
        choice = chat(server, seed, **extra)
        calls = choice["message"].get("tool_calls") or []
        # A random model may write calls until max_tokens: the whole ones still count.
        assert calls and choice["finish_reason"] in ("tool_calls", "length"), choice
        assert most is None or len(calls) <= most, calls
        for c in calls:
            assert c["function"]["name"] in names, c
            jsonschema.validate(json.loads(c["function"]["arguments"]), BY_NAME[c["function"]["name"]])


@pytest.mark.parametrize("seed", range(2))
def test_streamed_calls_join_to_the_whole_answer(server, seed):
    whole = chat(server, seed, tool_choice="required")["message"]["tool_calls"]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    joined = {}
    finish = None
    for chunk in client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "call a tool"}], tools=TOOLS, tool_choice="required",
            max_tokens=400, seed=seed, temperature=1.0, stream=True, extra_body={"chat_template_kwargs": NO_THINKING}):
        if not chunk.choices:
            continue
        for d in chunk.choices[0].delta.tool_calls or []:
            c = joined.setdefault(d.index, {"name": "", "arguments": ""})
            c["name"] += d.function.name or ""
            c["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish in ("tool_calls", "length")
    assert [joined[i] for i in sorted(joined)] == [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in whole]


def test_anthropic_streamed_tool_use_equals_the_whole_message(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="x")
    args = dict(model="x", max_tokens=400, messages=[{"role": "user", "content": "hi"}],
                tools=[{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS],
                tool_choice={"type": "any"}, extra_body={"chat_template_kwargs": NO_THINKING, "seed": 5})
    whole = client.messages.create(**args)
    with client.messages.stream(**args) as stream:
        streamed = stream.get_final_message()
    uses = [(b.name, b.input) for b in whole.content if b.type == "tool_use"]
    assert uses and whole.stop_reason in ("tool_use", "max_tokens")
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == uses
    for name, inp in uses:
        jsonschema.validate(inp, BY_NAME[name])


def test_the_committed_renders_are_what_jinja2_writes():
    out = subprocess.run([sys.executable, str(FIXTURES / "render_tool_calls.py")], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == json.loads((FIXTURES / "tool_call_renders.json").read_text(encoding="utf-8"))
