/* The propose -> verify loop of kolm-rsd from C, with llama.h and kolm-rsd.h alone.
 *
 * usage: propose_verify MODEL.gguf [PACK.recipes.json|-] [N_PREDICT] [predict]
 * (predict: the reference answer is given as the request's predicted output, kolm_rsd_predict)
 *
 * 1. Plain greedy decoding, one token per llama_decode: the reference.
 * 2. Speculative decoding: kolm_rsd_propose drafts, the target verifies [last, d1..dk] in ONE batch with
 *    logits at every position, the longest agreeing prefix is kept plus the target's own token, rejected
 *    positions are removed from the KV cache, kolm_rsd_accept reports the count.
 * Exits 0 only if both outputs are identical token for token and at least one draft token was accepted. */
#include "llama.h"
#include "kolm-rsd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_MAX_DRAFT 8

static const char *PROMPT =
    "<|im_start|>user\nRepeat this JSON exactly three times, one per line: "
    "{\"name\": \"Ann Lee\", \"age\": 31, \"city\": \"Oslo\", \"tags\": [\"a\", \"b\"]}<|im_end|>\n"
    "<|im_start|>assistant\n";

static llama_token argmax(const float *logits, int n_vocab) {
    int best = 0;
    for (int i = 1; i < n_vocab; i++) {
        if (logits[i] > logits[best]) best = i;
    }
    return best;
}

static struct llama_context *new_ctx(struct llama_model *model) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.no_perf = true;
    return llama_init_from_model(model, cp);
}

