"""The /infill setups and requests that tests/oracle/make_infill_golden.py sends to llama-server
b11434 and tests/server/test_infill.py to bloomery: the tiny qwen3moe (seed 7), whose vocabulary
has no FIM tokens, given them by --override-kv (tokens 500-504 of its 512), with or without the
repository and file-separator tokens, in PSM and SPM order, with a small batch and context that
cut the prefix, suffix and extra chunks, and with BOS turned on."""

FIM3 = "tokenizer.ggml.fim_pre_token_id=int:500,tokenizer.ggml.fim_suf_token_id=int:501,tokenizer.ggml.fim_mid_token_id=int:502"
FIM5 = FIM3 + ",tokenizer.ggml.fim_rep_token_id=int:503,tokenizer.ggml.fim_sep_token_id=int:504"

# name -> the server's flags after -m.
SETUPS = {
    "psm": ["--override-kv", FIM3],
    "repo": ["--override-kv", FIM5],
    "spm": ["--override-kv", FIM5, "--spm-infill"],
    "small": ["--override-kv", FIM5, "-b", "64", "-ub", "64", "-c", "512", "-n", "100"],
    "bos": ["--override-kv", FIM5 + ",tokenizer.ggml.add_bos_token=bool:true"],
}

WORDS = "the quick brown fox jumps over the lazy dog and then runs far away from home "
REQUESTS = [
    {"input_prefix": "def add(a, b):\n", "input_suffix": "\n    return c\n", "prompt": "    c = "},
    {"input_prefix": "def add(a, b):\n", "input_suffix": "\n    return c\n", "prompt": "    c = ",
     "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}, {"text": "x = 1\n"}]},
    {"input_prefix": ["def f(", 300, "):"], "input_suffix": "pass", "prompt": ""},
    {"input_prefix": WORDS * 20, "input_suffix": WORDS * 15, "prompt": "and",
     "input_extra": [{"filename": "a.txt", "text": WORDS * 30}]},
    {"input_prefix": "x", "input_suffix": "y", "input_extra": [{"filename": 123, "text": "abc"}]},
    {"input_prefix": "x", "input_suffix": "y", "input_extra": {"text": "abc"}},
]


def ask(url, body):
    """One /infill request of one token: its status and, when answered, how many prompt tokens
    were evaluated and the first token's ten likeliest ids with their log-probabilities (which
    differ when the prompt does; greedy text would also part at the random model's near ties)."""
    import requests
    r = requests.post(url + "/infill", json={**body, "n_predict": 1, "n_probs": 10, "temperature": 0,
                                             "cache_prompt": False}, timeout=120)
    if r.status_code != 200:
        return {"status": r.status_code}
    j = r.json()
    top = [[t["id"], t["logprob"]] for t in j["completion_probabilities"][0]["top_logprobs"]]
    return {"status": 200, "tokens_evaluated": j["tokens_evaluated"], "top": top}


def same(got, want, tol=5e-3):
    """Whether two answers of `ask` agree: the same status and prompt length, and each of the
    reference's five likeliest ids among the other's ten within `tol` of its log-probability."""
    if {k: v for k, v in got.items() if k != "top"} != {k: v for k, v in want.items() if k != "top"}:
        return False
    mine = dict((i, lp) for i, lp in got.get("top", []))
    return all(i in mine and abs(mine[i] - lp) <= tol for i, lp in want.get("top", [])[:5])
