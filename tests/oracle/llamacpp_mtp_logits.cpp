// Logits of a llama.cpp build's MTP graph (an MTP-only GGUF, e.g. qwen4exp's `--mtp` file) at every row
// of one sequence, as JSON on stdout: {"tokens": [...], "logits": [[...], ...]}. Our code, linked
// against a llama.cpp build's static libraries like llamacpp_dump_logits.cpp. Row i of the one batch is
// the token TOKENS[i] at position i with the hidden row i of HIDDEN.f32 as its state (the trunk's
// residual row the MTP block reads: raw little-endian f32, rows of the model's n_embd_out), so the
// pairing of rows and tokens is the caller's (llama.cpp's own drafting driver, common/speculative.cpp,
// puts the pair (h_p, x_{p+1}) at position p + 1 behind a row of zeros at position 0). One context of
// type MTP: f32 K/V cache, flash attention off, 2 threads.
// usage: llamacpp_mtp_logits MTP.gguf HIDDEN.f32 TOKENS   (TOKENS = comma-separated token ids)
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MTP.gguf HIDDEN.f32 TOKENS\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    if (!getenv("VERBOSE")) {
        llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    }
    llama_model_params mp = llama_model_default_params();
    mp.load_mtp = true;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llama.cpp refused the model\n");
        return 1;
    }
    std::vector<llama_token> toks;
    for (char * p = strtok(argv[3], ","); p; p = strtok(nullptr, ",")) {
        toks.push_back(atoi(p));
    }
    const int n = (int) toks.size();
    FILE * f = fopen(argv[2], "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", argv[2]);
        return 1;
    }
    std::vector<float> hidden;
    float buf[4096];
    for (size_t got; (got = fread(buf, sizeof(float), 4096, f)) > 0;) {
        hidden.insert(hidden.end(), buf, buf + got);
    }
    fclose(f);
    if (n == 0 || hidden.size() % n != 0) {
        fprintf(stderr, "%zu hidden values do not make %d rows\n", hidden.size(), n);
        return 1;
    }
    const size_t width = hidden.size() / n;
    llama_context_params cp = llama_context_default_params();
    cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    cp.n_ctx = n < 248 ? 256 : n + 8;
    cp.n_batch = cp.n_ctx;
    cp.n_ubatch = cp.n_ctx;
    cp.n_seq_max = 1;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama.cpp could not make an MTP context\n");
        return 1;
    }
    llama_batch_ext * b = llama_batch_ext_init(ctx);
    for (int i = 0; i < n; i++) {
        const int32_t idx = llama_batch_ext_add_token(b, 0, toks[i]);
        const llama_pos pos[4] = { i, 0, 0, 0 };
        const llama_embd h = { hidden.data() + (size_t) i * width, 1, width };
        if (idx != i || !llama_batch_ext_set_pos(b, idx, pos) || !llama_batch_ext_set_embd_token(b, idx, h) ||
            !llama_batch_ext_set_output_logits(b, idx, true)) {
            fprintf(stderr, "could not add row %d (width %zu) to the batch\n", i, width);
            return 1;
        }
    }
    if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, b) != 0) {
        fprintf(stderr, "llama_process failed\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    printf("{\"tokens\":[");
    for (int i = 0; i < n; i++) {
        printf("%s%d", i ? "," : "", toks[i]);
    }
    printf("],\"logits\":[");
    for (int i = 0; i < n; i++) {
        const float * l = llama_get_logits_ith(ctx, i);
        printf("%s[", i ? "," : "");
        for (int v = 0; v < n_vocab; v++) {
            printf("%s%.9g", v ? "," : "", l[v]);
        }
        printf("]");
    }
    printf("]}\n");
    llama_batch_ext_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
