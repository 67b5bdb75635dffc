// Logits of a llama.cpp build at every position of token sequences, as one JSON array on stdout:
// [{"tokens": [...], "logits": [[...], ...]}, ...]. Our code, linked against a llama.cpp build's
// static libraries (libllama.a, libggml*.a); the commands are in host/tests/fixtures/PROVENANCE.md.
// One context per sequence: f32 K/V cache, flash attention off (llama.cpp's CPU flash attention
// rounds through f16), 2 threads.
// usage: llamacpp_dump_logits MODEL.gguf batch|token SEQ...   (SEQ = comma-separated token ids)
//   batch: one llama_decode per sequence; token: one llama_decode per token (the recurrent path)
// Optional settings from the environment, as llama-server's flags set them:
//   DUMP_KV_OVERRIDES=KEY=TYPE:VALUE[,...]  (--override-kv; types int, float, bool, str)
//   DUMP_ROPE_SCALING=none|linear|yarn      (--rope-scaling)
//   DUMP_ROPE_FREQ_BASE=N, DUMP_ROPE_FREQ_SCALE=N, DUMP_YARN_ORIG_CTX=N (--rope-freq-base,
//   --rope-freq-scale, --yarn-orig-ctx)
//   DUMP_YARN_EXT_FACTOR=N, DUMP_YARN_ATTN_FACTOR=N, DUMP_YARN_BETA_FAST=N, DUMP_YARN_BETA_SLOW=N
//   (--yarn-ext-factor, --yarn-attn-factor, --yarn-beta-fast, --yarn-beta-slow)
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// The overrides of DUMP_KV_OVERRIDES, ended by an empty key as llama_model_params wants them.
static std::vector<llama_model_kv_override> kv_overrides() {
    std::vector<llama_model_kv_override> out;
    const char * env = getenv("DUMP_KV_OVERRIDES");
    std::string all = env ? env : "";
    size_t at = 0;
    while (!all.empty() && at <= all.size()) {
        size_t end = all.find(',', at);
        std::string item = all.substr(at, end == std::string::npos ? std::string::npos : end - at);
        at = end == std::string::npos ? all.size() + 1 : end + 1;
        size_t eq = item.find('='), colon = item.find(':', eq);
        if (eq == std::string::npos || colon == std::string::npos || eq >= 127) {
            fprintf(stderr, "bad override %s\n", item.c_str());
            exit(2);
        }
        llama_model_kv_override o{};
        snprintf(o.key, sizeof o.key, "%s", item.substr(0, eq).c_str());
        std::string type = item.substr(eq + 1, colon - eq - 1), value = item.substr(colon + 1);
        if (type == "int") {
            o.tag = LLAMA_KV_OVERRIDE_TYPE_INT;
            o.val_i64 = atoll(value.c_str());
        } else if (type == "float") {
            o.tag = LLAMA_KV_OVERRIDE_TYPE_FLOAT;
            o.val_f64 = atof(value.c_str());
        } else if (type == "bool") {
            o.tag = LLAMA_KV_OVERRIDE_TYPE_BOOL;
            o.val_bool = value == "true";
        } else if (type == "str") {
            o.tag = LLAMA_KV_OVERRIDE_TYPE_STR;
            snprintf(o.val_str, sizeof o.val_str, "%s", value.c_str());
        } else {
            fprintf(stderr, "bad override type %s\n", type.c_str());
            exit(2);
        }
        out.push_back(o);
    }
    if (!out.empty()) {
        out.emplace_back();
        out.back().key[0] = 0;
    }
    return out;
}

// The rope settings of the DUMP_ROPE_* and DUMP_YARN_ORIG_CTX variables over `cp`.
static void rope_settings(llama_context_params & cp) {
    if (const char * t = getenv("DUMP_ROPE_SCALING")) {
        std::string s = t;
        cp.rope_scaling_type = s == "none" ? LLAMA_ROPE_SCALING_TYPE_NONE
                             : s == "linear" ? LLAMA_ROPE_SCALING_TYPE_LINEAR
                             : LLAMA_ROPE_SCALING_TYPE_YARN;
    }
    if (const char * v = getenv("DUMP_ROPE_FREQ_BASE")) {
        cp.rope_freq_base = (float) atof(v);
    }
    if (const char * v = getenv("DUMP_ROPE_FREQ_SCALE")) {
        cp.rope_freq_scale = (float) atof(v);
    }
    if (const char * v = getenv("DUMP_YARN_ORIG_CTX")) {
        cp.yarn_orig_ctx = (uint32_t) atoi(v);
    }
    if (const char * v = getenv("DUMP_YARN_EXT_FACTOR")) {
        cp.yarn_ext_factor = (float) atof(v);
    }
    if (const char * v = getenv("DUMP_YARN_ATTN_FACTOR")) {
        cp.yarn_attn_factor = (float) atof(v);
    }
    if (const char * v = getenv("DUMP_YARN_BETA_FAST")) {
        cp.yarn_beta_fast = (float) atof(v);
    }
    if (const char * v = getenv("DUMP_YARN_BETA_SLOW")) {
        cp.yarn_beta_slow = (float) atof(v);
    }
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
    llama_model_params mp = llama_model_default_params();
    const std::vector<llama_model_kv_override> overrides = kv_overrides();
    if (!overrides.empty()) {
        mp.kv_overrides = overrides.data();
    }
    llama_model * model = llama_model_load_from_file(argv[1], mp);
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
        rope_settings(cp);
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
