"""Structured output against the real server: grammar, json_schema and response_format on every
route, llama-server's 400s, answers of a random-weight model that validate with the `jsonschema`
package, and schemajump giving the same tokens on and off (greedy and seeded)."""
import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from conftest import QWEN3_TEMPLATE, Server

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "kind": {"enum": ["alpha", "beta", "gamma"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
    },
    "required": ["name", "kind", "age", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def pair(tiny_path):
    """The tiny model served twice: schemajump on (the default) and off."""
    on = Server(tiny_path, "-c", "8192", "-np", "4", "--metrics", "--chat-template-file", str(QWEN3_TEMPLATE))
    off = Server(tiny_path, "-c", "8192", "-np", "4", "--no-schemajump", "--chat-template-file", str(QWEN3_TEMPLATE))
    yield on, off
    on.stop()
    off.stop()


def complete(server, seed, temperature, schema=SCHEMA, **extra):
    r = server.post("/completion", {"prompt": f"record {seed}:", "json_schema": schema, "n_predict": 200,
                                    "temperature": temperature, "seed": seed, "return_tokens": True, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_random_weight_answers_validate(pair):
    on, _ = pair
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda s: complete(on, s, 1.0), range(120)))
    for out in outs:
        assert out["stop_type"] == "eos", out
        jsonschema.validate(json.loads(out["content"]), SCHEMA)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_schemajump_on_and_off_give_the_same_tokens(pair, temperature):
    on, off = pair
    forced = 0
    for seed in range(6):
        a, b = complete(on, seed, temperature), complete(off, seed, temperature)
        assert a["tokens"] == b["tokens"] and a["content"] == b["content"]
        assert b["timings"]["forced_n"] == 0 and "draft_n" not in b["timings"]
        assert a["timings"].get("draft_n_accepted", 0) <= a["timings"].get("draft_n", 0)
        forced += a["timings"]["forced_n"]
        # The grammar's own time, given only with a grammar, is part of the decode time.
        assert 0 < a["timings"]["grammar_ms"] < a["timings"]["predicted_ms"] + a["timings"]["prompt_ms"]
    assert forced > 0
    plain = on.post("/completion", {"prompt": "x", "n_predict": 4}).json()
    assert "grammar_ms" not in plain["timings"]
    metrics = on.get("/metrics").text
    for name in ("tokens_forced_total", "tokens_drafted_total", "tokens_drafted_accepted_total"):
        assert f"llamacpp:{name}" in metrics


def test_grammar_field_and_chat_response_format(pair):
    on, _ = pair
    r = on.post("/completion", {"prompt": "x", "grammar": 'root ::= "yes" | "no"', "n_predict": 8})
    assert r.status_code == 200 and r.json()["content"] in ("yes", "no"), r.text
    r = on.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200,
                                         "response_format": {"type": "json_schema",
                                                             "json_schema": {"name": "r", "schema": SCHEMA}}})
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), SCHEMA)
    r = on.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 300,
                                         "response_format": {"type": "json_object"}})
    assert r.status_code == 200, r.text
    r = on.post("/v1/responses", {"input": "hi", "max_output_tokens": 200,
                                  "text": {"format": {"type": "json_schema", "name": "r", "schema": SCHEMA}}})
    assert r.status_code == 200, r.text
    text = r.json()["output"][-1]["content"][0]["text"]
    jsonschema.validate(json.loads(text), SCHEMA)


def test_openai_sdk_parses_a_schema_answer(pair):
    openai = pytest.importorskip("openai")
    on, _ = pair
    client = openai.OpenAI(base_url=on.url + "/v1", api_key="none")
    out = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=200,
                                         response_format={"type": "json_schema",
                                                          "json_schema": {"name": "r", "schema": SCHEMA}})
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)


@pytest.mark.parametrize("route,body,says", [
    ("/completion", {"prompt": "x", "grammar": 'root ::= "a"', "json_schema": {}}, "Cannot use both"),
    ("/completion", {"prompt": "x", "grammar": "root ::= [a"}, "line 1, column 12"),
    ("/completion", {"prompt": "x", "grammar": "item ::= \"a\""}, "root"),
    ("/completion", {"prompt": "x", "json_schema": {"properties": {"a": {"type": "string", "format": "email"}}}},
     "#/properties/a"),
    ("/completion", {"prompt": "x", "json_schema": {"$ref": "#/$defs/none"}}, "unresolved $ref"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "yaml"}}, "but got: yaml"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "grammar": 'root ::= "a"',
                              "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
     "Cannot use custom grammar constraints with tools"),
])
def test_llama_server_refusals(pair, route, body, says):
    on, _ = pair
    r = on.post(route, body)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"], r.text


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["a", "b"], "additionalProperties": False}}},
]
BY_NAME = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def chat_tools(server, seed, **extra):
    r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "call a tool"}],
                                             "tools": TOOLS, "max_tokens": 300, "seed": seed,
                                             "temperature": 1.0,
                                             # The tiny model's Qwen3 template may open a think
                                             # span, which a random model need not close.
                                             "chat_template_kwargs": {"enable_thinking": False},
                                             **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


