"""The samplers beyond the basic ones on the real binary (gemma-3-270m): each request field
reaches the chain (a seeded request gives the same text twice, and the sampler changes what
greedy or default sampling gives), the same settings as flags, and their refusals."""
import pytest

from conftest import Server

PROMPT = "Once upon a time, in a land far away,"

# Each one a sampler request llama-server takes; with a seed, each must repeat itself.
SAMPLERS = {
    "logit_bias_ids": {"logit_bias": [[236761, -5.0], [506, 2.0]]},
    "logit_bias_text_and_false": {"logit_bias": [[" the", False], ["there", 3]]},
    "logit_bias_object": {"logit_bias": {"506": -100, " king": 4}},
    "dry": {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 64},
    "dry_breakers": {"dry_multiplier": 1.5, "dry_sequence_breakers": ["\n", ","]},
    "xtc": {"xtc_probability": 0.5, "xtc_threshold": 0.05},
    "top_n_sigma": {"top_n_sigma": 1.0},
    "mirostat_v1": {"mirostat": 1, "mirostat_tau": 4.0, "mirostat_eta": 0.2},
    "mirostat_v2": {"mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.1},
    "dynatemp": {"dynatemp_range": 0.5, "dynatemp_exponent": 1.5},
    "adaptive_p": {"adaptive_target": 0.3, "adaptive_decay": 0.8,
                   "samplers": ["top_k", "min_p", "temperature", "adaptive_p"]},
    "order_names": {"samplers": ["temperature", "top-k", "nucleus"], "temperature": 1.5},
    "order_letters": {"samplers": "kmt", "temperature": 1.2},
}


def complete(server, route="/completion", **fields):
    body = {"prompt": PROMPT, "n_predict": 16, "seed": 1234, "temperature": 1.0, **fields}
    r = server.post(route, body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("name", SAMPLERS)
def test_a_seeded_request_with_each_sampler_repeats(gemma3, name):
    fields = SAMPLERS[name]
    first = complete(gemma3, **fields)
    second = complete(gemma3, **fields)
    assert first["content"] == second["content"], name
    assert first["tokens_predicted"] == second["tokens_predicted"] == 16


@pytest.mark.parametrize("name", ["logit_bias_ids", "xtc", "mirostat_v2", "dynatemp", "adaptive_p", "order_names"])
def test_each_sampler_changes_the_seeded_text(gemma3, name):
    plain = complete(gemma3)["content"]
    assert complete(gemma3, **SAMPLERS[name])["content"] != plain, name


def test_logit_bias_bans_the_greedy_token_on_every_route(gemma3):
    greedy = gemma3.post("/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0, "n_probs": 1}).json()
    top = greedy["completion_probabilities"][0]["id"]
    banned = gemma3.post("/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0, "n_probs": 1,
                                         "logit_bias": [[top, False]]}).json()
    assert banned["completion_probabilities"][0]["id"] != top
    # OpenAI's form: a map of token id strings to biases.
    oa = gemma3.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "temperature": 0,
                                         "logit_bias": {str(top): -100}}).json()
    assert oa["choices"][0]["text"] != greedy["content"]


@pytest.mark.parametrize("body,says", [
    ({"samplers": ["top_k", "banana"]}, "banana"),
    ({"samplers": "kq"}, "samplers"),
    ({"samplers": ["infill"]}, "infill"),
    ({"adaptive_decay": 2}, "adaptive_decay"),
    ({"dry_sequence_breakers": []}, "dry_sequence_breakers"),
    ({"logit_bias": [[999999999, 1]]}, "logit_bias"),
    ({"logit_bias": [["x", "y"]]}, "logit_bias"),
    ({"dry_multiplier": "high"}, "dry_multiplier"),
])
def test_bad_sampler_fields_are_named(gemma3, body, says):
    r = gemma3.post("/completion", {"prompt": PROMPT, "n_predict": 1, **body})
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text


def test_flags_set_the_defaults_props_shows(gemma3_path):
    s = Server(gemma3_path, "-c", "512", "--mirostat", "2", "--mirostat-ent", "3.5", "--dry-multiplier", "0.5",
               "--dry-sequence-breaker", "\n", "--xtc-probability", "0.2", "--top-nsigma", "1.5",
               "--dynatemp-range", "0.3", "--samplers", "penalties;top_k;temperature", "-l", "506-2", "-s", "7")
    try:
        p = s.get("/props").json()["default_generation_settings"]["params"]
        # f32 settings, shown as doubles (as llama-server shows its floats)
        got = (p["mirostat"], p["mirostat_tau"], p["dry_multiplier"], p["xtc_probability"], p["top_n_sigma"],
               p["dynatemp_range"])
        assert got == pytest.approx((2, 3.5, 0.5, 0.2, 1.5, 0.3))
        assert p["samplers"] == ["penalties", "top_k", "temperature"]
        # b11434's shape (server-task.cpp format_logit_bias).
        assert p["logit_bias"] == [{"bias": -2.0, "token": 506}]
        a = complete(s)["content"]
        assert a == complete(s)["content"]
    finally:
        s.stop()


@pytest.mark.parametrize("flags,says", [
    (["--mirostat", "3"], "--mirostat"),
    (["--samplers", "top_k;banana"], "--samplers"),
    (["--sampler-seq", "kq"], "--sampler-seq"),
    (["-l", "5x2"], "--logit-bias"),
    (["-l", "999999999+1"], "--logit-bias"),
    (["--dry-penalty-last-n", "-1"], "--dry-penalty-last-n"),
])
def test_bad_sampler_flags_stop_the_server_naming_them(gemma3_path, flags, says):
    with pytest.raises(RuntimeError) as e:
        Server(gemma3_path, "-c", "512", *flags)
    assert says in str(e.value)
