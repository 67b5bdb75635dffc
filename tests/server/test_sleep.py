"""--sleep-idle-seconds: after N seconds with no task the server frees the model and loads it again
for the next request that needs it, as llama-server b11434 does (tools/server/server-queue.cpp
`start_loop`, server-context.cpp `handle_sleeping_state`). /health, GET /props, /models and
/metrics answer while it sleeps without waking it; every other route waits for the reload."""
import shutil
import threading
import time

from conftest import Server, run_cli

WOKE = "the model is loaded again after sleeping"


def is_sleeping(server):
    r = server.get("/props")
    assert r.status_code == 200, r.text
    return r.json()["is_sleeping"]


def wait_for_sleep(server, timeout=30.0):
    start = time.time()
    while time.time() - start < timeout:
        if is_sleeping(server):
            return
        time.sleep(0.1)
    raise AssertionError("the server did not go to sleep: " + server.output()[-2000:])


def without_cache_gauges(metrics):
    """The counters without the prompt cache's gauges and the throughput gauges (those cover the
    window since the previous scrape)."""
    windowed = ("llamacpp:prompt_cache_", "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds")
    return [ln for ln in metrics.splitlines() if not ln.startswith(windowed)]


def complete(server, prompt="The capital of France is", n=8):
    r = server.post("/completion", {"prompt": prompt, "n_predict": n, "temperature": 0, "return_tokens": True})
    assert r.status_code == 200, r.text
    return r.json()


def test_sleeps_frees_the_model_and_wakes_with_the_same_answer(gemma3_path):
    s = Server(gemma3_path, "-c", "1024", "-np", "1", "--metrics", "-a", "g", "--sleep-idle-seconds", "1")
    try:
        first = complete(s)
        again = complete(s)
        # The slot kept the prompt: the second request reused it.
        assert again["timings"]["cache_n"] > 0
        assert again["tokens"] == first["tokens"]
        awake_metrics = s.get("/metrics").text
        rss_awake = s.rss_kib()

        wait_for_sleep(s)
        # The read-only routes answer without waking it.
        assert s.get("/health").json() == {"status": "ok"}
        models = s.get("/models").json()
        assert models["data"][0]["id"] == "g"
        # The counters carry on unchanged; the prompt cache's gauges say it was freed.
        asleep_metrics = s.get("/metrics").text
        assert without_cache_gauges(asleep_metrics) == without_cache_gauges(awake_metrics)
        assert "llamacpp:prompt_cache_bytes 0\n" in asleep_metrics
        assert "llamacpp:prompt_cache_states 0\n" in asleep_metrics
        assert "llamacpp:predicted_tokens_seconds 0\n" in asleep_metrics
        time.sleep(0.3)
        assert is_sleeping(s)
        # The weights are gone from memory: gemma-3-270m Q4_K_M is about 240 MiB.
        rss_asleep = s.rss_kib()
        assert rss_asleep < rss_awake - 150 * 1024, (rss_awake, rss_asleep)

        woken = complete(s)
        assert not is_sleeping(s)
        assert woken["content"] == first["content"]
        assert woken["tokens"] == first["tokens"]
        # The slot's cache went with the model, as in llama-server: nothing is reused.
        assert woken["timings"]["cache_n"] == 0
        assert s.output().count(WOKE) == 1
        assert s.rss_kib() > rss_asleep + 150 * 1024
    finally:
        s.stop()


def test_concurrent_requests_wait_for_one_reload(gemma3_path):
    s = Server(gemma3_path, "-c", "1024", "-np", "2", "--sleep-idle-seconds", "1")
    try:
        want = complete(s)
        wait_for_sleep(s)
        answers, errors = [], []

        def one(i):
            try:
                if i % 2:
                    answers.append(complete(s)["tokens"])
                else:
                    r = s.post("/tokenize", {"content": "Hello world"})
                    assert r.status_code == 200, r.text
                    answers.append(None)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert [a for a in answers if a is not None] == [want["tokens"]] * 3
        assert not is_sleeping(s)
        assert s.output().count(WOKE) == 1
    finally:
        s.stop()


def test_routes_that_need_the_model_wake_it(tiny_path):
    s = Server(tiny_path, "-c", "512", "-np", "1", "--sleep-idle-seconds", "1")
    try:
        for method, path, body in [
            ("POST", "/tokenize", {"content": "Hello"}),
            ("POST", "/apply-template", {"messages": [{"role": "user", "content": "hi"}]}),
            ("POST", "/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "hi"}]}),
            ("POST", "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "hi"}]}),
            ("GET", "/slots", None),
        ]:
            wait_for_sleep(s)
            r = s.post(path, body) if method == "POST" else s.get(path)
            assert r.status_code == 200, (path, r.text)
            assert not is_sleeping(s), path
        # The slots wake empty.
        assert all(v["n_cached"] == 0 for v in s.get("/slots").json())
        assert s.output().count(WOKE) == 5
    finally:
        s.stop()


def test_a_failed_reload_is_an_error_and_the_next_request_tries_again(tiny_path, tmp_path):
    model = tmp_path / "model.gguf"
    shutil.copy(tiny_path, model)
    s = Server(model, "-c", "512", "-np", "1", "--sleep-idle-seconds", "1")
    try:
        want = complete(s, "Hello", n=4)
        wait_for_sleep(s)
        model.rename(tmp_path / "gone.gguf")
        r = s.post("/completion", {"prompt": "Hello", "n_predict": 4, "temperature": 0})
        assert r.status_code == 500, r.text
        assert "loading the model again after sleeping failed" in r.json()["error"]["message"]
        h = s.get("/health")
        assert h.status_code == 500
        assert "loading the model again after sleeping failed" in h.json()["error"]["message"]
        assert s.post("/tokenize", {"content": "x"}).status_code == 500
        assert s.proc.poll() is None
        (tmp_path / "gone.gguf").rename(model)
        assert complete(s, "Hello", n=4)["tokens"] == want["tokens"]
        assert s.get("/health").status_code == 200
    finally:
        s.stop()


def test_the_flag_refuses_what_llama_server_refuses(tiny_path):
    for bad in ["0", "-2"]:
        rc, out = run_cli("serve", "-m", str(tiny_path), "--sleep-idle-seconds", bad)
        assert rc != 0
        assert "--sleep-idle-seconds" in out and "cannot be 0 or less than -1" in out, out
    rc, out = run_cli("serve", "-m", str(tiny_path), "--sleep-idle-seconds", "2147483648")
    assert rc != 0
    assert "--sleep-idle-seconds 2147483648: out of range" in out, out


def test_polling_slots_keeps_it_awake_and_metrics_does_not(tiny_path):
    # llama-server reads /slots through a task, which resets the idle timer; /metrics' task does not.
    s = Server(tiny_path, "-c", "512", "-np", "1", "--metrics", "--sleep-idle-seconds", "2")
    try:
        start = time.time()
        while time.time() - start < 5:
            assert s.get("/slots").status_code == 200
            assert not is_sleeping(s)
            time.sleep(0.4)
        start = time.time()
        while time.time() - start < 5:
            assert s.get("/metrics").status_code == 200
            time.sleep(0.4)
        assert is_sleeping(s)
        assert WOKE not in s.output()
    finally:
        s.stop()