@pytest.mark.parametrize("seed", range(4))
def test_tool_choice_required_named_and_single(pair, seed):
    on, _ = pair
    for extra, names, most in [
        ({"tool_choice": "required"}, set(BY_NAME), None),
        ({"tool_choice": {"type": "function", "function": {"name": "add"}}}, {"add"}, None),
        ({"tool_choice": "required", "parallel_tool_calls": False}, set(BY_NAME), 1),
    ]:
        choice = chat_tools(on, seed, **extra)
        calls = choice["message"].get("tool_calls") or []
        assert calls, choice
        assert most is None or len(calls) <= most, calls
        for c in calls:
            assert c["function"]["name"] in names, c
            jsonschema.validate(json.loads(c["function"]["arguments"]), BY_NAME[c["function"]["name"]])


def test_tool_choice_none_offers_and_parses_nothing(pair):
    on, _ = pair
    choice = chat_tools(on, 3, tool_choice="none", max_tokens=20)
    assert not choice["message"].get("tool_calls")


def test_anthropic_tool_choice_any_gives_tool_use(pair):
    on, _ = pair
    r = on.post("/v1/messages", {"model": "x", "max_tokens": 300, "messages": [{"role": "user", "content": "hi"}],
                                 "tools": [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
                                           for t in TOOLS],
                                 "tool_choice": {"type": "any"},
                                 # A random model need not close a think span within max_tokens.
                                 "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200, r.text
    uses = [b for b in r.json()["content"] if b["type"] == "tool_use"]
    assert uses, r.json()
    for u in uses:
        jsonschema.validate(u["input"], BY_NAME[u["name"]])


def test_server_default_schema_and_grammar(tiny_path, tmp_path):
    """`-j`/`--json-schema-file` and `--grammar`/`--grammar-file` set the grammar of requests that
    bring none, as llama-server's (`common/arg.cpp` sets `sampling.grammar`; a request's
    `grammar` or `json_schema` replaces it); /props lists its text."""
    small = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
             "required": ["n"], "additionalProperties": False}
    schema_file = tmp_path / "small.json"
    schema_file.write_text(json.dumps(small))
    gbnf_file = tmp_path / "ab.gbnf"
    gbnf_file.write_text('root ::= "ab" [0-9]')
    for flags, check in [
        (("-j", json.dumps(small)), lambda c: jsonschema.validate(json.loads(c), small)),
        (("-jf", str(schema_file)), lambda c: jsonschema.validate(json.loads(c), small)),
        (("--grammar", 'root ::= "ab" [0-9]'), lambda c: len(c) == 3 and c.startswith("ab") and c[2].isdigit()),
        (("--grammar-file", str(gbnf_file)), lambda c: len(c) == 3 and c.startswith("ab") and c[2].isdigit()),
    ]:
        s = Server(tiny_path, "-c", "1024", "-np", "1", *flags, "--chat-template-file", str(QWEN3_TEMPLATE))
        try:
            assert s.get("/props").json()["default_generation_settings"]["params"]["grammar"], flags
            for seed in range(3):
                r = s.post("/completion", {"prompt": f"x {seed}", "n_predict": 60, "temperature": 1.0, "seed": seed})
                assert r.status_code == 200 and check(r.json()["content"]) is not False, (flags, r.text)
            chat = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 60,
                                                   "seed": 1, "chat_template_kwargs": {"enable_thinking": False}})
            assert check(chat.json()["choices"][0]["message"]["content"]) is not False, (flags, chat.text)
            # A request's own grammar replaces the default.
            own = s.post("/completion", {"prompt": "x", "n_predict": 8, "grammar": 'root ::= "zz"'})
            assert own.json()["content"] == "zz", own.text
        finally:
            s.stop()
    plain = Server(tiny_path, "-c", "1024", "-np", "1")
    try:
        assert plain.get("/props").json()["default_generation_settings"]["params"]["grammar"] == ""
    finally:
        plain.stop()
