"""llama.cpp's built-in (non-Jinja) chat templates as llama-server b11434 serves them: only under
`--no-jinja`, picked by `--chat-template NAME` or detected from a template's text. Prompts are
compared with libllama's own `llama_chat_apply_template` renders
(text/tests/fixtures/builtin_templates.json, tests/oracle/make_builtin_templates_golden.sh)."""
import json
import re

import pytest

from conftest import QWEN3_TEMPLATE, ROOT, Server, run_cli

GOLDEN = json.loads((ROOT / "text/tests/fixtures/builtin_templates.json").read_text())


def golden(name, conversation, add):
    for r in GOLDEN["renders"]:
        if (r["name"], r["conversation"], r["add_generation_prompt"]) == (name, conversation, add):
            return r["prompt"]
    raise KeyError(name)


def apply(server, conversation):
    r = server.post("/apply-template", {"messages": GOLDEN["conversations"][conversation]})
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


@pytest.fixture(scope="module")
def llama3(tiny_path):
    s = Server(tiny_path, "-c", "512", "--no-jinja", "--chat-template", "llama3")
    yield s
    s.stop()


@pytest.mark.parametrize("name", [
    "command-r", "gemma", "mistral-v7", "llama2-sys", "monarch", "rwkv-world", "gigachat",
    "deepseek3", "phi4",
])
def test_a_builtin_name_renders_as_libllama(tiny_path, name):
    s = Server(tiny_path, "-c", "512", "--no-jinja", "--chat-template", name)
    try:
        for conversation in (1, 4):
            assert apply(s, conversation) == golden(name, conversation, True)
    finally:
        s.stop()


def test_props_reports_the_name(llama3):
    assert llama3.get("/props").json()["chat_template"] == "llama3"


def test_a_final_assistant_message_is_rendered_whole(llama3):
    # llama-server's prefill turns the generation prompt off; its legacy path has no continuation.
    assert apply(llama3, 3) == golden("llama3", 3, False)


def test_a_chat_completion_runs_on_the_builtin_prompt(llama3):
    r = llama3.post("/v1/chat/completions", {
        "messages": GOLDEN["conversations"][1], "max_tokens": 2, "verbose": True,
        "chat_template_kwargs": {"enable_thinking": False},
    })
    assert r.status_code == 200, r.text
    assert r.json()["__verbose"]["prompt"] == golden("llama3", 1, True)


@pytest.mark.parametrize("body,message", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
     "tools param requires --jinja flag"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "tool_choice": "none"},
     "tools param requires --jinja flag"),
    ({"tool_choice": "required"}, "tool_choice param requires --jinja flag"),
])
def test_tools_are_refused_as_llama_server_refuses_them(llama3, body, message):
    r = llama3.post("/v1/chat/completions", {"messages": GOLDEN["conversations"][0], **body})
    assert r.status_code == 400
    assert message in r.text


def test_a_template_file_is_detected(tiny_path):
    # Qwen3's Jinja template holds <|im_start|>: libllama detects ChatML.
    s = Server(tiny_path, "-c", "512", "--no-jinja", "--chat-template-file", str(QWEN3_TEMPLATE))
    try:
        want = next(f["prompt"] for f in GOLDEN["files"] if f["file"] == "Qwen-Qwen3-0.6B.jinja")
        assert apply(s, 2) == want
    finally:
        s.stop()


@pytest.mark.parametrize("flags,named", [
    (["--chat-template", "llama3"], "--no-jinja"),
    (["--no-jinja", "--chat-template", "{{ messages }}"], "the supplied chat template is not supported"),
    (["--chat-template", "no such template"], "not Jinja source"),
])
def test_unusable_templates_are_refused_at_start(tiny_path, flags, named):
    with pytest.raises(RuntimeError) as e:
        Server(tiny_path, "-c", "256", *flags)
    assert named in str(e.value)


def test_run_chat_takes_a_builtin_name(tiny_path, llama3):
    conv = GOLDEN["conversations"][0]
    rc, out = run_cli("run", "-m", str(tiny_path), "-p", conv[0]["content"], "--chat", "--no-jinja",
                      "--chat-template", "llama3", "-n", "1", "--temp", "0")
    assert rc == 0, out
    n_prompt = int(re.search(r"prompt eval time = .* / +(\d+) tokens", out).group(1))
    want = llama3.post("/tokenize", {"content": golden("llama3", 0, True), "add_special": True}).json()
    assert n_prompt == len(want["tokens"])


@pytest.mark.parametrize("flags,named", [
    (["--chat", "--chat-template", "llama3"], "--no-jinja"),
    (["--no-jinja"], "apply to --chat"),
])
def test_run_refuses_unusable_template_flags(tiny_path, flags, named):
    rc, out = run_cli("run", "-m", str(tiny_path), "-p", "Hi", "-n", "1", *flags)
    assert rc != 0 and named in out, out
