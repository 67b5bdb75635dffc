"""Embeddings (`--embeddings`) on the gemma-3-270m demo: the openai SDK's `embeddings.create`
(float and base64) and the native routes' shapes against llama.cpp b11434's rows
(host/tests/fixtures/gemma3_270m_embeddings.json, llama.cpp's f32 path: cosine >= 0.998, as
host/tests/embeddings_llamacpp.rs holds it), the input shapes
llama-server takes, its normalizations, and the refusals: embeddings off, pooling none on the
OpenAI route, an input over the slot's context, reranking, `--pooling rank`."""
import base64
import json
import math
import struct

import openai
import pytest

from conftest import ROOT, Server, run_cli

GOLDEN = json.loads((ROOT / "host/tests/fixtures/gemma3_270m_embeddings.json").read_text())
PROMPTS = GOLDEN["prompts"]
# The golden is llama.cpp's f32 path (f32 cache): the servers run an f32 cache too. Why 0.998:
# host/tests/fixtures/PROVENANCE.md.
MIN_COSINE = 0.998
F32_CACHE = ["-ctk", "f32", "-ctv", "f32"]


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def norm(v, p=2):
    return sum(abs(x) ** p for x in v) ** (1 / p)


@pytest.fixture(scope="module")
def mean(gemma3_path):
    # A short queue: a request's inputs beyond it wait for room instead of failing.
    s = Server(gemma3_path, "-c", "512", "-np", "2", "--embeddings", "--pooling", "mean", "--metrics",
               "--queue-depth", "4", *F32_CACHE)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def none(gemma3_path):
    s = Server(gemma3_path, "-c", "512", "-np", "2", "--embeddings", *F32_CACHE)
    yield s
    s.stop()


def client(server):
    return openai.OpenAI(api_key="none", base_url=server.url + "/v1")


def test_openai_sdk_embeddings_match_llama_cpp(mean):
    want = GOLDEN["poolings"]["mean"]["rows"]
    # The SDK asks for base64 unless told otherwise, and decodes it.
    for fmt in (openai.omit, "float"):
        res = client(mean).embeddings.create(model="gemma", input=PROMPTS, encoding_format=fmt)
        assert [d.index for d in res.data] == [0, 1, 2]
        for d, w in zip(res.data, want):
            assert len(d.embedding) == 640
            assert cosine(d.embedding, w) >= MIN_COSINE
            assert abs(norm(d.embedding) - 1) < 1e-4
        assert res.usage.prompt_tokens == res.usage.total_tokens == sum(len(t) for t in GOLDEN["tokens"])
        assert res.model == "gemma"


def test_base64_is_the_float_rows_as_little_endian_f32(mean):
    floats = mean.post("/v1/embeddings", {"input": PROMPTS[0]}).json()
    b64 = mean.post("/v1/embeddings", {"input": PROMPTS[0], "encoding_format": "base64"}).json()
    row = floats["data"][0]["embedding"]
    decoded = struct.unpack(f"{len(row)}f", base64.b64decode(b64["data"][0]["embedding"]))
    assert b64["data"][0]["encoding_format"] == "base64"
    assert b64["data"][0]["object"] == "embedding"
    assert all(abs(x - y) < 1e-6 for x, y in zip(decoded, row))


