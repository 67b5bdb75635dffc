"""`-hf` as llama-server b11434 does it, against a mock Hugging Face Hub (hf_hub_mock.py): every
scenario's requests, whether the server came up and under which id, and the cache folder it
left are those llama-server b11434 gave on the same scenario (host/tests/fixtures/hf_download.json,
made by tests/oracle/make_hf_golden.py); a scenario that fails ends with one named error line."""
import json
import os
import subprocess

import pytest

import hf_hub_mock
from conftest import BIN, PLUGINS, ROOT, Server, free_port, synth_file

FIXTURE = json.loads((ROOT / "host/tests/fixtures/hf_download.json").read_text())
GOLDEN = FIXTURE["scenarios"]

# The failing scenarios, and what bloomery's one error line says.
ERRORS = {
    "split": "split/tiny-Q2_K-00001-of-00002.gguf",
    "no-such-quant": "no GGUF file of bloomery-test/tiny-GGUF matches IQ1_S",
    "offline-not-cached": "no GGUF file of bloomery-test/tiny-GGUF's cached snapshot matches F16",
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    seeds = {"Q4_K_M": 7, "Q8_0": 8, "F16": 9}
    models = {q: synth_file(tmp_path_factory, f"{q}.gguf", "qwen3moe", seed=s).read_bytes() for q, s in seeds.items()}
    files = hf_hub_mock.repo_files(models)
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for sc in hf_hub_mock.SCENARIOS:
        out[sc[0]] = hf_hub_mock.run_scenario([BIN, "--plugin-dir", PLUGINS, "serve"], files, sc,
                                              root / ("cache-" + sc[1]))
    return out, root


@pytest.mark.parametrize("name", [sc[0] for sc in hf_hub_mock.SCENARIOS])
def test_hf_scenario_does_what_llama_server_does(results, name):
    got, log = results[0][name]
    assert got == GOLDEN[name], log
    if not got["served"]:
        errors = [line for line in log.splitlines() if line.startswith("error")]
        assert len(errors) == 1 and ERRORS[name] in errors[0], log


def test_a_bad_repo_name_is_refused_by_name():
    p = subprocess.run([BIN, "--plugin-dir", PLUGINS, "serve", "-hf", "just-a-model"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0
    assert "-hf just-a-model: invalid HF repo format, expected <user>/<model>[:quant]" in p.stderr, p.stderr


@pytest.mark.parametrize("command", [["run", "-p", "hi", "-n", "2"], ["bench", "-p", "4", "-n", "0", "-r", "1", "-o", "json"]])
def test_run_and_bench_take_the_same_model_flags(results, command):
    # The cache the serve scenarios left ("a" holds the Q8_0 file), read offline (nothing listens
    # at the endpoint); there is no -m.
    env = dict(os.environ, HF_HOME=str(results[1] / "cache-a"), HF_ENDPOINT="http://127.0.0.1:9")
    p = subprocess.run([BIN, "--plugin-dir", PLUGINS, command[0], "-hf", hf_hub_mock.REPO + ":q8_0", "--offline",
                        *command[1:]], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    if command[0] == "bench":
        name = json.loads(p.stdout)[0]["model_filename"]
        assert name.endswith("snapshots/0123456789abcdef0123456789abcdef01234567/tiny-Q8_0.gguf"), name


@pytest.mark.parametrize("cache", "abcd")
def test_cache_list_lists_what_llama_server_lists(results, cache):
    got = hf_hub_mock.cache_list([BIN, "--plugin-dir", PLUGINS, "serve"], results[1] / ("cache-" + cache))
    assert got == FIXTURE["cache_list"][cache]


def test_a_preset_fetches_its_model_and_a_later_flag_overrides_it(tmp_path_factory, tiny_path):
    # --fim-qwen-30b-default is llama-server's -hf of a Qwen3-Coder-30B-A3B repository (qwen3moe)
    # with its own port and batch settings; the mock serves the tiny qwen3moe under that name.
    repo = "ggml-org/Qwen3-Coder-30B-A3B-Instruct-Q8_0-GGUF"
    hub = hf_hub_mock.Hub({repo: {"qwen3-coder-30b-a3b-instruct-q8_0.gguf": tiny_path.read_bytes()}})
    cache = tmp_path_factory.mktemp("preset")
    env = dict(os.environ, HF_HOME=str(cache), HF_ENDPOINT=hub.url)
    port = free_port()
    try:
        # Server() puts `-m tiny --port P` first: -hf wins over -m, as in llama-server, and the
        # --port after the preset wins over the preset's 8012.
        s = Server(tiny_path, "--fim-qwen-30b-default", "--port", str(port), env=env, port=port)
        try:
            assert s.get("/v1/models").json()["data"][0]["id"] == repo
            props = s.get("/props").json()
            assert props["default_generation_settings"]["n_ctx"] > 0  # -c 0: the model's context
        finally:
            s.stop()
    finally:
        hub.stop()


def test_a_file_without_a_repository_is_refused_by_name(tiny_path):
    p = subprocess.run([BIN, "--plugin-dir", PLUGINS, "serve", "-m", str(tiny_path), "-hff", "x-Q8_0.gguf"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "-hff x-Q8_0.gguf: names a file of the -hf repository, and no -hf was given" in p.stderr, p.stderr
