#!/usr/bin/env python3
"""A vocabulary-only glm5-next GGUF (pre-tokenizer `glm4`, GLM-5.3's special tokens) written by
llama.cpp b11434's own converter, for the tokenizer goldens (no GLM vocabulary is on PyPI).

A byte-level BPE of 1,200 tokens is trained with `tokenizers` on the text crate's corpus with no
split pattern, so its merges cross the pieces of GLM-4's split pattern (digit runs, spaces,
punctuation) and only the right pattern gives llama.cpp's ids. GLM-5.3's special tokens follow it
in the order of the real vocabulary (<|endoftext|>, [MASK], [gMASK], [sMASK], <sop>, <eop>,
<|system|>, <|user|>, <|assistant|>, <|observation|>, ... : the real file's 154820..), so
<|endoftext|>, <|user|> and <|observation|> sit 0, 7 and 9 after the first special, as the real
stop ids 154820, 154827 and 154829 do. The tokenizer is saved with a GLM-5.3 config (a tiny text
model; only its vocabulary is written) and converted with `convert_hf_to_gguf.py --vocab-only`:
Glm5NextModel.set_vocab is the converter's own (`_set_vocab_glm`: bos [gMASK], eot <|user|>,
unk <|endoftext|>, eom <|observation|>); the one change is `get_vocab_base_pre`, which cannot
recognise a synthetic tokenizer's hash, answering `glm4` (what the real tokenizer's hash maps to).

usage: PYTHON=/work/notes/hf-venv/bin/python
       $PYTHON tests/oracle/glm5_vocab.py SDIST_LLAMA_CPP_DIR OUT.gguf
"""
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "../../text/tests/fixtures/corpus.json")
SPECIALS = [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
    "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
    "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>",
    "<|end_of_transcription|>", "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "<think>",
    "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>",
    "</arg_key>", "<arg_value>", "</arg_value>", "/nothink", "<|begin_of_box|>", "<|end_of_box|>",
    "<|image|>", "<|video|>", "<unk>",
]


def tokenizer(out_dir):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    text = json.load(open(CORPUS, encoding="utf-8"))
    # The specials come after the trained tokens, as in the real vocabulary: keep them out of training.
    for s in SPECIALS:
        text = [t.replace(s, " ") for t in text]
    tok.train_from_iterator(text * 4, trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<unk>",
                                   pad_token="<|endoftext|>")
    fast.save_pretrained(out_dir)
    return len(tok.get_vocab())


def config(out_dir, n_vocab):
    import transformers

    text = dict(vocab_size=n_vocab, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
                num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4,
                num_experts_per_tok=2, kv_lora_rank=64, q_lora_rank=32, qk_rope_head_dim=0, qk_nope_head_dim=32,
                v_head_dim=32, index_topk=8, index_head_dim=128, index_n_heads=2, index_kpool=4,
                linear_head_dim=32, linear_num_heads=2, mlp_layer_types=["dense"] + ["sparse"] * 3, pad_token_id=0)
    cfg = transformers.Glm5NextConfig(text_config=text, vision_config=dict(depth=1, hidden_size=32, num_heads=2,
                                      intermediate_size=32, out_hidden_size=64, projection_intermediate_size=32))
    cfg.save_pretrained(out_dir)
    p = os.path.join(out_dir, "config.json")
    c = json.load(open(p))
    c["architectures"] = ["Glm5NextForConditionalGeneration"]
    c["text_config"].update(linear_attn_config={"head_dim": 32, "num_heads": 2, "short_conv_kernel_size": 4,
                                                "gate_lower_bound": -5.0},
                            mla_use_nope=True, first_k_dense_replace=1)
    json.dump(c, open(p, "w"), indent=2)


def main():
    sdist, out = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        n = tokenizer(tmp)
        config(tmp, n)
        code = (
            "import sys; sys.path.insert(0, {sdist!r}); sys.path.insert(1, {gg!r});"
            "import conversion.base as b; b.TextModel.get_vocab_base_pre = lambda self, t: 'glm4';"
            "import convert_hf_to_gguf as c; sys.argv = ['convert_hf_to_gguf.py'] + {args!r}; c.main()"
        ).format(sdist=sdist, gg=os.path.join(sdist, "gguf-py"),
                 args=[tmp, "--vocab-only", "--outfile", out])
        subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL)
    print(f"{out}: {n} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()
