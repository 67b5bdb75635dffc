"""Draft decoding as llama-server b11434 reports it (issue 48): `speculative` in /props'
default_generation_settings and in each /slots entry (true when the slots have a draft source),
`speculative.types` in the params, the request's draft counts in its timings (the final streamed
chunk's too), and /metrics' accepted tokens per draft position. A file with MTP layers drafts by
default, each slot through its drafting gate, which bloomery reports in fields of its own
(`bloomery_draft_gate` in /slots, `bloomery_draft_gates` in /props, `spec_gate_switches_total`
in /metrics)."""

import json

import pytest
import requests

from conftest import QWEN3_TEMPLATE, Server, run_cli, sse_lines, synth_file


@pytest.fixture(scope="module")
def mtp_path(tmp_path_factory):
    """The synthetic tiny qwen35moe with its MTP block (f32, seed 7)."""
    return synth_file(tmp_path_factory, "tiny-mtp-qwen35moe.gguf", "qwen35moe", preset="tiny-mtp")


def reported(server):
    """(/props' speculative, its params' speculative.types, every /slots entry's speculative)."""
    props = server.get("/props").json()["default_generation_settings"]
    slots = server.get("/slots").json()
    return props["speculative"], props["params"]["speculative.types"], [s["speculative"] for s in slots]


@pytest.mark.parametrize(
    "flags, want",
    [
        ((), (True, "draft-mtp")),
        (("--spec-type", "draft-mtp"), (True, "draft-mtp")),
        (("--spec-type", "none"), (False, "none")),
        (("--spec-type", "draft-mtp,ngram-simple"), (True, "ngram-simple,draft-mtp")),
    ],
)
def test_a_file_with_mtp_layers_drafts_unless_told_not_to_and_says_so(mtp_path, flags, want):
    s = Server(mtp_path, "-c", "512", "-np", "2", "--chat-template-file", str(QWEN3_TEMPLATE), *flags)
    try:
        spec, types, slots = reported(s)
        assert (spec, types) == want
        assert slots == [want[0]] * 2
        # Each drafting slot's gate, on before anything is measured; none without drafting.
        gates = [g.get("bloomery_draft_gate") for g in s.get("/slots").json()]
        props_gates = s.get("/props").json()["bloomery_draft_gates"]
        if want[0]:
            # One gate per drafter: the chain's last, with those consulted before it under "first".
            fresh = {"drafting": True, "switches": 0, "plain_step_ms": None, "draft_step_ms": None,
                     "tokens_per_draft_step": None}
            *first, last = want[1].split(",")
            fresh = {"drafter": last, **fresh, **({"first": [{"drafter": d, **fresh} for d in first]} if first else {})}
            assert gates == [fresh] * 2, gates
            assert props_gates == [{"id": i, "gate": fresh} for i in range(2)], props_gates
        else:
            assert gates == [None] * 2 and props_gates == [], (gates, props_gates)
        r = s.post("/completion", {"prompt": "Hello there", "n_predict": 6, "temperature": 0})
        assert r.status_code == 200, r.text
        t = r.json()["timings"]
        # llama-server gives the counts only when something was drafted.
        if want[0]:
            assert t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"], t
        else:
            assert "draft_n" not in t, t
    finally:
        s.stop()


def test_a_file_without_mtp_layers_does_not_draft(tiny):
    assert reported(tiny) == (False, "none", [False] * 4)


def last_timings(server, path, body):
    """The timings of the last streamed chunk that carries any (the final one)."""
    with requests.post(server.url + path, json={**body, "stream": True}, stream=True, timeout=300) as r:
        assert r.status_code == 200, r.text
        chunks = [
            json.loads(line[len("data: "):])
            for line in sse_lines(r)
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
    timed = [c["timings"] for c in chunks if "timings" in c]
    assert timed, chunks
    return timed[-1]


def per_pos(metrics):
    """llama-server's accepted-per-position series of a /metrics text, by position."""
    name = 'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="'
    out = {}
    for line in metrics.splitlines():
        if line.startswith(name):
            pos, value = line[len(name):].split('"} ')
            out[int(pos)] = int(value)
    return out


def counter(metrics, name):
    return float(next(l.split()[1] for l in metrics.splitlines() if l.startswith(f"llamacpp:{name} ")))


def test_streamed_final_chunks_carry_the_draft_counts_and_metrics_count_per_position(mtp_path):
    # Ungated, so that every request drafts at every step and a stream drafts what the whole
    # answer did (the gate's choices follow the clock).
    s = Server(mtp_path, "-c", "512", "-np", "1", "--metrics", "--spec-type", "draft-mtp", "--spec-no-gate",
               "--chat-template-file", str(QWEN3_TEMPLATE))
    try:
        # Nothing verified yet: no per-position series (llama-server writes it once non-empty).
        m = s.get("/metrics")
        assert m.status_code == 200, m.text
        assert "spec_decode_num_accepted_tokens_per_pos_total" not in m.text
        body = {"prompt": "Hello there", "n_predict": 12, "temperature": 0}
        whole = s.post("/completion", body).json()["timings"]
        assert whole["draft_n"] > 0, whole
        chat = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 12, "temperature": 0}
        whole_chat = s.post("/v1/chat/completions", chat).json()["timings"]
        # Greedy, so a stream drafts and keeps what the whole answer did.
        for path, b, want in [
            ("/completion", body, whole),
            ("/v1/completions", body, whole),
            ("/v1/chat/completions", chat, whole_chat),
        ]:
            t = last_timings(s, path, b)
            assert (t["draft_n"], t["draft_n_accepted"]) == (want["draft_n"], want["draft_n_accepted"]), (path, t)
        m = s.get("/metrics").text
        pos = per_pos(m)
        # --spec-draft-n-max 3: one series per draft position, a step keeping position i kept
        # every position before it, and the series add up to the accepted tokens.
        assert sorted(pos) == [0, 1, 2], m
        assert pos[0] >= pos[1] >= pos[2], pos
        assert sum(pos.values()) == counter(m, "spec_decode_num_accepted_tokens_total"), m
        assert pos[0] <= counter(m, "spec_decode_num_drafts_total"), m
        assert "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter" in m
        assert counter(m, "spec_gate_switches_total") == 0, m
        # Ungated: no gate reported.
        assert "bloomery_draft_gate" not in s.get("/slots").json()[0]
    finally:
        s.stop()


