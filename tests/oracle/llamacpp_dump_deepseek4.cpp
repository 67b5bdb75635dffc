// Logits, expert ids and indexer picks of llama.cpp b11434's deepseek4 graph at every position of
// token sequences, as one JSON array on stdout:
// [{"tokens": [...], "logits": [[...], ...], "experts": {"IL": [[...], ...]}, "indexer": {"IL": ...}}]
// Our code, linked against a llama.cpp build's static libraries (libllama.a, libggml*.a) as
// llamacpp_dump_logits.cpp is (tests/oracle/check_deepseek4_tiny.sh compiles it). The ids are read
// with the eval callback from the graph's named tensors: "ffn_moe_topk-IL" (build_moe_ffn's chosen
// experts; on hash layers the ffn_gate_tid2eid rows) and "lid_top_k-IL" (deepseek4.cpp
// build_lid_top_k: the indexer's top-k compressed rows, masked picks included: the caller keeps the
// visible ones). One context per sequence: f32 K cache, flash attention off, 2 threads.
// usage: llamacpp_dump_deepseek4 MODEL.gguf batch|token SEQ...   (SEQ = comma-separated token ids)
//   batch: one llama_decode per sequence; token: one llama_decode per token
#include "ggml.h"
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

// Ids per layer per position, filled by the eval callback; pos0 is the first position of the
// batch being decoded.
struct Capture {
    int pos0 = 0;
    std::map<int, std::map<int, std::vector<int>>> experts;
    std::map<int, std::map<int, std::vector<int>>> indexer;
};

static bool layer_of(const char * name, const char * prefix, int * il) {
    const size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0 || name[n] != '-') {
        return false;
    }
    *il = atoi(name + n + 1);
    return true;
}

static bool on_eval(ggml_tensor * t, bool ask, void * user) {
    int il = 0;
    const bool ex = layer_of(t->name, "ffn_moe_topk", &il);
    const bool ix = !ex && layer_of(t->name, "lid_top_k", &il);
    if (ask) {
        return ex || ix;
    }
    if (!ex && !ix) {
        return true;
    }
    if (t->type != GGML_TYPE_I32) {
        fprintf(stderr, "%s is not I32\n", t->name);
        exit(1);
    }
    auto * cap = (Capture *) user;
    auto & dst = ex ? cap->experts[il] : cap->indexer[il];
    for (int64_t j = 0; j < t->ne[1]; j++) {
        std::vector<int> row;
        for (int64_t i = 0; i < t->ne[0]; i++) {
            row.push_back(*(const int32_t *) ((const char *) t->data + j * t->nb[1] + i * t->nb[0]));
        }
        dst[cap->pos0 + (int) j] = row;
    }
    return true;
}

static void print_ids(const char * key, const std::map<int, std::map<int, std::vector<int>>> & ids, int n) {
    printf(",\"%s\":{", key);
    bool first_layer = true;
    for (const auto & [il, rows] : ids) {
        printf("%s\"%d\":[", first_layer ? "" : ",", il);
        first_layer = false;
        for (int p = 0; p < n; p++) {
            printf("%s[", p ? "," : "");
            auto it = rows.find(p);
            if (it != rows.end()) {
                for (size_t i = 0; i < it->second.size(); i++) {
                    printf("%s%d", i ? "," : "", it->second[i]);
                }
            }
            printf("]");
        }
        printf("]");
    }
    printf("}");
}

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
        Capture cap;
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
        cp.cb_eval = on_eval;
        cp.cb_eval_user_data = &cap;
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
            cap.pos0 = i0;
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
        printf("]");
        print_ids("experts", cap.experts, n);
        print_ids("indexer", cap.indexer, n);
        printf("}");
        llama_free(ctx);
    }
    printf("]\n");
    llama_model_free(model);
    return 0;
}
