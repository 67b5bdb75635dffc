"""Bad input gets a named error in llama-server's shape and the server keeps serving."""
import concurrent.futures
import json
import socket

import pytest
import requests

from conftest import Server, run_cli


def error_of(r, code, kind):
    assert r.status_code == code, r.text
    e = r.json()["error"]
    assert e["code"] == code and e["type"] == kind, e
    return e


def test_malformed_bodies_are_400_and_the_server_keeps_serving(tiny):
    error_of(requests.post(tiny.url + "/completion", data=b"{not json"), 400, "invalid_request_error")
    error_of(requests.post(tiny.url + "/completion", data=b'{"prompt": "\xff\xfe"}'), 400, "invalid_request_error")
    error_of(tiny.post("/completion", [1, 2]), 400, "invalid_request_error")
    e = error_of(tiny.post("/completion", {"prompt": "hi", "temperature": "hot"}), 400, "invalid_request_error")
    assert "temperature" in e["message"]
    error_of(tiny.post("/completion", {"n_predict": 3}), 400, "invalid_request_error")
    error_of(tiny.post("/v1/chat/completions", {"messages": "hi"}), 400, "invalid_request_error")
    error_of(tiny.post("/v1/chat/completions", {"messages": [{"content": "no role"}]}), 400, "invalid_request_error")
    error_of(tiny.post("/v1/messages", {"max_tokens": 3}), 400, "invalid_request_error")
    error_of(tiny.post("/completion", {"prompt": [10**9]}), 400, "invalid_request_error")
    assert tiny.post("/completion", {"prompt": "still serving", "n_predict": 2}).status_code == 200


def test_a_prompt_over_the_context_is_named(tiny):
    e = error_of(tiny.post("/completion", {"prompt": [5] * 1100, "n_predict": 1}), 400, "exceed_context_size_error")
    assert e["n_prompt_tokens"] == 1100 and e["n_ctx"] == 1024
    assert tiny.post("/completion", {"prompt": [5] * 10, "n_predict": 1}).status_code == 200


def test_unknown_route_lists_the_routes(tiny):
    e = error_of(tiny.get("/v2/nothing"), 404, "not_found_error")
    assert "POST /v1/chat/completions" in e["routes"]


def test_slots_endpoints_and_unserved_routes(tiny):
    assert len(tiny.get("/slots").json()) == 4
    error_of(tiny.post("/slots/0?action=save", {"filename": "x.bin"}), 501, "not_supported_error")
    error_of(tiny.post("/slots/9?action=erase", {}), 400, "invalid_request_error")
    error_of(tiny.post("/slots/0?action=bogus", {}), 400, "invalid_request_error")
    error_of(tiny.post("/embeddings", {"input": "x"}), 501, "not_supported_error")
    error_of(tiny.post("/infill", {"input_prefix": "a", "input_suffix": "b"}), 501, "not_supported_error")


def test_api_key_bearer_and_x_api_key(tiny_path):
    s = Server(tiny_path, "-c", "256", "--api-key", "k1,k2")
    try:
        assert s.get("/health").status_code == 200
        # As llama-server b11434: only /health and /v1/health are public.
        error_of(s.get("/v1/models"), 401, "authentication_error")
        error_of(s.get("/models"), 401, "authentication_error")
        assert s.get("/v1/models", headers={"Authorization": "Bearer k1"}).status_code == 200
        error_of(s.post("/completion", {"prompt": "x", "n_predict": 1}), 401, "authentication_error")
        error_of(s.post("/completion", {"prompt": "x", "n_predict": 1}, headers={"Authorization": "Bearer nope"}), 401, "authentication_error")
        assert s.post("/completion", {"prompt": "x", "n_predict": 1}, headers={"Authorization": "Bearer k2"}).status_code == 200
        assert s.post("/completion", {"prompt": "x", "n_predict": 1}, headers={"X-Api-Key": "k1"}).status_code == 200
        error_of(s.get("/props"), 401, "authentication_error")
    finally:
        s.stop()