@pytest.mark.parametrize("length", ["1", "2.5", "4"])
def test_a_synthetic_acceptance_length_keeps_drafts_at_random(mtp_path, length):
    """llama-server's --spec-synth-len: 1 keeps no draft, n_max + 1 (4) every one (a drafted end
    of generation aside), between them a mean of L tokens a verify step."""
    s = Server(mtp_path, "-c", "512", "-np", "1", "--metrics", "--spec-synth-len", length)
    try:
        # The draws follow the request's seed; an end of generation would cut the count short.
        body = {"prompt": "Hello there", "n_predict": 150, "temperature": 0, "seed": 11, "ignore_eos": True}
        r = s.post("/completion", body)
        assert r.status_code == 200, r.text
        j = r.json()
        t = j["timings"]
        assert j["tokens_predicted"] == 150 and t["draft_n"] > 0, t
        m = s.get("/metrics").text
        steps = counter(m, "spec_decode_num_drafts_total")
        mean = 1 + counter(m, "spec_decode_num_accepted_tokens_total") / steps
        if length == "1":
            assert t["draft_n_accepted"] == 0, t
        elif length == "4":
            assert t["draft_n_accepted"] >= t["draft_n"] - 3, t
        else:
            assert abs(mean - 2.5) < 0.35, (mean, steps)
        # A grammar request runs too: kept drafts leave the grammar where it was.
        g = s.post("/completion", {"prompt": "Hi", "n_predict": 8, "grammar": 'root ::= [a-z]+'})
        assert g.status_code == 200, g.text
    finally:
        s.stop()


def test_a_gated_slot_reports_its_measured_costs(mtp_path):
    s = Server(mtp_path, "-c", "512", "-np", "1", "--metrics", "--chat-template-file", str(QWEN3_TEMPLATE))
    try:
        body = {"prompt": "Hello there", "n_predict": 40, "temperature": 0}
        assert s.post("/completion", body).status_code == 200
        gate = s.get("/slots").json()[0]["bloomery_draft_gate"]
        # Drafting is on at first, so the first steps draft; a plain probe follows two of them.
        assert gate["draft_step_ms"] > 0 and gate["tokens_per_draft_step"] >= 1, gate
        assert gate["plain_step_ms"] > 0, gate
        # Each switch is counted once in /metrics.
        switches = counter(s.get("/metrics").text, "spec_gate_switches_total")
        assert switches == gate["switches"], (switches, gate)
    finally:
        s.stop()


NGRAM_SIMPLE = ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1",
                "--spec-ngram-simple-size-m", "6")
NGRAM_MOD = ("--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "1", "--spec-ngram-mod-n-max", "8",
             "--spec-ngram-mod-n-min", "1")
# Both in one list, consulted ngram-simple first as llama-server b11434 consults them (its order,
# not the list's: /props names them in that order).
NGRAM_BOTH = ("--spec-type", "ngram-simple,ngram-mod", "--spec-ngram-simple-size-n", "2",
              "--spec-ngram-simple-size-m", "3", *NGRAM_MOD[2:])


@pytest.mark.parametrize("model, kept", [("tiny_path", True), ("hybrid_path", False)])
@pytest.mark.parametrize("spec", [NGRAM_SIMPLE, NGRAM_MOD, NGRAM_BOTH],
                         ids=["ngram-simple", "ngram-mod", "ngram-simple,ngram-mod"])
