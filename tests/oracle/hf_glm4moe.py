#!/usr/bin/env python3
"""Tiny random `SolarOpenForCausalLM` and `Glm4MoeForCausalLM` models (transformers 5.24, CPU f32),
converted to GGUF by llama.cpp's own `convert_hf_to_gguf.py`, with transformers' logits (and router
choices) at every position of fixed token sequences as JSON goldens.

Three files:
- `solar_tiny_rot_full.gguf`: Solar-Open with `rope_parameters.partial_rotary_factor: 1.0` written into
  config.json before converting (what the real checkpoint must carry), so the file rotates the whole
  head as transformers does;
- `solar_tiny_rot_half.gguf`: the same weights converted without the key: the converter falls back to
  half the head (`rope.dimension_count` = head_dim / 2), transformers still rotates all of it; the
  golden records transformers' logits so the gap can be measured, the file is checked against llama.cpp;
- `glm_tiny.gguf`: GLM-4.x with Q/K/V biases, QK-norm, partial rotary 0.5, one dense lead layer,
  routed scale 2.5 and one MTP layer announced (`num_nextn_predict_layers: 1`; transformers keeps no
  MTP weights, so the file is trunk-only, a shape llama.cpp loads).

A byte-level BPE tokenizer is trained with `tokenizers` on the text crate's corpus (specials of both
families added); the converter cannot recognise its pre-tokenizer hash, so `get_vocab_base_pre` is
replaced by the family's name (`solar-open`, `glm4`); nothing else of the converter is changed. With
`--vocab-only` the same converter writes `solar_vocab.gguf`, a larger vocabulary for the tokenizer test,
whose merges were trained across the split pattern's pieces, so that only the right pattern gives
llama.cpp's ids.

usage: PYTHON=/work/notes/hf-venv/bin/python
       $PYTHON tests/oracle/hf_glm4moe.py SDIST_LLAMA_CPP_DIR OUT_DIR
Writes OUT_DIR/{solar_tiny_rot_full,solar_tiny_rot_half,glm_tiny}.gguf and *_hf.json, solar_vocab.gguf.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import Glm4MoeConfig, Glm4MoeForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from transformers import SolarOpenConfig, SolarOpenForCausalLM  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "../../text/tests/fixtures/corpus.json")
SEQS = [[5, 77, 200, 12, 250, 256, 1], [3, 4, 5, 6, 100, 200, 150, 40, 45, 257, 258, 259]]
SPECIALS = [
    "<|startoftext|>", "<|endoftext|>", "<unk>", "<|begin|>", "<|end|>", "<|content|>", "<|think|>",
    "<|flush|>", "<|calls|>", "<|tool_calls|>", "<|tool_call:begin|>", "<|tool_call:name|>",
    "<|tool_call:args|>", "<|tool_call:end|>", "<|tool_response|>", "[gMASK]", "<sop>", "<|user|>",
    "<|assistant|>", "<|system|>", "<|observation|>",
]
# The `solar-open` (= Qwen2) split pattern, as the real tokenizer.json spells it.
SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def tokenizer(vocab_size, out_dir, split):
    """A byte-level BPE trained on the corpus. With `split` its merges stay inside the pieces of
    Solar's split pattern; without it they also cross them (digit runs, spaces, punctuation), so
    that a tokenizer applying another pattern gives other ids."""
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if split:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = json.load(open(CORPUS, encoding="utf-8"))
    tok.train_from_iterator(text * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|startoftext|>", eos_token="<|endoftext|>",
                                   unk_token="<unk>")
    fast.save_pretrained(out_dir)
    return len(tok.get_vocab())


def perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def hf_goldens(model, reference):
    """Logits at every position and each MoE layer's chosen experts (sorted) per position."""
    chosen = {}

    def hook(layer):
        def f(_mod, _inp, out):
            chosen[layer] = out[2].tolist()
        return f

    handles = []
    for il, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "e_score_correction_bias"):
            handles.append(gate.register_forward_hook(hook(il)))
    seqs = []
    for s in SEQS:
        chosen.clear()
        with torch.no_grad():
            out = model(torch.tensor([s]), use_cache=False)
        ids = [[sorted(chosen[il][i]) for i in range(len(s))] for il in sorted(chosen)]
        seqs.append({"tokens": s, "logits": out.logits[0].float().numpy().tolist(), "router_ids": ids,
                     "router_layers": sorted(chosen)})
    for h in handles:
        h.remove()
    return {"reference": reference, "sequences": seqs}


