// Logits of a llama.cpp build at every position of token sequences, as one JSON array on stdout:
// [{"tokens": [...], "logits": [[...], ...]}, ...]. Our code, linked against a llama.cpp build's
// static libraries (libllama.a, libggml*.a); the commands are in host/tests/fixtures/PROVENANCE.md.
// One context per sequence: f32 K/V cache, flash attention off (llama.cpp's CPU flash attention
// rounds through f16), 2 threads.
// usage: llamacpp_dump_logits MODEL.gguf batch|token SEQ...   (SEQ = comma-separated token ids)
//   batch: one llama_decode per sequence; token: one llama_decode per token (the recurrent path)
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 4 || (strcmp(argv[2], "batch") != 0 && strcmp(argv[2], "token") != 0)) {
        fprintf(stderr, "usage: %s MODEL.gguf batch|token SEQ...\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    if (!getenv("VERBOSE")) {
        llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    }
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) {
        fprintf(stderr, "llama.cpp refused the model\n");
        return 1;
    }
    const bool per_token = strcmp(argv[2], "token") == 0;
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    printf("[");
    for (int s = 3; s < argc; s++) {
        std::vector<llama_token> toks;
        for (char * p = strtok(argv[s], ","); p; p = strtok(nullptr, ",")) {
            toks.push_back(atoi(p));
        }
        const int n = (int) toks.size();
        llama_context_params cp = llama_context_default_params();
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
            fprintf(stderr, "llama.cpp could not make a context\n");
            return 1;
        }
        std::vector<std::vector<float>> out;
        const int step = per_token ? 1 : n;
        for (int i0 = 0; i0 < n; i0 += step) {
            llama_batch b = llama_batch_init(step, 0, 1);
            for (int i = 0; i < step; i++) {
                b.token[i] = toks[i0 + i];
                b.pos[i] = i0 + i;
                b.n_seq_id[i] = 1;
                b.seq_id[i][0] = 0;
                b.logits[i] = 1;
            }
            b.n_tokens = step;
            if (llama_decode(ctx, b) != 0) {
                fprintf(stderr, "llama_decode failed\n");
                return 1;
            }
            for (int i = 0; i < step; i++) {
                const float * l = llama_get_logits_ith(ctx, i);
                out.emplace_back(l, l + n_vocab);
            }
            llama_batch_free(b);
        }
        printf("%s{\"tokens\":[", s > 3 ? "," : "");
        for (int i = 0; i < n; i++) {
            printf("%s%d", i ? "," : "", toks[i]);
        }
        printf("],\"logits\":[");
        for (int i = 0; i < n; i++) {
            printf("%s[", i ? "," : "");
            for (int v = 0; v < n_vocab; v++) {
                printf("%s%.9g", v ? "," : "", out[i][v]);
            }
            printf("]");
        }
        printf("]}");
        llama_free(ctx);
    }
    printf("]\n");
    llama_model_free(model);
    return 0;
}