def test_ngram_drafts_from_the_history_and_change_no_token(model, kept, spec, request):
    """llama-server's --spec-type ngram-simple and ngram-mod: drafts from token history (the
    slot's own; a table of every slot's), verified by the model (an attention-only file, and a
    hybrid whose recurrent state rolls back); greedy and seeded answers as without drafting."""
    path = request.getfixturevalue(model)
    prompt = "one two three four one two three four one two three four one two"
    bodies = [
        {"prompt": prompt, "n_predict": 64, "temperature": 0},
        {"prompt": prompt, "n_predict": 64, "temperature": 0.8, "seed": 5},
    ]
    answers = {}
    for flags in [("--spec-type", "none"), (*spec, "--spec-no-gate")]:
        s = Server(path, "-c", "512", "-np", "1", "--metrics", *flags)
        try:
            props = s.get("/props").json()["default_generation_settings"]
            assert props["params"]["speculative.types"] == flags[1], props
            answers[flags[1]] = [s.post("/completion", b).json() for b in bodies]
        finally:
            s.stop()
    for off, on in zip(answers["none"], answers[spec[1]]):
        assert on["content"] == off["content"], (on["content"], off["content"])
        assert "draft_n" not in off["timings"], off["timings"]
    greedy = answers[spec[1]][0]["timings"]
    # The history repeats, so drafts are made; the qwen3moe file's greedy answer repeats itself,
    # so some are kept (the hybrid's refuses every one: each step rolls its state back).
    assert greedy["draft_n"] > 0 and 0 <= greedy["draft_n_accepted"] <= greedy["draft_n"], greedy
    assert (greedy["draft_n_accepted"] > 0) == kept, greedy


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--spec-type", "draft-simple,draft-mtp"), "combining draft-simple with draft-mtp"),
        (("--spec-ngram-map-k4v-size-m", "0"), "--spec-ngram-map-k4v-size-m"),
        (("--spec-type", "ngram-simple,ngram-cache"), "--spec-type ngram-cache: not supported"),
        (("--spec-type", "ngram-simple,none"), "none beside other types"),
        (("--spec-type", "ngram-simple,draft-mtp"), "--spec-type draft-mtp: this model (`qwen3moe`) has no MTP"),
        (("--spec-ngram-mod-n-match", "0"), "--spec-ngram-mod-n-match"),
        (("--spec-ngram-simple-size-n", "0"), "--spec-ngram-simple-size-n"),
        (("--spec-ngram-simple-size-m", "1025"), "--spec-ngram-simple-size-m"),
    ],
)
def test_unsupported_or_out_of_range_ngram_settings_are_refused_by_name(tiny_path, flags, message):
    rc, text = run_cli("serve", "-m", str(tiny_path), *flags)
    assert rc != 0 and message in text, text


@pytest.fixture(scope="module")
def other_tiny(tmp_path_factory):
    """Another synthetic tiny qwen3moe (seed 8): the same vocabulary, other weights."""
    return synth_file(tmp_path_factory, "tiny-qwen3moe-8.gguf", "qwen3moe", seed=8)


@pytest.mark.parametrize("draft, all_kept", [("tiny_path", True), ("other_tiny", False)])
def test_draft_simple_drafts_with_a_draft_model_and_changes_no_token(tiny_path, draft, all_kept, request):
    """llama-server's --spec-type draft-simple with -md: a separate model of the same vocabulary
    drafts from its own cache; greedy and seeded answers as without drafting. The model itself as
    its draft model has every greedy draft kept."""
    path = request.getfixturevalue(draft)
    bodies = [
        {"prompt": "Hello there, how are", "n_predict": 48, "temperature": 0},
        {"prompt": "Hello there, how are", "n_predict": 48, "temperature": 0.8, "seed": 5},
    ]
    answers = {}
    for flags in [("--spec-type", "none"),
                  ("--spec-type", "draft-simple", "-md", str(path), "--spec-no-gate")]:
        s = Server(tiny_path, "-c", "512", "-np", "2", *flags)
        try:
            props = s.get("/props").json()["default_generation_settings"]
            assert props["params"]["speculative.types"] == flags[1], props
            answers[flags[1]] = [s.post("/completion", b).json() for b in bodies]
        finally:
            s.stop()
    for off, on in zip(answers["none"], answers["draft-simple"]):
        assert on["content"] == off["content"], (on["content"], off["content"])
    greedy = answers["draft-simple"][0]["timings"]
    assert greedy["draft_n"] > 0, greedy
    assert (greedy["draft_n_accepted"] == greedy["draft_n"]) == all_kept, greedy


def test_draft_simple_refuses_a_draft_model_it_cannot_use(tiny_path, hybrid_path, gemma3_path):
    for flags, message in [
        (("--spec-type", "draft-simple"), "--spec-type draft-simple: no draft model"),
        (("--spec-type", "draft-simple", "-md", str(hybrid_path)), "keeps recurrent state"),
        (("--spec-type", "draft-simple", "-md", str(gemma3_path)), "vocabulary is of another kind"),
    ]:
        rc, text = run_cli("serve", "-m", str(tiny_path), "--port", "0", *flags)
        assert rc != 0 and message in text, (flags, text)
