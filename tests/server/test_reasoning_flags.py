"""`--reasoning on|off|auto` and `--reasoning-effort` as llama-server b11434 reads them: template
variables (`enable_thinking`, `reasoning_effort`), and a thinking block the template opens closed
when reasoning is off."""
import pytest

from conftest import Server

# Opens the thinking block itself (as DeepSeek-R1's and QwQ's do) and shows both variables.
TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    "[thinking={{ enable_thinking }} effort={{ reasoning_effort | default('none') }}]"
    "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}"
)
MSGS = {"messages": [{"role": "user", "content": "What is today?"}]}


def prompt_of(tiny_path, tmp_path, *flags, body=MSGS):
    t = tmp_path / "thinking.jinja"
    t.write_text(TEMPLATE)
    s = Server(tiny_path, "-c", "256", "--chat-template-file", str(t), *flags)
    try:
        r = s.post("/apply-template", body)
        assert r.status_code == 200, r.text
        return r.json()["prompt"]
    finally:
        s.stop()


@pytest.mark.parametrize("flags,end", [
    ([], "[thinking=True effort=none]<|assistant|><think>\n"),
    (["--reasoning", "on"], "[thinking=True effort=none]<|assistant|><think>\n"),
    (["-rea", "off"], "[thinking=False effort=none]<|assistant|><think>\n</think>"),
    (["--reasoning", "auto", "--reasoning-budget", "0"], "[thinking=False effort=none]<|assistant|><think>\n</think>"),
    (["--reasoning-effort", "high"], "[thinking=True effort=high]<|assistant|><think>\n"),
    (["--reasoning-effort", "default"], "[thinking=True effort=none]<|assistant|><think>\n"),
])
def test_reasoning_flags_reach_the_template(tiny_path, tmp_path, flags, end):
    assert prompt_of(tiny_path, tmp_path, *flags).endswith(end)


def test_a_requests_kwargs_override_the_flags(tiny_path, tmp_path):
    body = {**MSGS, "chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "low"}}
    p = prompt_of(tiny_path, tmp_path, "--reasoning", "off", "--reasoning-effort", "high", body=body)
    assert p.endswith("[thinking=True effort=low]<|assistant|><think>\n")


@pytest.mark.parametrize("flags,named", [
    (["--reasoning", "maybe"], "--reasoning"),
])
def test_bad_reasoning_flags_are_refused_by_name(tiny_path, flags, named):
    with pytest.raises(RuntimeError) as e:
        Server(tiny_path, "-c", "256", *flags)
    assert named in str(e.value)
