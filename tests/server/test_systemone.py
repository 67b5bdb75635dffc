"""POST /v1/systemone on the synthetic tiny `clef` file (a random backbone and decision head):
the answers' shapes and invariants llama-server b11434 promises (answers in request order,
probabilities that sum to 1, the choice at the most probable option, the score as the expected
level), its refusals (400 with a message, 501 for images and for a model without a head), and a
JSON-object state; concurrent requests: test_systemone_batching.py."""

import pytest

from conftest import Server, run_cli

STATE = "Charged twice, no reply."

QUESTIONS = {
    "route": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"shipping": None, "billing": "refunds", "technical": None},
    },
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["later", "soon", "now"]},
    "angry": {"type": "noul", "instructions": "Angry?"},
}


@pytest.fixture(scope="module")
def clef_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "tiny-clef.gguf"
    rc, text = run_cli("synth", "--arch", "clef", "--preset", "tiny", "--seed", "7", "-o", str(out))
    assert rc == 0, text
    return out


@pytest.fixture(scope="module")
def clef(clef_path):
    s = Server(clef_path, "-c", "8192", "-np", "2")
    yield s
    s.stop()


def check_answers(body):
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] == 0
    answers = body["answers"]
    assert list(answers) == ["route", "urgency", "angry"]
    route = answers["route"]
    assert route["type"] == "choice"
    # A choice's options in code-point order of their keys.
    assert list(route["probabilities"]) == ["billing", "shipping", "technical"]
    assert abs(sum(route["probabilities"].values()) - 1) < 1e-6
    assert route["choice"] == max(route["probabilities"], key=route["probabilities"].get)
    assert 0 <= route["confidence"] <= 1
    urgency = answers["urgency"]
    assert urgency["legend"] == {"0": "later", "1": "soon", "2": "now"}
    p = list(urgency["probabilities"].values())
    assert abs(sum(p) - 1) < 1e-6
    assert abs(urgency["score"] - sum(i * x for i, x in enumerate(p))) < 1e-9
    assert 0 <= urgency["confidence"] <= 1
    assert answers["angry"]["type"] == "noul" and 0 <= answers["angry"]["noul"] <= 1


def test_answers_have_llama_servers_shape(clef):
    r = clef.post("/v1/systemone", {"state": STATE, "questions": QUESTIONS})
    assert r.status_code == 200, r.text
    check_answers(r.json())


def test_a_json_state_is_rendered_as_compact_json(clef):
    q = {"refund": {"type": "noul", "instructions": "Refund?", "criteria": {"true": "yes", "false": "no"}}}
    a = clef.post("/v1/systemone", {"state": {"ticket": STATE, "plan": "pro"}, "questions": q})
    b = clef.post("/v1/systemone", {"state": '{"plan":"pro","ticket":"' + STATE + '"}', "questions": q})
    assert a.status_code == 200 and b.status_code == 200
    # Keys sorted, no spaces: the same prompt as the string.
    assert a.json()["usage"] == b.json()["usage"]
    assert abs(a.json()["answers"]["refund"]["noul"] - b.json()["answers"]["refund"]["noul"]) < 1e-9


@pytest.mark.parametrize("body", [
    {"questions": QUESTIONS},
    {"state": STATE},
    {"state": STATE, "questions": {}},
    {"state": STATE, "questions": {"q": {"type": "other", "instructions": "x"}}},
    {"state": STATE, "questions": {"q": {"type": "noul"}}},
    {"state": STATE, "questions": {"q": {"type": "choice", "instructions": "x"}}},
    {"state": STATE, "questions": {"q": {"type": "choice", "instructions": "x", "criteria": {}}}},
    {"state": STATE, "questions": {"q": {"type": "score", "instructions": "x", "criteria": ["one"]}}},
    {"state": STATE, "questions": {f"q{i}": {"type": "noul", "instructions": "x"} for i in range(65)}},
    {"state": STATE, "questions": {"q": {"type": "choice", "instructions": "x",
                                         "criteria": {chr(65 + i) + "x": None for i in range(27)}}}},
    {"state": STATE, "questions": QUESTIONS, "images": ["https://example.com/a.png"]},
])
def test_bad_requests_are_named_400s(clef, body):
    r = clef.post("/v1/systemone", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["message"]


def test_images_and_models_without_a_head_are_501(clef, tiny):
    image = "data:image/png;base64,iVBORw0KGgo="
    r = clef.post("/v1/systemone", {"state": STATE, "questions": QUESTIONS, "images": [image]})
    assert r.status_code == 501, r.text
    r = tiny.post("/v1/systemone", {"state": STATE, "questions": QUESTIONS})
    assert r.status_code == 501, r.text
    assert r.json()["error"]["message"] == "This model is not a decision model"


@pytest.mark.parametrize("path,body", [
    ("/completion", {"prompt": "hi", "n_predict": 3}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
])
def test_text_generation_on_a_model_without_an_output_head_is_a_named_400(clef, path, body):
    # The clef graph ends at the final norm: no logits to sample from. Named, and the server
    # keeps answering decisions.
    r = clef.post(path, body)
    assert r.status_code == 400, r.text
    assert "has no output head" in r.json()["error"]["message"]
    r = clef.post("/v1/systemone", {"state": STATE, "questions": QUESTIONS})
    assert r.status_code == 200, r.text


def test_run_and_bench_take_prompts_alone_on_a_decision_model(clef_path):
    rc, text = run_cli("run", "-m", str(clef_path), "-p", "hello", "-n", "4")
    assert rc != 0 and "has no output head" in text, text
    rc, text = run_cli("run", "-m", str(clef_path), "-p", "hello", "-n", "0")
    assert rc == 0, text
    rc, text = run_cli("bench", "-m", str(clef_path), "-p", "32", "-n", "4", "-r", "1")
    assert rc != 0 and "bench its prompts alone with -n 0" in text, text
    rc, text = run_cli("bench", "-m", str(clef_path), "-p", "32", "-n", "0", "-r", "1")
    assert rc == 0 and "pp32" in text, text


def test_answers_equal_llama_servers_on_the_same_file(clef, clef_path):
    """llama-server b11434's answers on the same file (fixtures/systemone_llamacpp.json, made by
    tests/oracle/llamacpp_systemone.py; see host/tests/fixtures/PROVENANCE.md): the same prompt
    length, the same keys in the same order, every probability within 1e-4."""
    import hashlib
    import json
    from pathlib import Path

    golden = json.loads((Path(__file__).parent / "fixtures/systemone_llamacpp.json").read_text())
    sha = hashlib.sha256(Path(clef_path).read_bytes()).hexdigest()
    assert sha == golden["file_sha256"], "synth output changed: rerun tests/oracle/llamacpp_systemone.py"

    def values(answer):
        out = [answer[k] for k in ("noul", "score") if k in answer]
        return out + list(answer.get("probabilities", {}).values())

    for case in golden["cases"]:
        r = clef.post("/v1/systemone", case["body"])
        assert r.status_code == 200, r.text
        ours, theirs = r.json(), case["response"]
        assert ours["usage"] == theirs["usage"]
        assert list(ours["answers"]) == list(theirs["answers"])
        for qid, a in theirs["answers"].items():
            b = ours["answers"][qid]
            assert list(b) == list(a) and list(b.get("probabilities", {})) == list(a.get("probabilities", {}))
            assert b.get("choice") == a.get("choice") and b.get("legend") == a.get("legend")
            for x, y in zip(values(b), values(a)):
                assert abs(x - y) < 1e-4, (qid, b, a)