def test_without_slots_and_metrics_flags(tiny_path):
    s = Server(tiny_path, "-c", "256", "--no-slots")
    try:
        error_of(s.get("/slots"), 501, "not_supported_error")
        error_of(s.get("/metrics"), 501, "not_supported_error")
    finally:
        s.stop()


@pytest.mark.parametrize("flag,named", [
    (["--no-such-flag"], "--no-such-flag"),
    (["--no-mmap"], "--no-mmap"),
    (["-ot", "exps=TPU"], "TPU"),
    (["--gpu-budget", "lots"], "--gpu-budget"),
    (["--cache-ram", "-5"], "--cache-ram"),
    (["-ctk", "bf16"], "bf16"),
    (["-np", "-1"], "-np/--parallel -1 (auto)"),
])
def test_unknown_and_unimplemented_flags_are_refused_by_name(tiny_path, flag, named):
    rc, out = run_cli("serve", "-m", str(tiny_path), "--port", "1", *flag)
    assert rc != 0 and named in out, out


def test_llama_server_harness_flags_are_accepted(tiny_path):
    """Flags the llama-server test harness passes to its server."""
    s = Server(tiny_path, "--temp", "0.8", "--seed", "42", "--host", "127.0.0.1", "--batch-size", "32",
               "--ubatch-size", "32", "--threads", "2", "--n-gpu-layers", "0", "--ctx-size", "512", "--parallel", "2",
               "-fa", "on", "--n-predict", "8", "--alias", "tinyllama-2", "--jinja", "--reasoning-format", "none",
               "-ctk", "f16", "-ctv", "f16", "--cache-ram", "0", "-ncmoe", "2", "-ot", "exps=CPU", "--mlock",
               env={"LLAMA_ARG_N_PARALLEL": "3"})
    try:
        props = s.get("/props").json()
        assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 256
        assert s.get("/v1/models").json()["data"][0]["id"] == "tinyllama-2"
        assert s.post("/completion", {"prompt": "x"}).json()["tokens_predicted"] == 8
    finally:
        s.stop()


def test_environment_twins(tiny_path):
    s = Server(tiny_path, env={"LLAMA_ARG_CTX_SIZE": "300", "LLAMA_ARG_N_PARALLEL": "3"})
    try:
        props = s.get("/props").json()
        assert props["total_slots"] == 3 and props["default_generation_settings"]["n_ctx"] == 100
    finally:
        s.stop()


def test_a_full_queue_answers_503_with_retry_after(tiny_path):
    s = Server(tiny_path, "-c", "512", "-np", "1", "--queue-depth", "1")
    try:
        def go():
            return s.post("/completion", {"prompt": "x", "n_predict": 200, "ignore_eos": True})
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            rs = list(ex.map(lambda _: go(), range(6)))
        codes = sorted(r.status_code for r in rs)
        assert 200 in codes and 503 in codes, codes
        busy = [r for r in rs if r.status_code == 503][0]
        assert busy.headers["Retry-After"] and busy.json()["error"]["type"] == "unavailable_error"
        assert s.post("/completion", {"prompt": "x", "n_predict": 2}).status_code == 200
    finally:
        s.stop()


def test_health_is_503_before_the_model_loads(gemma3_path):
    """The listener is up before the model loads (the demo model's 262k-token vocabulary takes
    a moment), and /health says so."""
    import subprocess
    import time
    from conftest import BIN, PLUGINS, free_port
    port = free_port()
    p = subprocess.Popen([BIN, "--plugin-dir", PLUGINS, "serve", "-m", str(gemma3_path), "--port", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        seen = set()
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                r = requests.get(f"http://127.0.0.1:{port}/health", timeout=1)
                seen.add(r.status_code)
                if r.status_code == 503:
                    assert r.json()["error"] == {"code": 503, "message": "Loading model", "type": "unavailable_error"}
                if r.status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.005)
        assert seen == {503, 200}, seen
    finally:
        p.terminate()
        p.wait(10)
