#!/usr/bin/env python3
"""Reference logits from llama.cpp b11739 (prebuilt CPU library of `llama-cpp-py-sync==0.11739`), as JSON goldens.

Same output as llamacpp_logits.py ({reference, file_sha256, sequences: [{tokens, logits}]}), but from a
llama.cpp new enough for qwen35 / qwen35moe (and the other archs that llama-cpp-python 0.3.36 lacks).
Model loaded from the GGUF as is, f32 K/V cache, no flash attention, CPU only. Two modes:
  default       one llama_decode per sequence, logits at every position;
  --per-token   one llama_decode per token (batch of 1, positions 0..n-1 in one context), which runs the
                recurrent-state (GDN conv/SSM state) carry-over path instead of the chunked one.

llama.cpp runs in a child process (this script with --worker): a GGML_ASSERT / abort() there kills
only the child, and its log is printed here before failing.

The bundled libllama.so needs glibc >= 2.38 (it calls __isoc23_strtol & co). On an older system (Debian
12 has 2.36) the child is started through a newer glibc's dynamic loader, from $ORACLE_GLIBC (default
/work/oracle/glibc/usr/lib/x86_64-linux-gnu), which tests/oracle/setup_oracle_venv.sh unpacks from
Debian 13's libc6 package. Nothing else of the system changes.

usage: llamacpp_sync_logits.py [--per-token] MODEL.gguf OUT.json SEQ [SEQ...]   (SEQ = comma-separated token ids)
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

DEFAULT_GLIBC = "/work/oracle/glibc/usr/lib/x86_64-linux-gnu"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# child: talks to libllama through the package's CFFI bindings (ABI mode, header of b11739)
# ----------------------------------------------------------------------------------------------
def worker(model_path, per_token, seqs, out_path):
    from llama_cpp_py_sync._cffi_bindings import get_ffi, get_lib

    lib, ffi = get_lib(), get_ffi()
    lib.llama_backend_init()
    mp = lib.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = lib.llama_model_load_from_file(model_path.encode(), mp)
    if model == ffi.NULL:
        sys.exit("llama.cpp refused the model")
    vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))
    threads = max(1, min(8, os.cpu_count() or 1))
    out = []
    for tokens in seqs:
        n = len(tokens)
        cp = lib.llama_context_default_params()
        cp.n_ctx = max(64, n + 8)
        cp.n_batch = cp.n_ctx
        cp.n_ubatch = cp.n_ctx
        cp.n_seq_max = 1
        cp.n_outputs_max = 0  # 0 = n_batch
        cp.n_outputs_max_per_seq = 0  # 0 = n_outputs_max (the default, 1, would refuse all-position logits)
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.type_k = 0  # GGML_TYPE_F32
        cp.type_v = 0
        cp.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = lib.llama_init_from_model(model, cp)
        if ctx == ffi.NULL:
            sys.exit("llama.cpp could not make a context")
        rows = []
        chunks = [[i] for i in range(n)] if per_token else [list(range(n))]
        for chunk in chunks:
            batch = lib.llama_batch_init(len(chunk), 0, 1)
            for j, i in enumerate(chunk):
                batch.token[j] = tokens[i]
                batch.pos[j] = i
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = 0
                batch.logits[j] = 1
            batch.n_tokens = len(chunk)
            rc = lib.llama_decode(ctx, batch)
            if rc != 0:
                sys.exit(f"llama_decode returned {rc} (positions {chunk[0]}..{chunk[-1]})")
            for j in range(len(chunk)):
                p = lib.llama_get_logits_ith(ctx, j)
                if p == ffi.NULL:
                    sys.exit(f"no logits for batch row {j}")
                rows.append(np.frombuffer(ffi.buffer(p, 4 * vocab), dtype=np.float32).copy())
            lib.llama_batch_free(batch)
        lib.llama_free(ctx)
        out.append(np.stack(rows))
    lib.llama_model_free(model)
    np.savez(out_path, *out)


# ----------------------------------------------------------------------------------------------
# parent
# ----------------------------------------------------------------------------------------------
def glibc_older_than(major, minor):
    try:
        v = os.confstr("CS_GNU_LIBC_VERSION").split()[1]
        got = tuple(int(x) for x in v.split(".")[:2])
    except (ValueError, OSError, IndexError, AttributeError):
        return False
    return got < (major, minor)


def child_command():
    cmd = [sys.executable, os.path.abspath(__file__), "--worker"]
    if not glibc_older_than(2, 38):
        return cmd
    g = os.environ.get("ORACLE_GLIBC", DEFAULT_GLIBC)
    ld = os.path.join(g, "ld-linux-x86-64.so.2")
    if not os.path.exists(ld):
        sys.exit(f"this system's glibc is older than 2.38, which llama-cpp-py-sync's libllama.so needs, and {ld} "
                 "is missing: run tests/oracle/setup_oracle_venv.sh (or point ORACLE_GLIBC at a glibc >= 2.38)")
    # the newer loader + libc first, the system's other libraries (libstdc++, libgomp) after
    return [ld, "--library-path", f"{g}:/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu"] + cmd


def logits_for(model_path, seqs, per_token):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.npz")
        arg = json.dumps({"model": model_path, "per_token": per_token, "seqs": seqs, "out": out})
        p = subprocess.run(child_command() + [arg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        log = p.stdout.decode("utf-8", errors="replace")
        if p.returncode != 0 or not os.path.exists(out):
            sys.stderr.write(log[-20000:])
            sys.exit(f"llama.cpp child failed with exit status {p.returncode} (log above)")
        z = np.load(out)
        return [z[f"arr_{i}"] for i in range(len(seqs))]


def main():
    args = sys.argv[1:]
    if args and args[0] == "--worker":
        a = json.loads(args[1])
        worker(a["model"], a["per_token"], a["seqs"], a["out"])
        return
    per_token = False
    if args and args[0] == "--per-token":
        per_token = True
        args = args[1:]
    if len(args) < 3:
        sys.exit(__doc__)
    model, out_path, seq_args = args[0], args[1], args[2:]
    seqs = [[int(x) for x in s.split(",")] for s in seq_args]
    from llama_cpp_py_sync import _version as m

    mode = "one llama_decode per token" if per_token else "one llama_decode per sequence"
    result = {
        "reference": f"llama.cpp {m.__llama_cpp_tag__} ({m.__llama_cpp_commit__}) via llama-cpp-py-sync {m.__version__}, "
                     f"CPU, f32 KV, no flash attention, {mode}",
        "file_sha256": sha256(model),
        "sequences": [],
    }
    for tokens, logits in zip(seqs, logits_for(os.path.abspath(model), seqs, per_token)):
        result["sequences"].append({"tokens": tokens, "logits": logits.astype(np.float32).tolist()})
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