def convert(sdist, model_dir, out, pre, *extra):
    code = (
        "import sys; sys.path.insert(0, {sdist!r}); sys.path.insert(1, {gg!r});"
        "import conversion.base as b; b.TextModel.get_vocab_base_pre = lambda self, t: {pre!r};"
        "import convert_hf_to_gguf as c; sys.argv = ['convert_hf_to_gguf.py'] + {args!r}; c.main()"
    ).format(sdist=sdist, gg=os.path.join(sdist, "gguf-py"), pre=pre,
             args=[model_dir, "--outtype", "f32", "--outfile", out, *extra])
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL)


def set_partial(model_dir, factor):
    p = os.path.join(model_dir, "config.json")
    cfg = json.load(open(p))
    rp = dict(cfg.get("rope_parameters") or {})
    if factor is None:
        rp.pop("partial_rotary_factor", None)
    else:
        rp["partial_rotary_factor"] = factor
    cfg["rope_parameters"] = rp
    json.dump(cfg, open(p, "w"), indent=1)


def main():
    sdist, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    ref = f"transformers {transformers.__version__}, torch {torch.__version__}, CPU f32"
    with tempfile.TemporaryDirectory() as tmp:
        big = os.path.join(tmp, "vocab")
        n_big = tokenizer(1200, big, split=False)
        small = os.path.join(tmp, "small")
        n_vocab = tokenizer(300, small, split=True)
        common = dict(vocab_size=n_vocab, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=8,
                      n_shared_experts=1, rms_norm_eps=1e-5, initializer_range=0.1, tie_word_embeddings=False,
                      max_position_embeddings=256)

        # Solar-Open: every layer MoE, no biases, no QK-norm, scale 1.
        torch.manual_seed(11)
        cfg = SolarOpenConfig(num_hidden_layers=2, routed_scaling_factor=1.0,
                              rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                               "partial_rotary_factor": 1.0}, **common)
        model = SolarOpenForCausalLM(cfg).float().eval()
        perturb(model, 12)
        solar = os.path.join(tmp, "solar")
        model.save_pretrained(solar)
        for f in os.listdir(small):
            os.link(os.path.join(small, f), os.path.join(solar, f))
        gold = hf_goldens(model, ref + ", SolarOpenForCausalLM")
        for name, factor in [("solar_tiny_rot_full", 1.0), ("solar_tiny_rot_half", None)]:
            set_partial(solar, factor)
            path = os.path.join(out_dir, f"{name}.gguf")
            convert(sdist, solar, path, "solar-open")
            json.dump({**gold, "file_sha256": sha256(path)}, open(os.path.join(out_dir, f"{name}_hf.json"), "w"))
        vocab_dir = os.path.join(tmp, "solar_vocab")
        os.makedirs(vocab_dir)
        os.link(os.path.join(solar, "config.json"), os.path.join(vocab_dir, "config.json"))
        for f in os.listdir(big):
            os.link(os.path.join(big, f), os.path.join(vocab_dir, f))
        cfg_big = json.load(open(os.path.join(vocab_dir, "config.json")))
        cfg_big["vocab_size"] = n_big
        os.unlink(os.path.join(vocab_dir, "config.json"))
        json.dump(cfg_big, open(os.path.join(vocab_dir, "config.json"), "w"))
        convert(sdist, vocab_dir, os.path.join(out_dir, "solar_vocab.gguf"), "solar-open", "--vocab-only")

        # GLM-4.x: biases, QK-norm, partial rotary 0.5, a dense lead layer, scale 2.5, one MTP layer.
        torch.manual_seed(21)
        cfg = Glm4MoeConfig(num_hidden_layers=3, first_k_dense_replace=1, intermediate_size=48,
                            attention_bias=True, use_qk_norm=True, routed_scaling_factor=2.5,
                            num_nextn_predict_layers=1,
                            rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                             "partial_rotary_factor": 0.5}, **common)
        model = Glm4MoeForCausalLM(cfg).float().eval()
        perturb(model, 22)
        glm = os.path.join(tmp, "glm")
        model.save_pretrained(glm)
        for f in os.listdir(small):
            os.link(os.path.join(small, f), os.path.join(glm, f))
        gold = hf_goldens(model, ref + ", Glm4MoeForCausalLM")
        path = os.path.join(out_dir, "glm_tiny.gguf")
        convert(sdist, glm, path, "glm4")
        json.dump({**gold, "file_sha256": sha256(path)}, open(os.path.join(out_dir, "glm_tiny_hf.json"), "w"))


if __name__ == "__main__":
    main()