def test_native_routes_answer_one_object_per_input_with_its_rows(mean):
    for route in ("/embedding", "/embeddings"):
        r = mean.post(route, {"content": PROMPTS[1]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [e["index"] for e in body] == [0]
        assert len(body[0]["embedding"]) == 1
        assert cosine(body[0]["embedding"][0], GOLDEN["poolings"]["mean"]["rows"][1]) >= MIN_COSINE
    # `content` on the OpenAI route gets the native shape, as llama-server answers it.
    assert isinstance(mean.post("/v1/embeddings", {"content": PROMPTS[1]}).json(), list)


def test_input_shapes_give_the_same_rows(mean):
    ids = GOLDEN["tokens"][1]
    text = mean.post("/v1/embeddings", {"input": PROMPTS[1]}).json()["data"][0]["embedding"]
    shapes = [
        ids,
        [ids],
        {"prompt_string": PROMPTS[1]},
        {"content": [{"type": "text", "text": PROMPTS[1][:10]}, {"type": "text", "text": PROMPTS[1][10:]}]},
    ]
    for shape in shapes:
        r = mean.post("/v1/embeddings", {"input": shape})
        assert r.status_code == 200, (shape, r.text)
        assert r.json()["data"][0]["embedding"] == pytest.approx(text, abs=1e-6), shape
    mixed = mean.post("/v1/embeddings", {"input": [PROMPTS[0], ids]}).json()["data"]
    assert len(mixed) == 2 and mixed[1]["embedding"] == pytest.approx(text, abs=1e-6)


def test_more_inputs_than_the_queue_holds_are_all_answered_in_order(mean):
    inputs = [f"item {i}" for i in range(24)]
    data = mean.post("/v1/embeddings", {"input": inputs}).json()["data"]
    assert [d["index"] for d in data] == list(range(24))
    alone = mean.post("/v1/embeddings", {"input": inputs[17]}).json()["data"][0]["embedding"]
    assert data[17]["embedding"] == pytest.approx(alone, abs=1e-4)


def test_embd_normalize_as_llama_cpp(mean):
    raw = mean.post("/embedding", {"content": PROMPTS[0], "embd_normalize": -1}).json()[0]["embedding"][0]
    assert norm(raw) > 2
    taxicab = mean.post("/embedding", {"content": PROMPTS[0], "embd_normalize": 1}).json()[0]["embedding"][0]
    assert abs(norm(taxicab, 1) - 1) < 1e-4
    int16 = mean.post("/embedding", {"content": PROMPTS[0], "embd_normalize": 0}).json()[0]["embedding"][0]
    assert max(abs(x) for x in int16) == pytest.approx(32760, rel=1e-6)
    assert cosine(raw, int16) > 0.99999


@pytest.mark.parametrize("body,says", [
    ({"input": []}, '"input" must not be empty'),
    ({"input": True}, '"prompt" elements must be'),
    ({"input": "hi", "encoding_format": "hex"}, "Can be either float or base64"),
    ({"input": "hi", "encoding_format": 1}, '"encoding_format" must be a string'),
    ({"nothing": "hi"}, '"input" or "content" must be provided'),
    ({"input": {"content": "text"}}, '"content" must be an array'),
    ({"input": {"content": [{"type": "image_url", "image_url": {"url": "x"}}]}}, "image_url"),
    ({"input": "hi", "dimensions": 64}, '"dimensions" 64'),
])
def test_bad_input_is_a_named_400(mean, body, says):
    r = mean.post("/v1/embeddings", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert says in r.json()["error"]["message"]


def test_an_input_over_the_slots_context_is_refused_as_llama_server_refuses_it(mean):
    r = mean.post("/v1/embeddings", {"input": list(range(10, 300))})
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["type"] == "exceed_context_size_error"
    assert e["message"] == "input (290 tokens) is larger than the max context size (256 tokens). skipping"
    assert (e["n_prompt_tokens"], e["n_ctx"]) == (290, 256)
    # A whole slot's context is embedded (pooling other than last needs no position after it).
    assert mean.post("/v1/embeddings", {"input": [2] + list(range(10, 265))}).status_code == 200


def test_completions_still_serve_and_embeddings_count_in_metrics(mean):
    r = mean.post("/completion", {"prompt": PROMPTS[0], "n_predict": 4})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 4
    metrics = mean.get("/metrics").text
    prompt = [l for l in metrics.splitlines() if l.startswith("llamacpp:prompt_tokens_total")]
    assert prompt and float(prompt[0].split()[-1]) > 0


def test_rerank_is_refused_by_name(mean):
    for route in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
        r = mean.post(route, {"query": "a", "documents": ["b"]})
        assert r.status_code == 501, route
        assert r.json()["error"]["type"] == "not_supported_error"
        assert "reranking" in r.json()["error"]["message"]


def test_pooling_none_gives_every_tokens_row_unnormalized(none):
    r = none.post("/embedding", {"content": PROMPTS[1]})
    assert r.status_code == 200, r.text
    rows = r.json()[0]["embedding"]
    want = GOLDEN["poolings"]["none"]["rows"]
    assert len(rows) == len(want) == len(GOLDEN["tokens"][1])
    for ours, theirs in zip(rows, want):
        assert cosine(ours, theirs) >= MIN_COSINE
        assert norm(ours) == pytest.approx(norm(theirs), rel=5e-2)
    r = none.post("/v1/embeddings", {"input": PROMPTS[1]})
    assert r.status_code == 400
    assert "Pooling type 'none' is not OAI compatible" in r.json()["error"]["message"]
    r = none.post("/embedding", {"content": PROMPTS[1], "embd_normalize": 2})
    assert r.status_code == 400 and "embd_normalize" in r.json()["error"]["message"]


def test_without_embeddings_the_routes_say_how_to_turn_them_on(tiny):
    for route in ("/embedding", "/embeddings", "/v1/embeddings"):
        r = tiny.post(route, {"input": "hi"})
        assert r.status_code == 501, route
        assert "Start it with `--embeddings`" in r.json()["error"]["message"]


@pytest.mark.parametrize("flags,says", [
    (["--embeddings", "--pooling", "rank"], "--pooling rank: pooling rank needs a model with a rank (classifier) head"),
    (["--reranking"], "--reranking: not supported: reranking needs a model with a rank (classifier) head"),
    (["--embeddings", "--pooling", "max"], "unknown pooling `max`"),
])
def test_rank_pooling_is_refused_at_start(tiny_path, flags, says):
    rc, out = run_cli("serve", "-m", str(tiny_path), "--port", "0", *flags, timeout=120)
    assert rc != 0
    assert says in out, out
