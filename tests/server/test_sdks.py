"""The official OpenAI and Anthropic Python SDKs against the real binary, streaming and not."""
import anthropic
import openai


def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_openai_chat_whole_and_streamed_agree(gemma3):
    client = oai(gemma3)
    msgs = [{"role": "user", "content": "Name a colour."}]
    whole = client.chat.completions.create(model="x", messages=msgs, max_tokens=10, temperature=0)
    assert whole.object == "chat.completion"
    assert whole.choices[0].finish_reason in ("length", "stop")
    assert 0 < whole.usage.completion_tokens <= 10
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    assert whole.system_fingerprint.startswith("b")
    chunks = list(client.chat.completions.create(model="x", messages=msgs, max_tokens=10, temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content is None
    assert all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].delta.content is None
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_openai_chat_logprobs(gemma3):
    r = oai(gemma3).chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 2 for c in content)


def test_openai_completions_whole_and_streamed(gemma3):
    client = oai(gemma3)
    whole = client.completions.create(model="x", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert whole.object == "text_completion" and whole.usage.completion_tokens == 8
    parts = list(client.completions.create(model="x", prompt="The capital of France is", max_tokens=8, temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in parts) == whole.choices[0].text
    assert parts[-1].choices[0].finish_reason == "length"


def test_openai_responses(gemma3):
    client = oai(gemma3)
    r = client.responses.create(model="x", input="Say hi", max_output_tokens=6, temperature=0)
    assert r.status == "completed" and r.output_text
    events = list(client.responses.create(model="x", input="Say hi", max_output_tokens=6, temperature=0, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == r.output_text
    assert events[-1].type == "response.completed"


def test_openai_responses_input_tokens(gemma3):
    # The SDK's own call (POST /v1/responses/input_tokens); the same turn as a chat counts the same.
    counted = oai(gemma3).responses.input_tokens.count(model="x", input="Say hi")
    assert counted.object == "response.input_tokens"
    chat = gemma3.post("/v1/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "Say hi"}]}).json()
    assert chat["object"] == "response.input_tokens"
    assert counted.input_tokens == chat["input_tokens"] > 3


def test_anthropic_messages_whole_and_streamed(gemma3):
    client = anthropic.Anthropic(base_url=gemma3.url, api_key="none", max_retries=0)
    kw = dict(model="x", max_tokens=10, extra_body={"temperature": 0}, system="Be brief.", messages=[{"role": "user", "content": "Name a fruit."}])
    whole = client.messages.create(**kw)
    assert whole.type == "message" and whole.role == "assistant"
    assert whole.stop_reason in ("max_tokens", "end_turn")
    assert whole.usage.output_tokens > 0 and isinstance(whole.usage.cache_read_input_tokens, int)
    text = whole.content[0].text
    with client.messages.stream(**kw) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text and final.stop_reason == whole.stop_reason
    counted = client.messages.count_tokens(model="x", system="Be brief.", messages=kw["messages"])
    assert counted.input_tokens == whole.usage.input_tokens + whole.usage.cache_read_input_tokens


def test_anthropic_raw_event_sequence(gemma3):
    client = anthropic.Anthropic(base_url=gemma3.url, api_key="none", max_retries=0)
    events = list(client.messages.create(model="x", max_tokens=4, messages=[{"role": "user", "content": "Hi"}], stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert events[0].message.usage.input_tokens > 0 and events[0].message.usage.output_tokens == 0
    assert "content_block_start" in kinds and "content_block_stop" in kinds


def test_tools_reach_the_template_and_come_back_parsed(tiny):
    """The tiny random model cannot choose to call a tool, so the offered tools are checked in
    the rendered prompt, and the SDK must accept a tool-offering request end to end."""
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = tiny.post("/apply-template", {"messages": msgs, "tools": tools}).json()
    assert "get_weather" in r["prompt"] and "<tools>" in r["prompt"]
    client = oai(tiny)
    out = client.chat.completions.create(model="x", messages=msgs, tools=tools, max_tokens=4, temperature=0)
    assert out.choices[0].finish_reason in ("length", "stop", "tool_calls")
    a = anthropic.Anthropic(base_url=tiny.url, api_key="none", max_retries=0)
    res = a.messages.create(model="x", max_tokens=4, messages=[{"role": "user", "content": "Weather in Paris?"}],
                            tools=[{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}])
    assert res.stop_reason in ("max_tokens", "end_turn", "tool_use")
    # A tool result turn renders through the template as a tool message.
    turn = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}]
    n = a.messages.count_tokens(model="x", messages=turn)
    assert n.input_tokens > 10
