"""The prompt cache in host RAM (--cache-ram): slot states saved before a slot is reused and
restored by prefix on any slot."""
from openai import OpenAI

from conftest import Server

# The tiny qwen3moe keeps 4 layers × (K + V) × 2 heads × 64 dims in f16: 2,048 bytes per position,
# plus 4 bytes for the token id.
BYTES_PER_POSITION = 4 * 2 * 2 * 64 * 2 + 4


def metric(server, name):
    for line in server.get("/metrics").text.splitlines():
        if line.startswith(f"llamacpp:{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def complete(server, prompt, n=5, **extra):
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "return_tokens": True, **extra}
    r = server.post("/completion", body)
    assert r.status_code == 200, r.text
    return r.json()


def conversation(server):
    """Two turns of one conversation on a single slot, with unrelated requests in between."""
    first = list(range(20, 120))
    a = complete(server, first)
    complete(server, list(range(300, 360)))
    complete(server, list(range(400, 430)), n=3)
    follow = first + a["tokens"] + [7, 8, 9]
    return a, complete(server, follow, n=8)


def test_a_conversation_keeps_its_prefix_across_unrelated_requests(tiny_path):
    cached = Server(tiny_path, "-c", "1024", "-np", "1", "--metrics")
    plain = Server(tiny_path, "-c", "1024", "-np", "1", "--metrics", "--cache-ram", "0")
    try:
        a, warm = conversation(cached)
        # The slot held the first prompt and 4 of its 5 tokens (the last one was sampled, not
        # evaluated); two other requests overwrote it since.
        assert warm["timings"]["cache_n"] == 100 + 4
        assert metric(cached, "prompt_cache_restores_total") == 1
        assert metric(cached, "prompt_cache_restored_tokens_total") == 104
        assert metric(cached, "prompt_cache_saves_total") >= 2
        a_plain, cold = conversation(plain)
        assert cold["timings"]["cache_n"] == 0
        assert metric(plain, "prompt_cache_states") == 0
        # Greedy output is the same with and without the cache.
        assert a_plain["content"] == a["content"]
        assert cold["content"] == warm["content"] and cold["tokens"] == warm["tokens"]
        # cache_prompt: false neither reuses nor restores.
        again = complete(cached, list(range(20, 120)) + a["tokens"], n=2, cache_prompt=False)
        assert again["timings"]["cache_n"] == 0
    finally:
        cached.stop()
        plain.stop()


def test_chat_turns_report_cached_tokens_after_other_requests(gemma3_path):
    s = Server(gemma3_path, "-c", "1024", "-np", "2", "-a", "g")
    try:
        client = OpenAI(base_url=s.url + "/v1", api_key="none")
        messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
        one = client.chat.completions.create(model="g", messages=messages, max_tokens=12, temperature=0)
        # Two unrelated requests in a row take both slots.
        for text in ["Count from one to five.", "What is the capital of France?"]:
            client.chat.completions.create(model="g", messages=[{"role": "user", "content": text}],
                                           max_tokens=6, temperature=0)
        messages += [{"role": "assistant", "content": one.choices[0].message.content},
                     {"role": "user", "content": "And two more?"}]
        two = client.chat.completions.create(model="g", messages=messages, max_tokens=6, temperature=0)
        cached = two.usage.prompt_tokens_details.cached_tokens
        assert one.usage.prompt_tokens <= cached < two.usage.prompt_tokens, (one.usage, two.usage)
    finally:
        s.stop()


def test_eviction_keeps_the_cache_inside_its_budget(tiny_path):
    # 1 MiB holds two states of 200 positions (410 kB each) but not three.
    s = Server(tiny_path, "-c", "1024", "-np", "1", "--metrics", "--cache-ram", "1")
    try:
        prompts = [list(range(b, b + 200)) for b in (0, 200)] + [[t % 7 + 1 for t in range(200)]]
        for p in prompts:
            complete(s, p, n=1)
        complete(s, [500] * 20, n=1)
        # The third save evicted the least recently used state: the first.
        assert metric(s, "prompt_cache_evictions_total") == 1
        assert metric(s, "prompt_cache_states") == 2
        assert metric(s, "prompt_cache_bytes") == 2 * 200 * BYTES_PER_POSITION <= 1 << 20
        assert complete(s, prompts[0] + [5], n=1)["timings"]["cache_n"] == 0
        assert complete(s, prompts[2] + [5], n=1)["timings"]["cache_n"] == 200
        # A state larger than the whole budget is not kept.
        long = [t % 11 + 450 for t in range(600)]
        complete(s, long, n=1)
        complete(s, [500] * 20, n=1)
        assert metric(s, "prompt_cache_bytes") <= 1 << 20
        assert complete(s, long + [5], n=1)["timings"]["cache_n"] == 0
    finally:
        s.stop()


def test_a_restored_prefix_on_another_slot_gives_the_same_tokens(tiny_path):
    s = Server(tiny_path, "-c", "1024", "-np", "2", "--metrics")
    try:
        base = list(range(50, 250))
        complete(s, base, n=1, id_slot=0)
        # Overwrite slot 0; the saved state comes back on slot 1 for a prompt that shares 150
        # of its positions.
        complete(s, [3] * 40, n=1, id_slot=0)
        branch = base[:150] + [9, 9, 9]
        warm = complete(s, branch, n=8, id_slot=1)
        cold = complete(s, branch, n=8, id_slot=0, cache_prompt=False)
        assert warm["timings"]["cache_n"] == 150 and warm["id_slot"] == 1
        assert warm["tokens"] == cold["tokens"]
    finally:
        s.stop()


def test_a_hybrid_restores_the_checkpoint_at_its_last_prompt_end(hybrid_path):
    """A Gated DeltaNet hybrid cannot rewind its recurrent state: a follow-up that keeps the
    first prompt but not the answer (as chat templates that drop thinking do) restores the
    checkpoint taken when the first prompt ended, after other requests used the slot."""
    cached = Server(hybrid_path, "-c", "512", "-np", "1", "--metrics")
    plain = Server(hybrid_path, "-c", "512", "-np", "1", "--metrics", "--cache-ram", "0")
    try:
        first = list(range(20, 120))
        replies = []
        for s in (cached, plain):
            a = complete(s, first)
            complete(s, list(range(300, 360)))
            # Keeps the prompt, replaces the answer.
            replies.append(complete(s, first + [7, 8, 9, 10], n=8))
            assert a["tokens"][:4] != [7, 8, 9, 10]
        warm, cold = replies
        assert warm["timings"]["cache_n"] == 100
        assert metric(cached, "prompt_cache_restored_tokens_total") == 100
        assert cold["timings"]["cache_n"] == 0
        assert warm["tokens"] == cold["tokens"]
        # Back on its own slot: the same prompt again goes back to the checkpoint at 104
        # positions (the follow-up's prompt end), not to zero.
        again = complete(cached, first + [7, 8, 9, 10] + [11], n=8)
        assert again["timings"]["cache_n"] == 104
        ref = complete(plain, first + [7, 8, 9, 10] + [11], n=8)
        assert again["tokens"] == ref["tokens"]
    finally:
        cached.stop()
        plain.stop()