/* decodes the prompt; returns the first generated token */
static llama_token prefill(struct llama_context *ctx, const llama_token *prompt, int n_prompt, int n_vocab) {
    struct llama_batch b = llama_batch_init(n_prompt, 0, 1);
    for (int i = 0; i < n_prompt; i++) {
        b.token[i] = prompt[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = i == n_prompt - 1;
    }
    b.n_tokens = n_prompt;
    if (llama_decode(ctx, b) != 0) {
        fprintf(stderr, "prefill failed\n");
        exit(2);
    }
    llama_batch_free(b);
    return argmax(llama_get_logits_ith(ctx, -1), n_vocab);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [PACK|-] [N_PREDICT] [predict]\n", argv[0]);
        return 2;
    }
    const char *pack = argc > 2 && strcmp(argv[2], "-") != 0 ? argv[2] : NULL;
    const int n_predict = argc > 3 ? atoi(argv[3]) : 96;

    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 2;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    llama_token prompt[512];
    const int n_prompt = llama_tokenize(vocab, PROMPT, (int) strlen(PROMPT), prompt, 512, true, true);
    if (n_prompt <= 0) {
        fprintf(stderr, "tokenize failed\n");
        return 2;
    }

    /* 1. reference */
    llama_token *ref = malloc(sizeof(llama_token) * (n_predict + N_MAX_DRAFT + 1));
    {
        struct llama_context *ctx = new_ctx(model);
        llama_token tok = prefill(ctx, prompt, n_prompt, n_vocab);
        struct llama_batch b = llama_batch_init(1, 0, 1);
        for (int i = 0; i < n_predict; i++) {
            ref[i] = tok;
            b.token[0] = tok;
            b.pos[0] = n_prompt + i;
            b.n_seq_id[0] = 1;
            b.seq_id[0][0] = 0;
            b.logits[0] = 1;
            b.n_tokens = 1;
            if (llama_decode(ctx, b) != 0) return 2;
            tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        }
        llama_batch_free(b);
        llama_free(ctx);
    }

    /* 2. speculative */
    struct kolm_rsd_options opts;
    kolm_rsd_options_default(&opts);
    opts.n_max = 4;
    opts.adaptive = false; /* draft at every step: this test checks the loop, not the break-even control */
    kolm_rsd *rsd = NULL;
    if (kolm_rsd_load(model, pack, &opts, &rsd) != KOLM_RSD_RESULT_OK) {
        fprintf(stderr, "kolm_rsd_load: %s\n", kolm_rsd_last_error());
        return 2;
    }
    struct llama_context *ctx = new_ctx(model);
    llama_token *seq = malloc(sizeof(llama_token) * (n_prompt + n_predict + N_MAX_DRAFT + 2));
    memcpy(seq, prompt, sizeof(llama_token) * n_prompt);
    int n_seq = n_prompt;
    kolm_rsd_begin(rsd, 0, prompt, (size_t) n_prompt);
    const int predict = argc > 4 && strcmp(argv[4], "predict") == 0;
    if (predict && kolm_rsd_predict(rsd, 0, ref, (size_t) n_predict) != KOLM_RSD_RESULT_OK) {
        fprintf(stderr, "kolm_rsd_predict: %s\n", kolm_rsd_last_error());
        return 2;
    }
    llama_token last = prefill(ctx, prompt, n_prompt, n_vocab);
    int n_out = 0, steps = 0, drafted = 0, accepted = 0;
    struct llama_batch b = llama_batch_init(N_MAX_DRAFT + 1, 0, 1);
    while (n_out < n_predict) {
        llama_token draft[N_MAX_DRAFT];
        size_t n_draft = 0;
        if (kolm_rsd_propose(rsd, 0, seq, (size_t) n_seq, last, N_MAX_DRAFT, draft, &n_draft) != KOLM_RSD_RESULT_OK) {
            fprintf(stderr, "kolm_rsd_propose: %s\n", kolm_rsd_last_error());
            return 2;
        }
        /* verify [last, d1..dk] in one batch */
        b.n_tokens = 0;
        for (size_t i = 0; i <= n_draft; i++) {
            b.token[i] = i == 0 ? last : draft[i - 1];
            b.pos[i] = n_seq + (int) i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
            b.n_tokens++;
        }
        if (llama_decode(ctx, b) != 0) return 2;
        steps++;
        seq[n_seq++] = last;
        if (++n_out >= n_predict) break;
        size_t n_acc = 0;
        llama_token next = argmax(llama_get_logits_ith(ctx, 0), n_vocab);
        while (n_acc < n_draft && next == draft[n_acc] && n_out < n_predict) {
            seq[n_seq++] = next;
            n_out++;
            n_acc++;
            next = argmax(llama_get_logits_ith(ctx, (int32_t) n_acc), n_vocab);
        }
        drafted += (int) n_draft;
        accepted += (int) n_acc;
        if (n_draft > 0) kolm_rsd_accept(rsd, 0, n_acc);
        /* drop the rejected draft positions from the KV cache */
        llama_memory_seq_rm(llama_get_memory(ctx), 0, n_seq, -1);
        last = next;
    }
    llama_batch_free(b);

    int same = 1;
    for (int i = 0; i < n_predict; i++) {
        if (seq[n_prompt + i] != ref[i]) {
            fprintf(stderr, "first difference at generated token %d: %d vs reference %d\n", i, seq[n_prompt + i], ref[i]);
            same = 0;
            break;
        }
    }
    struct kolm_rsd_stats st;
    kolm_rsd_get_stats(rsd, &st);
    printf("tokens %d, verify steps %d, drafted %d, accepted %d, pack hits %llu, identical: %s\n", n_predict, steps,
           drafted, accepted, (unsigned long long) st.pack_hits, same ? "yes" : "no");

    kolm_rsd_free(rsd);
    llama_free(ctx);
    llama_model_free(model);
    free(seq);
    free(ref);
    /* Given the answer as its prediction, every draft is taken: 4 of each step's 5 tokens (at most 80%). */
    if (predict && accepted < (n_predict - 1) * 7 / 10) {
        fprintf(stderr, "with the answer predicted only %d of %d tokens were accepted\n", accepted, n_predict);
        same = 0;
    }
    return same && accepted > 0 ? 0 : 1;
}
