"""Several clients at once: continuous batching gives each the output it gets alone, clients
that disconnect mid-stream free their slots, and memory does not grow."""
import concurrent.futures
import json
import random

import requests


def greedy(server, prompt, n):
    return server.post("/completion", {"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": False}).json()["content"]


def test_batched_requests_equal_each_alone(tiny):
    prompts = [[5, 77, 300, 12], [3, 4, 5, 6, 100, 200, 300], [9, 8, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
    alone = [greedy(tiny, p, 12) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        together = list(ex.map(lambda p: greedy(tiny, p, 12), prompts))
    assert together == alone


def test_a_shared_prefix_is_reused_and_gives_the_same_output(tiny):
    p = list(range(10, 60))
    first = tiny.post("/completion", {"prompt": p, "n_predict": 6, "temperature": 0, "id_slot": 1}).json()
    again = tiny.post("/completion", {"prompt": p + [7, 8], "n_predict": 6, "temperature": 0, "id_slot": 1}).json()
    cold = tiny.post("/completion", {"prompt": p + [7, 8], "n_predict": 6, "temperature": 0, "cache_prompt": False, "id_slot": 2}).json()
    assert first["timings"]["cache_n"] <= 1
    assert again["timings"]["cache_n"] == 50 and again["timings"]["prompt_n"] == 2
    assert again["content"] == cold["content"]


def one_client(url, seed, n_requests):
    rng = random.Random(seed)
    done = cancelled = 0
    for i in range(n_requests):
        prompt = [rng.randrange(1, 500) for _ in range(rng.randrange(2, 40))]
        body = {"prompt": prompt, "n_predict": rng.randrange(4, 24), "temperature": 0.7, "seed": i, "stream": True}
        disconnect = (seed + i) % 3 == 0
        with requests.post(url + "/completion", json=body, stream=True, timeout=120) as r:
            assert r.status_code == 200, r.text
            got_final = False
            for n, line in enumerate(r.iter_lines()):
                if disconnect and n >= 2:
                    break
                if line.startswith(b"data: ") and json.loads(line[6:])["stop"]:
                    got_final = True
            if disconnect:
                cancelled += 1
            else:
                assert got_final
                done += 1
    return done, cancelled


def test_eight_clients_with_disconnects_leave_every_slot_idle_without_memory_growth(tiny):
    def round_():
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            return list(ex.map(lambda s: one_client(tiny.url, s, 20), range(8)))
    round_()
    rss_after_first = tiny.rss_kib()
    results = round_()
    assert sum(d for d, _ in results) + sum(c for _, c in results) == 160
    assert sum(c for _, c in results) >= 40
    import time
    for _ in range(100):
        if not any(s["is_processing"] for s in tiny.get("/slots").json()):
            break
        time.sleep(0.05)
    assert not any(s["is_processing"] for s in tiny.get("/slots").json())
    growth = tiny.rss_kib() - rss_after_first
    assert growth < 20 * 1024, f"RSS grew by {growth} KiB over 160 requests"
    assert tiny.post("/completion", {"prompt": "x", "n_predict": 2}).status_code == 200


def test_24_clients_with_a_third_disconnecting_end_idle_within_the_cache_budget(tiny_path):
    """24 clients × 10 streams, every third one dropped after its first frames: every stream
    ends, every slot is idle afterwards, and resident memory is back within what the prompt
    cache may hold (its budget) over where it stood after a warm-up round."""
    import time
    from conftest import Server
    budget_mib = 16
    s = Server(tiny_path, "-c", "4096", "-np", "4", "--cache-ram", str(budget_mib), "--metrics")
    try:
        def round_(n_requests):
            with concurrent.futures.ThreadPoolExecutor(24) as ex:
                return list(ex.map(lambda c: one_client(s.url, 100 + c, n_requests), range(24)))

        def idle():
            for _ in range(200):
                if not any(v["is_processing"] for v in s.get("/slots").json()):
                    return True
                time.sleep(0.05)
            return False

        round_(2)
        assert idle()
        rss_warm = s.rss_kib()
        results = round_(10)
        done, cancelled = sum(d for d, _ in results), sum(c for _, c in results)
        assert done + cancelled == 240 and cancelled == 80, (done, cancelled)
        assert idle(), s.get("/slots").json()
        metrics = s.get("/metrics").text
        held = next(float(line.split()[1]) for line in metrics.splitlines()
                    if line.startswith("llamacpp:prompt_cache_bytes "))
        assert held <= budget_mib << 20
        growth = s.rss_kib() - rss_warm
        assert growth <= (budget_mib + 16) * 1024, f"RSS grew by {growth} KiB; the cache may hold {budget_mib} MiB"
        assert s.post("/completion", {"prompt": "x", "n_predict": 2}).status_code == 200
    finally:
        s.stop()
