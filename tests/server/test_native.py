"""llama.cpp's native routes on the real binary: health, props, models, slots, metrics,
/completion (whole and streamed), tokenize/detokenize, apply-template."""
import json
import time

import requests

from conftest import QWEN3_TEMPLATE, Server, run_cli, sse_lines


def sse(resp):
    """The JSON payloads of a `data:` event stream."""
    out = []
    for line in sse_lines(resp):
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_health_props_models_and_slots(gemma3):
    assert gemma3.get("/health").json() == {"status": "ok"}
    props = gemma3.get("/props").json()
    assert props["total_slots"] == 2
    assert props["default_generation_settings"]["n_ctx"] == 1024
    assert props["default_generation_settings"]["params"]["seed"] == 42
    models = gemma3.get("/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "gemma3-270m"
    assert models["data"][0]["meta"]["n_vocab"] == 262144
    slots = gemma3.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1]
    assert all(s["n_ctx"] == 1024 for s in slots)


def test_completion_whole_and_streamed_agree(gemma3):
    body = {"prompt": "The capital of France is", "n_predict": 16, "temperature": 0}
    whole = gemma3.post("/completion", body).json()
    assert whole["stop"] is True and whole["stop_type"] == "limit"
    assert whole["tokens_predicted"] == 16
    assert whole["timings"]["predicted_n"] == 16
    assert whole["timings"]["prompt_n"] + whole["timings"]["cache_n"] == whole["tokens_evaluated"] == 6
    assert whole["model"] == "gemma3-270m"
    with requests.post(gemma3.url + "/completion", json={**body, "stream": True}, stream=True) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        chunks = sse(r)
    assert all(c["stop"] is False for c in chunks[:-1]) and chunks[-1]["stop"] is True
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert chunks[-1]["timings"]["predicted_n"] == 16


def test_a_stop_string_cuts_the_text_and_is_reported(gemma3):
    base = gemma3.post("/completion", {"prompt": "The capital of France is", "n_predict": 16, "temperature": 0}).json()
    text = base["content"]
    word = text.split()[2]
    cut = gemma3.post("/completion", {"prompt": "The capital of France is", "n_predict": 16, "temperature": 0, "stop": [word]}).json()
    assert cut["stop_type"] == "word" and cut["stopping_word"] == word
    assert cut["content"] == text[: text.index(word)]


def test_token_prompts_probabilities_fields_and_seeds(gemma3):
    ids = gemma3.post("/tokenize", {"content": "Once upon a time", "add_special": True}).json()["tokens"]
    assert ids[0] == 2
    by_text = gemma3.post("/completion", {"prompt": "Once upon a time", "n_predict": 8, "temperature": 0}).json()
    by_ids = gemma3.post("/completion", {"prompt": ids, "n_predict": 8, "temperature": 0}).json()
    assert by_text["content"] == by_ids["content"]
    probs = gemma3.post("/completion", {"prompt": ids, "n_predict": 4, "temperature": 0, "n_probs": 3}).json()
    cp = probs["completion_probabilities"]
    assert len(cp) == 4 and all(len(p["top_logprobs"]) == 3 for p in cp)
    # Greedy: the chosen token is the most likely one.
    assert all(p["id"] == p["top_logprobs"][0]["id"] and p["logprob"] <= 0 for p in cp)
    only = gemma3.post("/completion", {"prompt": ids, "n_predict": 2, "response_fields": ["content", "generation_settings/n_predict"]}).json()
    assert set(only) == {"content", "generation_settings/n_predict"} and only["generation_settings/n_predict"] == 2
    a = gemma3.post("/completion", {"prompt": ids, "n_predict": 12, "temperature": 1.0, "seed": 5}).json()["content"]
    b = gemma3.post("/completion", {"prompt": ids, "n_predict": 12, "temperature": 1.0, "seed": 5}).json()["content"]
    c = gemma3.post("/completion", {"prompt": ids, "n_predict": 12, "temperature": 1.0, "seed": 6}).json()["content"]
    assert a == b and a != c


