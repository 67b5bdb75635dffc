#!/usr/bin/env python3
"""Reference logits from llama.cpp for GGUF files, as JSON goldens.

Runs llama.cpp (the CPU library that `pip install llama-cpp-python==0.3.36` builds from its
vendored llama.cpp 0c1e57098) on a GGUF file: one batch holding a token sequence, logits at every
position, f32 KV cache, no flash attention. Writes {file_sha256, sequences: [{tokens, logits}]}.

With --dumper DUMP REFERENCE the logits come instead from DUMP, tests/oracle/llamacpp_dump_logits.cpp
linked against another llama.cpp build (for architectures 0c1e57098 lacks, e.g. glm5-next in
b11434), with the same settings; REFERENCE names that build in the JSON. With --per-token as
well, DUMP decodes one token per call (the recurrent-state path) instead of one batch.

usage: llamacpp_logits.py [--dumper DUMP REFERENCE [--per-token]] MODEL.gguf OUT.json SEQ [SEQ...]
  (SEQ = comma-separated token ids)
"""
import hashlib
import json
import subprocess
import sys


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def logits_for(model_path, tokens):
    import llama_cpp
    import numpy as np

    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), mp)
    assert model, "llama.cpp refused the model"
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = max(64, len(tokens) + 8)
    cp.n_batch = cp.n_ctx
    cp.n_ubatch = cp.n_ctx
    cp.n_threads = 2
    cp.n_threads_batch = 2
    cp.type_k = llama_cpp.GGML_TYPE_F32
    cp.type_v = llama_cpp.GGML_TYPE_F32
    cp.flash_attn_type = 0
    ctx = llama_cpp.llama_init_from_model(model, cp)
    assert ctx, "llama.cpp could not make a context"
    n = len(tokens)
    batch = llama_cpp.llama_batch_init(n, 0, 1)
    for i, t in enumerate(tokens):
        batch.token[i] = t
        batch.pos[i] = i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = 1
    batch.n_tokens = n
    assert llama_cpp.llama_decode(ctx, batch) == 0, "llama_decode failed"
    vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    out = []
    for i in range(n):
        p = llama_cpp.llama_get_logits_ith(ctx, i)
        out.append(np.ctypeslib.as_array(p, shape=(vocab,)).astype(np.float32).tolist())
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return out


def main():
    args = sys.argv[1:]
    dumper = None
    mode = "batch"
    if args[0] == "--dumper":
        dumper, reference, args = args[1], args[2], args[3:]
        if args[0] == "--per-token":
            mode, args = "token", args[1:]
    model, out_path, seqs = args[0], args[1], args[2:]
    result = {"reference": None, "file_sha256": sha256(model), "sequences": []}
    if dumper:
        result["reference"] = f"{reference}, tests/oracle/llamacpp_dump_logits.cpp ({mode})"
        out = subprocess.run([dumper, model, mode, *seqs], check=True, capture_output=True, text=True).stdout
        for got, s in zip(json.loads(out), seqs, strict=True):
            assert got["tokens"] == [int(x) for x in s.split(",")]
            # 8 significant digits, as the transformers goldens.
            got["logits"] = [[float(f"{v:.8g}") for v in row] for row in got["logits"]]
            result["sequences"].append(got)
    else:
        import llama_cpp

        result["reference"] = "llama.cpp 0c1e57098 via llama-cpp-python " + llama_cpp.__version__
        for s in seqs:
            tokens = [int(x) for x in s.split(",")]
            result["sequences"].append({"tokens": tokens, "logits": logits_for(model, tokens)})
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
