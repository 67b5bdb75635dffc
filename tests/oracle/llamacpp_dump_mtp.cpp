// Dumps llama.cpp's MTP (nextn) head logits for token sequences, as its draft-mtp feeds a prompt
// (common/speculative.cpp, common_speculative_impl_draft_mtp::process): the target context runs
// the sequence with nextn embeddings on (unmasked) and the MTP context (LLAMA_CONTEXT_TYPE_MTP)
// gets token p paired with the target's h_nextn row of position p-1, position 0 with a zero row,
// every row an output. Links against a CPU build of llama.cpp b11434 (src/llama-ext.h staging API).
// usage: llamacpp_dump_mtp MODEL.gguf SEQ...   (SEQ = comma-separated ids); prints JSON
// [{tokens, logits}] to stdout.
#include "llama.h"
#include "llama-ext.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static llama_context * context(llama_model * model, llama_context_type type) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = 256;
    cp.n_ubatch = 256;
    cp.n_seq_max = 1;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.ctx_type = type;
    return llama_init_from_model(model, cp);
}

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf SEQ...\n", argv[0]);
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
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const int n_embd = llama_model_n_embd(model);
    printf("[");
    for (int s = 2; s < argc; s++) {
        std::vector<llama_token> toks;
        for (char * p = strtok(argv[s], ","); p; p = strtok(nullptr, ",")) {
            toks.push_back(atoi(p));
        }
        const int n = (int) toks.size();
        llama_context * tgt = context(model, LLAMA_CONTEXT_TYPE_DEFAULT);
        llama_context * dft = context(model, LLAMA_CONTEXT_TYPE_MTP);
        if (!tgt || !dft) {
            fprintf(stderr, "llama.cpp could not make the contexts\n");
            return 1;
        }
        llama_set_embeddings_nextn(tgt, true, false);
        llama_batch b = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; i++) {
            b.token[i] = toks[i];
            b.pos[i] = i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
        }
        b.n_tokens = n;
        if (llama_decode(tgt, b) != 0) {
            fprintf(stderr, "llama_decode (target) failed\n");
            return 1;
        }
        llama_batch_free(b);
        std::vector<float> h((size_t) n * n_embd, 0.0f);
        for (int i = 1; i < n; i++) {
            memcpy(&h[(size_t) i * n_embd], llama_get_embeddings_nextn_ith(tgt, i - 1), n_embd * sizeof(float));
        }
        llama_batch_ext * e = llama_batch_ext_init(dft);
        for (int i = 0; i < n; i++) {
            const int idx = llama_batch_ext_add_token(e, 0, toks[i]);
            const llama_pos pos = i;
            if (idx != i || !llama_batch_ext_set_pos(e, idx, &pos) ||
                !llama_batch_ext_set_embd_token(e, idx, { &h[(size_t) i * n_embd], 1, (size_t) n_embd }) ||
                !llama_batch_ext_set_output_logits(e, idx, true)) {
                fprintf(stderr, "could not fill the MTP batch at %d\n", i);
                return 1;
            }
        }
        if (llama_process(dft, LLAMA_PROCESS_TYPE_DECODE, e) != 0) {
            fprintf(stderr, "llama_process (MTP) failed\n");
            return 1;
        }
        printf("%s{\"tokens\":[", s > 2 ? "," : "");
        for (int i = 0; i < n; i++) {
            printf("%s%d", i ? "," : "", toks[i]);
        }
        printf("],\"logits\":[");
        for (int i = 0; i < n; i++) {
            const float * l = llama_get_logits_ith(dft, i);
            printf("%s[", i ? "," : "");
            for (int v = 0; v < n_vocab; v++) {
                printf("%s%.9g", v ? "," : "", l[v]);
            }
            printf("]");
        }
        printf("]}");
        llama_batch_ext_free(e);
        llama_free(dft);
        llama_free(tgt);
    }
    printf("]\n");
    llama_model_free(model);
    return 0;
}