def test_tokenize_detokenize_round_trip_and_pieces(gemma3):
    text = "Hello, wörld! 東京 🙂"
    toks = gemma3.post("/tokenize", {"content": text}).json()["tokens"]
    assert gemma3.post("/detokenize", {"tokens": toks}).json()["content"] == text
    pieces = gemma3.post("/tokenize", {"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert [p["piece"] for p in pieces] == ["Hello", " world"]
    bad = gemma3.post("/detokenize", {"tokens": [10**9]})
    assert bad.status_code == 400


def test_apply_template_renders_without_generating(tiny):
    out = tiny.post("/apply-template", {"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert out["prompt"].endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nHi<|im_end|>" in out["prompt"]


def test_metrics_count_tokens(gemma3):
    gemma3.post("/completion", {"prompt": "Hi", "n_predict": 3})
    text = gemma3.get("/metrics").text
    values = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l.startswith("llamacpp:")}
    assert values["llamacpp:tokens_predicted_total"] >= 3
    assert values["llamacpp:prompt_tokens_total"] >= 1
    assert values["llamacpp:n_decode_total"] >= 3
    # The throughput gauges cover the window since the previous scrape, as llama-server's: the
    # completion above is in this one, the next scrape's window is empty.
    assert values["llamacpp:predicted_tokens_seconds"] > 0
    again = {l.split()[0]: float(l.split()[1]) for l in gemma3.get("/metrics").text.splitlines() if l.startswith("llamacpp:")}
    assert again["llamacpp:predicted_tokens_seconds"] == 0
    assert again["llamacpp:prompt_tokens_seconds"] == 0
    assert again["llamacpp:tokens_predicted_total"] == values["llamacpp:tokens_predicted_total"]
    # No host experts on the CPU: the tiering counters stay zero and there is nothing to reset.
    assert values["llamacpp:routed_experts_host_total"] == 0
    assert values["llamacpp:routed_experts_bus_total"] == 0
    r = gemma3.post("/residency/reset")
    assert r.status_code == 501 and "no routed experts in host RAM" in r.json()["error"]["message"]


def test_text_held_at_the_limit_goes_out_with_the_last_token_once(gemma3):
    # The last character of the answer begins a stop string, so the matcher holds it when
    # n_predict ends the request: that text must still come out, and each token once.
    body = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "return_tokens": True}
    base = gemma3.post("/completion", body).json()
    assert len(base["tokens"]) == 8
    held = {**body, "stop": [base["content"][-1] + "\u0001never"]}
    whole = gemma3.post("/completion", held).json()
    assert whole["stop_type"] == "limit"
    assert whole["content"] == base["content"]
    assert whole["tokens"] == base["tokens"]
    with requests.post(gemma3.url + "/completion", json={**held, "stream": True}, stream=True) as r:
        chunks = sse(r)
    ids = [t for c in chunks[:-1] for t in c["tokens"]]
    assert ids == base["tokens"]
    assert [c["tokens_predicted"] for c in chunks[:-1]] == list(range(1, 9))
    assert "".join(c["content"] for c in chunks) == base["content"]


def test_server_template_kwargs_under_the_request_s(tiny_path, tmp_path):
    """`--chat-template-kwargs` as llama-server b11434 merges it (server-common.cpp: the server's
    object first, the request's `chat_template_kwargs` over it key by key)."""
    from conftest import Server, free_port, run_cli
    template = tmp_path / "greet.jinja"
    template.write_text("{{ greeting }}|{{ mood }}|{% for m in messages %}{{ m.content }}{% endfor %}")
    s = Server(tiny_path, "-c", "512", "-np", "1", "--chat-template-file", str(template),
               "--chat-template-kwargs", '{"greeting": "hello", "mood": "calm"}')
    try:
        msgs = [{"role": "user", "content": "hi"}]
        assert s.post("/apply-template", {"messages": msgs}).json()["prompt"] == "hello|calm|hi"
        over = s.post("/apply-template", {"messages": msgs, "chat_template_kwargs": {"mood": "wild"}})
        assert over.json()["prompt"] == "hello|wild|hi", over.text
    finally:
        s.stop()
    port = str(free_port())
    for bad, says in [("[1]", "JSON object"), ('{"messages": 1}', '"messages"'), ("{", "--chat-template-kwargs")]:
        rc, out = run_cli("serve", "-m", str(tiny_path), "--port", port, "--chat-template-kwargs", bad)
        assert rc != 0 and "--chat-template-kwargs" in out and says in out, out


def test_a_silent_stream_gets_keep_alive_comments(tiny_path):
    """llama-server b11434 sends `:` comment frames after `sse_ping_interval` seconds without a
    frame (server-context.cpp; `--sse-ping-interval`, default 30). A stream queued behind a long
    answer on the only slot is silent until the slot frees."""
    import threading
    from conftest import Server
    s = Server(tiny_path, "-c", "8192", "-np", "1", "--sse-ping-interval", "1")
    try:
        assert s.post("/completion", {"prompt": "x", "sse_ping_interval": "1"}).status_code == 400
        long = threading.Thread(target=lambda: s.post(
            "/completion", {"prompt": "a long one", "n_predict": 1500, "ignore_eos": True}))
        long.start()
        time.sleep(0.5)
        r = requests.post(s.url + "/completion", stream=True, timeout=300,
                          json={"prompt": "queued", "n_predict": 2, "stream": True})
        lines = [line for line in sse_lines(r) if line]
        long.join()
        assert lines[0] == ":" and any(line.startswith("data: ") for line in lines), lines[:5]
        # A request's 0 turns them off.
        long = threading.Thread(target=lambda: s.post(
            "/completion", {"prompt": "a long one", "n_predict": 1500, "ignore_eos": True}))
        long.start()
        time.sleep(0.5)
        r = requests.post(s.url + "/completion", stream=True, timeout=300,
                          json={"prompt": "queued", "n_predict": 2, "stream": True, "sse_ping_interval": 0})
        lines = [line for line in sse_lines(r) if line]
        long.join()
        assert ":" not in lines and lines[0].startswith("data: "), lines[:5]
    finally:
        s.stop()


def test_models_lists_aliases_and_tags_and_defaults_to_the_path_as_given(tiny, tiny_path):
    # As llama-server b11434: -a and --tags are comma-separated sets (sorted), the id is the
    # first alias; without -a, server.cpp makes the model's name (-m's path as given, or -hf's
    # value) its one alias (checked against b11434 itself: `-m target/test-data/x.gguf` is listed
    # as "target/test-data/x.gguf", aliases ["target/test-data/x.gguf"]).
    entry = tiny.get("/v1/models").json()["data"][0]
    assert (entry["id"], entry["aliases"], entry["tags"]) == (str(tiny_path), [str(tiny_path)], [])
    assert tiny.post("/completion", {"prompt": "x", "n_predict": 1}).json()["model"] == str(tiny_path)


def test_reverse_prompts_are_the_stop_strings_of_requests_that_bring_none(tiny_path):
    # llama-server's -r: the default `stop` (escapes processed, as llama.cpp's -e default does);
    # a request's own non-empty stop replaces it, an empty one falls back to it.
    s = Server(tiny_path, "-c", "256", "-r", r"\x41x", "-r", "two")
    try:
        assert s.get("/props").json()["default_generation_settings"]["params"]["stop"] == ["Ax", "two"]
        for body, stop in [({}, ["Ax", "two"]), ({"stop": []}, ["Ax", "two"]), ({"stop": ["z"]}, ["z"])]:
            r = s.post("/completion", {"prompt": "hi", "n_predict": 1, **body}).json()
            assert r["generation_settings"]["stop"] == stop, body
    finally:
        s.stop()
    raw = Server(tiny_path, "-c", "256", "-r", r"\x41x", "--no-escape")
    try:
        assert raw.get("/props").json()["default_generation_settings"]["params"]["stop"] == [r"\x41x"]
    finally:
        raw.stop()


def test_ui_config_is_props_ui_settings_and_bad_json_is_refused(tiny_path, tmp_path):
    cfg = tmp_path / "ui.json"
    cfg.write_text('{"system": "hi", "temperature": 0.5}')
    s = Server(tiny_path, "-c", "256", "--ui-config-file", str(cfg))
    try:
        assert s.get("/props").json()["ui_settings"] == {"system": "hi", "temperature": 0.5}
    finally:
        s.stop()
    rc, out = run_cli("serve", "-m", str(tiny_path), "--ui-config", "{not json")
    assert rc != 0 and "--ui-config: failed to parse UI config" in out, out


def test_log_prompts_dir_writes_each_prompt_as_llama_server_does(tiny_path, tmp_path):
    # Checked against llama-server b11434 on the same requests: a text prompt as it is, a mixed
    # list as JSON indented by two spaces, a chat as the template's rendering; files named by
    # the monotonic clock in milliseconds, 12 digits.
    d = tmp_path / "prompts"
    s = Server(tiny_path, "-c", "256", "--log-prompts-dir", str(d),
               "--chat-template-file", str(QWEN3_TEMPLATE))
    try:
        for path, body in [("/completion", {"prompt": "hello there"}),
                           ("/completion", {"prompt": [1, 2, "x"]}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})]:
            assert s.post(path, {**body, "n_predict": 1, "max_tokens": 1}).status_code == 200
            time.sleep(0.01)
    finally:
        s.stop()
    files = sorted(d.iterdir())
    assert all(len(f.stem) == 12 and f.stem.isdigit() and f.suffix == ".txt" for f in files), files
    texts = [f.read_text() for f in files]
    assert texts[:2] == ["hello there", '[\n  1,\n  2,\n  "x"\n]']
    assert texts[2].startswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), texts[2]


def test_completion_bash_prints_a_script_that_completes_serve_flags(tmp_path):
    import subprocess
    rc, out = run_cli("serve", "--completion-bash")
    assert rc == 0, out
    script = tmp_path / "c.sh"
    script.write_text(out)
    probe = ('source "$1"; COMP_WORDS=(bloomery serve --hf-r); COMP_CWORD=2; _bloomery_completions; '
             'echo "${COMPREPLY[@]}"; COMP_WORDS=(bloomery serve --lor); COMP_CWORD=2; _bloomery_completions; '
             'echo "[${COMPREPLY[@]}]"')
    p = subprocess.run(["bash", "-c", probe, "bash", str(script)], capture_output=True, text=True, timeout=30)
    assert p.stdout.splitlines() == ["--hf-repo", "[]"], p.stdout + p.stderr
