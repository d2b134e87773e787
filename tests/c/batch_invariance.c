// batch_invariance.c - check that llama.cpp's batched decode (a speculative-decoding verify
// batch) gives bit-identical logits to single-token decoding.
//
// Build (from a llama.cpp tree with a shared build in BUILD):
//   cc -O2 -std=c11 -I include -I ggml/include tests/c/batch_invariance.c
//      -L BUILD/bin -lllama -lggml -lggml-base -Wl,-rpath,BUILD/bin -lm -o batch_invariance
//
// Usage:
//   batch_invariance MODEL [options]
//     -p PROMPT      prompt text (default: a HumanEval-like python prompt)
//     -n N           tokens generated/compared per run (default 48)
//     -fa on|off|auto  flash attention (default off)
//     -t T           threads (single and batch, default 2)
//     -c N_CTX       context size (default 1024)
//     -ngl N         layers offloaded to a GPU backend (default 0: all on the CPU; 99 for all, e.g. on
//                    ggml-vulkan with GGML_VK_VISIBLE_DEVICES naming the device)
//     -dev NAME      the one ggml device the layers go to (e.g. Vulkan0; default: llama.cpp's choice)
//     -bmin B -bmax B  batch sizes to test (default 2..16)
//     --mode M       plain  : decode the same tokens in batches of b, all logits on
//                    reject : each batch = k correct tokens + wrong draft tokens; the wrong
//                             ones are removed with llama_memory_seq_rm (as the server does
//                             after a rejected draft) and decoding continues
//                    multi  : two sequences (two server slots) verified together in one
//                             batch (b tokens each) vs. the reference where both advance
//                             one token per decode call
//                    ragged : four sequences (four server slots), each verifying its own
//                             number of tokens (0..b, wrong drafts removed with seq_rm) in one
//                             batch vs. each sequence decoded alone one token at a time;
//                             --ragged-bench R times one decode per shape of such a step
//                    copied : as ragged, but the four sequences continue one prompt, decoded in sequence 0
//                             and copied to the others with llama_memory_seq_cp (llama-server's n_cmpl > 1)
//                    all    : plain + reject (+ multi, ragged, copied)   (default: all)
//     --kv-unified   unified KV buffer for the multi mode (server default for -np > 1)
//     --kv-pages     with --kv-unified: each sequence in pages of its own (llama_context_params.kv_pages, patch 0017),
//                    as llama-server with strict batching asks for
//     --copy-over    copied mode: sequences 1..3 first hold a short prompt of their own, which the copies replace
//                    (llama_memory_seq_rm, then seq_cp), as in the slots llama-server copies a prompt to
//     -q             quiet: only print the tables
//     --bench R      instead of the checks: time one llama_decode of n = 1..8 tokens of one
//                    sequence (all logits on, like a verify batch), R repetitions, median;
//                    prints beta(n) = t(n)/t(1) and the single-token decode speed
//     --depth D      (bench) KV depth before the timed batches (prompt repeated to D tokens)
//
// Prints, per b: positions compared, mismatching positions, max |diff| of the logits.
// Exit code: 0 if every compared position is bit-identical, 1 on any mismatch, 2 on error.

#define _POSIX_C_SOURCE 199309L
#include "llama.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char * DEFAULT_PROMPT =
    "from typing import List\n\n\n"
    "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
    "    \"\"\" Check if in given list of numbers, are any two numbers closer to each other than\n"
    "    given threshold.\n"
    "    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n"
    "    False\n"
    "    >>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)\n"
    "    True\n"
    "    \"\"\"\n";

static const char * DEFAULT_PROMPT2 =
    "def fibonacci(n: int) -> int:\n"
    "    \"\"\" Return the n-th Fibonacci number.\n"
    "    >>> fibonacci(10)\n"
    "    55\n"
    "    \"\"\"\n";

struct opts {
    const char * model_path;
    const char * prompt;
    const char * prompt2;
    int  n_gen;
    int  fa;        // -1 auto, 0 off, 1 on
    int  n_threads;
    int  n_ctx;
    int  n_gpu_layers;
    const char * device;
    int  bmin, bmax;
    bool do_plain, do_reject, do_multi, do_ragged, do_copied;
    bool kv_unified;
    bool kv_pages;
    bool copy_over;
    bool quiet;
    int  bench;
    int  depth;
    int  ragged_bench;
};

static struct llama_model * g_model;
static const struct llama_vocab * g_vocab;
static int g_n_vocab;
static struct opts g_o;

static void log_cb(enum ggml_log_level level, const char * text, void * ud) {
    (void) ud;
    if (level >= GGML_LOG_LEVEL_ERROR || (!g_o.quiet && level >= GGML_LOG_LEVEL_WARN)) {
        fputs(text, stderr);
    }
}

static struct llama_context * new_ctx(int n_seq) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = (uint32_t) g_o.n_ctx;
    cp.n_batch         = 512;
    cp.n_ubatch        = 512;
    cp.n_seq_max       = (uint32_t) n_seq;
    cp.n_threads       = g_o.n_threads;
    cp.n_threads_batch = g_o.n_threads;
    cp.flash_attn_type = g_o.fa < 0 ? LLAMA_FLASH_ATTN_TYPE_AUTO :
                         g_o.fa > 0 ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.kv_unified      = g_o.kv_unified;
    cp.kv_pages        = g_o.kv_pages;
    cp.swa_full        = false; // a sliding-window cache is a ring, as in llama-server
    cp.no_perf         = true;
    struct llama_context * ctx = llama_init_from_model(g_model, cp);
    if (!ctx) {
        fprintf(stderr, "failed to create context\n");
        exit(2);
    }
    return ctx;
}

static int tokenize(const char * text, llama_token ** out) {
    int n = -llama_tokenize(g_vocab, text, (int32_t) strlen(text), NULL, 0, true, false);
    *out = (llama_token *) malloc(sizeof(llama_token) * (size_t) n);
    if (llama_tokenize(g_vocab, text, (int32_t) strlen(text), *out, n, true, false) != n) {
        fprintf(stderr, "tokenize failed\n");
        exit(2);
    }
    return n;
}

static void batch_add(struct llama_batch * b, llama_token t, llama_pos pos, llama_seq_id seq, bool logits) {
    const int i = b->n_tokens;
    b->token[i]     = t;
    b->pos[i]       = pos;
    b->n_seq_id[i]  = 1;
    b->seq_id[i][0] = seq;
    b->logits[i]    = logits;
    b->n_tokens++;
}

static void decode_or_die(struct llama_context * ctx, struct llama_batch * b) {
    const int rc = llama_decode(ctx, *b);
    if (rc != 0) {
        fprintf(stderr, "llama_decode failed: %d\n", rc);
        exit(2);
    }
}

static llama_token argmax(const float * l) {
    int best = 0;
    for (int i = 1; i < g_n_vocab; i++) {
        if (l[i] > l[best]) {
            best = i;
        }
    }
    return best;
}

// decode the prompt of sequence `seq` in batches of n_batch, as llama-server does (same batch shapes in every run)
static void decode_prompt(struct llama_context * ctx, struct llama_batch * b, const llama_token * toks, int n, llama_seq_id seq) {
    const int n_batch = (int) llama_n_batch(ctx);
    for (int i0 = 0; i0 < n; i0 += n_batch) {
        b->n_tokens = 0;
        for (int i = i0; i < n && i < i0 + n_batch; i++) {
            batch_add(b, toks[i], i, seq, i == n - 1);
        }
        decode_or_die(ctx, b);
    }
}

struct cmp_stats {
    int    compared;
    int    mismatched;
    double max_diff;
};

static void compare(struct cmp_stats * st, const float * ref, const float * got) {
    st->compared++;
    if (memcmp(ref, got, sizeof(float) * (size_t) g_n_vocab) != 0) {
        st->mismatched++;
        for (int i = 0; i < g_n_vocab; i++) {
            const double d = fabs((double) ref[i] - (double) got[i]);
            if (d > st->max_diff || isnan(d)) {
                st->max_diff = isnan(d) ? INFINITY : d;
            }
        }
    }
}

static void print_row(const char * mode, int b, const struct cmp_stats * st) {
    printf("%-7s %3d %9d %10d %12.6g %s\n", mode, b, st->compared, st->mismatched, st->max_diff,
           st->mismatched ? "MISMATCH" : "ok");
    fflush(stdout);
}

// simple deterministic PRNG for the reject mode
static uint32_t rng_state = 12345u;
static uint32_t rng(void) {
    rng_state = rng_state * 1664525u + 1013904223u;
    return rng_state >> 8;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

#define BENCH_NMAX 8

static int run_bench(struct llama_batch * batch, const llama_token * prompt, int n_prompt) {
    const int depth = g_o.depth > n_prompt ? g_o.depth : n_prompt;
    if (depth + BENCH_NMAX + 1 > g_o.n_ctx) { fprintf(stderr, "context too small for --depth\n"); return 2; }
    llama_token * toks = (llama_token *) malloc(sizeof(llama_token) * (size_t) depth);
    for (int i = 0; i < depth; i++) {
        toks[i] = prompt[i % n_prompt];
    }
    struct llama_context * ctx = new_ctx(1);
    llama_memory_t mem = llama_get_memory(ctx);
    for (int i0 = 0; i0 < depth; i0 += 512) {
        batch->n_tokens = 0;
        for (int i = i0; i < depth && i < i0 + 512; i++) {
            batch_add(batch, toks[i], i, 0, i == depth - 1);
        }
        decode_or_die(ctx, batch);
    }
    const int R = g_o.bench;
    double * t = (double *) malloc(sizeof(double) * (size_t) R * BENCH_NMAX);
    for (int r = -2; r < R; r++) { // 2 warm-up rounds
        for (int n = 1; n <= BENCH_NMAX; n++) {
            batch->n_tokens = 0;
            for (int j = 0; j < n; j++) {
                batch_add(batch, toks[(depth + j) % n_prompt], depth + j, 0, true);
            }
            const double t0 = now_s();
            decode_or_die(ctx, batch);
            const double t1 = now_s();
            llama_memory_seq_rm(mem, 0, depth, -1);
            if (r >= 0) {
                t[(size_t) (n - 1) * R + r] = t1 - t0;
            }
        }
    }
    double med[BENCH_NMAX];
    for (int n = 1; n <= BENCH_NMAX; n++) {
        qsort(t + (size_t) (n - 1) * R, (size_t) R, sizeof(double), cmp_double);
        med[n - 1] = t[(size_t) (n - 1) * R + R / 2];
    }
    printf("bench: depth %d, %d reps, median ms per llama_decode\n", depth, R);
    printf("%3s %10s %8s\n", "n", "ms", "beta");
    for (int n = 1; n <= BENCH_NMAX; n++) {
        printf("%3d %10.3f %8.3f\n", n, 1e3 * med[n - 1], med[n - 1] / med[0]);
    }
    printf("single-token decode: %.2f tok/s\n", 1.0 / med[0]);
    llama_free(ctx);
    free(t);
    free(toks);
    return 0;
}

#define RAGGED_NSEQ 4

// The prompt of sequence s of the ragged mode: the main prompt without its first s tokens, so that
// every sequence has a context (and a continuation) of its own; in the copied mode the main prompt.
static void ragged_prompts(const llama_token * prompt, int n_prompt, bool copied, const llama_token * pt[RAGGED_NSEQ], int np[RAGGED_NSEQ]) {
    for (int s = 0; s < RAGGED_NSEQ; s++) {
        pt[s] = copied ? prompt : prompt + s;
        np[s] = copied ? n_prompt : n_prompt - s;
    }
}

// ragged: four sequences verify unequal numbers of tokens together, as llama-server's slots do when
// one drafts and the others do not; each sequence's logits must be those of decoding it alone.
// copied: the four continue one prompt, decoded once and copied, as the completions of one request.
static int run_ragged(struct llama_batch * batch, const llama_token * prompt, int n_prompt, bool copied) {
    const int N = g_o.n_gen;
    const size_t lsz = sizeof(float) * (size_t) g_n_vocab;
    const llama_token * pt[RAGGED_NSEQ];
    int np[RAGGED_NSEQ];
    ragged_prompts(prompt, n_prompt, copied, pt, np);

    // reference: each sequence alone, one token per llama_decode (copies: the first one's)
    llama_token * tk[RAGGED_NSEQ];
    float * rf[RAGGED_NSEQ];
    for (int s = 0; s < RAGGED_NSEQ; s++) {
        tk[s] = (llama_token *) malloc(sizeof(llama_token) * (size_t) (N + 1));
        rf[s] = (float *) malloc(lsz * (size_t) N);
        if (copied && s > 0) {
            memcpy(tk[s], tk[0], sizeof(llama_token) * (size_t) (N + 1));
            memcpy(rf[s], rf[0], lsz * (size_t) N);
            continue;
        }
        struct llama_context * ctx = new_ctx(1);
        decode_prompt(ctx, batch, pt[s], np[s], 0);
        tk[s][0] = argmax(llama_get_logits_ith(ctx, -1));
        for (int i = 0; i < N; i++) {
            batch->n_tokens = 0;
            batch_add(batch, tk[s][i], np[s] + i, 0, true);
            decode_or_die(ctx, batch);
            memcpy(rf[s] + (size_t) i * g_n_vocab, llama_get_logits_ith(ctx, 0), lsz);
            tk[s][i + 1] = argmax(rf[s] + (size_t) i * g_n_vocab);
        }
        llama_free(ctx);
    }

    int total = 0;
    // up to 4 tokens a sequence: 16 in all at most, the bound strict batching keeps a call within
    const int bmax = g_o.bmax < 4 ? g_o.bmax : 4;
    for (int b = g_o.bmin; b <= bmax; b++) {
        struct cmp_stats st = {0, 0, 0.0};
        struct llama_context * ctx = new_ctx(RAGGED_NSEQ);
        llama_memory_t mem = llama_get_memory(ctx);
        for (int s = 1; copied && g_o.copy_over && s < RAGGED_NSEQ; s++) {
            decode_prompt(ctx, batch, pt[s], np[s] < 32 ? np[s] : 32, s);
        }
        for (int s = 0; s < RAGGED_NSEQ; s++) {
            if (copied && s > 0) {
                llama_memory_seq_rm(mem, s, -1, -1);
                llama_memory_seq_cp(mem, 0, s, -1, -1);
            } else {
                decode_prompt(ctx, batch, pt[s], np[s], s);
            }
        }
        int pos[RAGGED_NSEQ] = {0};   // tokens of each sequence verified so far
        int first[RAGGED_NSEQ], nright[RAGGED_NSEQ];
        for (int step = 0;; step++) {
            int done = 1;
            for (int s = 0; s < RAGGED_NSEQ; s++) {
                done &= pos[s] >= N;
            }
            if (done) {
                break;
            }
            // each sequence puts in 0..b tokens (0: an idle slot between busy ones), the first of them
            // right and the rest right or wrong drafts; the sequences in a turning order
            batch->n_tokens = 0;
            for (int k = 0; k < RAGGED_NSEQ; k++) {
                const int s = (k + step) % RAGGED_NSEQ;
                const int left = N - pos[s];
                int n = left <= 0 ? 0 : (int) (rng() % (uint32_t) (b + 1));
                if (s == step % RAGGED_NSEQ && left > 0 && n == 0) {
                    n = 1; // no step without tokens
                }
                int r = n == 0 ? 0 : 1 + (int) (rng() % (uint32_t) n);
                if (r > left) r = left;
                first[s] = batch->n_tokens;
                nright[s] = r;
                for (int j = 0; j < n; j++) {
                    llama_token t = j < r ? tk[s][pos[s] + j] : (llama_token) ((tk[s][pos[s] + r] + 1 + (int) (rng() % 1000)) % g_n_vocab);
                    if (j >= r && t == tk[s][pos[s] + r]) t = (t + 1) % g_n_vocab;
                    batch_add(batch, t, np[s] + pos[s] + j, s, true);
                }
            }
            if (batch->n_tokens == 0) {
                continue; // every sequence with tokens left drew none
            }
            decode_or_die(ctx, batch);
            for (int s = 0; s < RAGGED_NSEQ; s++) {
                for (int j = 0; j < nright[s]; j++) {
                    compare(&st, rf[s] + (size_t) (pos[s] + j) * g_n_vocab, llama_get_logits_ith(ctx, first[s] + j));
                }
                pos[s] += nright[s];
                if (!llama_memory_seq_rm(mem, s, np[s] + pos[s], -1)) {
                    fprintf(stderr, "llama_memory_seq_rm failed\n");
                    exit(2);
                }
            }
        }
        llama_free(ctx);
        char name[16];
        snprintf(name, sizeof(name), "%s%s", copied ? "copied" : "ragged", g_o.kv_unified ? "U" : "");
        print_row(name, b, &st);
        total += st.mismatched;
    }
    for (int s = 0; s < RAGGED_NSEQ; s++) {
        free(tk[s]);
        free(rf[s]);
    }
    return total;
}

// --ragged-bench R: one llama_decode per shape of a step of four slots (tokens per slot), medians of R,
// on four sequences holding the prompt; with LLAMA_KV_RAGGED_MAX=0 llama.cpp cuts unequal runs into
// one forward pass per equal run of consecutive slots.
static int run_ragged_bench(struct llama_batch * batch, const llama_token * prompt, int n_prompt) {
    static const int shapes[][RAGGED_NSEQ] = {
        {1, 1, 1, 1}, {2, 1, 1, 1}, {4, 1, 1, 1}, {1, 4, 1, 1}, {4, 4, 1, 1}, {4, 1, 4, 1},
        {2, 2, 2, 2}, {4, 4, 4, 4}, {8, 1, 1, 1}, {1, 0, 1, 1}, {13, 1, 1, 1},
    };
    const int n_shapes = (int) (sizeof(shapes) / sizeof(shapes[0]));
    const int R = g_o.ragged_bench;
    const llama_token * pt[RAGGED_NSEQ];
    int np[RAGGED_NSEQ];
    ragged_prompts(prompt, n_prompt, false, pt, np);
    struct llama_context * ctx = new_ctx(RAGGED_NSEQ);
    llama_memory_t mem = llama_get_memory(ctx);
    for (int s = 0; s < RAGGED_NSEQ; s++) {
        decode_prompt(ctx, batch, pt[s], np[s], s);
    }
    double * t = (double *) malloc(sizeof(double) * (size_t) R * (size_t) n_shapes);
    for (int r = -2; r < R; r++) { // 2 warm-up rounds
        for (int k = 0; k < n_shapes; k++) {
            batch->n_tokens = 0;
            for (int s = 0; s < RAGGED_NSEQ; s++) {
                for (int j = 0; j < shapes[k][s]; j++) {
                    batch_add(batch, pt[s][j % np[s]], np[s] + j, s, true);
                }
            }
            const double t0 = now_s();
            decode_or_die(ctx, batch);
            const double t1 = now_s();
            for (int s = 0; s < RAGGED_NSEQ; s++) {
                llama_memory_seq_rm(mem, s, np[s], -1);
            }
            if (r >= 0) {
                t[(size_t) k * R + r] = t1 - t0;
            }
        }
    }
    const char * env = getenv("LLAMA_KV_RAGGED_MAX");
    printf("ragged bench: %d reps, median ms per llama_decode, LLAMA_KV_RAGGED_MAX=%s\n", R, env ? env : "(unset)");
    for (int k = 0; k < n_shapes; k++) {
        qsort(t + (size_t) k * R, (size_t) R, sizeof(double), cmp_double);
        printf("%2d %2d %2d %2d %10.3f\n", shapes[k][0], shapes[k][1], shapes[k][2], shapes[k][3], 1e3 * t[(size_t) k * R + R / 2]);
    }
    llama_free(ctx);
    free(t);
    return 0;
}

int main(int argc, char ** argv) {
    struct opts * o = &g_o;
    memset(o, 0, sizeof(*o));
    o->prompt = DEFAULT_PROMPT;
    o->prompt2 = DEFAULT_PROMPT2;
    o->n_gen = 48;
    o->fa = 0;
    o->n_threads = 2;
    o->n_ctx = 1024;
    o->bmin = 2;
    o->bmax = 16;
    const char * mode = "all";

    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [-p PROMPT] [-n N] [-fa on|off|auto] [-t T] [-c N_CTX] [-ngl N] [-dev NAME] [-bmin B] [-bmax B] "
                        "[--mode plain|reject|multi|ragged|copied|all] [--kv-unified [--kv-pages]] [--copy-over] [-q]\n", argv[0]);
        return 2;
    }
    o->model_path = argv[1];
    for (int i = 2; i < argc; i++) {
        const char * a = argv[i];
        const char * v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-p") && v) { o->prompt = v; i++; }
        else if (!strcmp(a, "-n") && v) { o->n_gen = atoi(v); i++; }
        else if (!strcmp(a, "-fa") && v) { o->fa = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 0 : -1; i++; }
        else if (!strcmp(a, "-t") && v) { o->n_threads = atoi(v); i++; }
        else if (!strcmp(a, "-c") && v) { o->n_ctx = atoi(v); i++; }
        else if (!strcmp(a, "-ngl") && v) { o->n_gpu_layers = atoi(v); i++; }
        else if (!strcmp(a, "-dev") && v) { o->device = v; i++; }
        else if (!strcmp(a, "-bmin") && v) { o->bmin = atoi(v); i++; }
        else if (!strcmp(a, "-bmax") && v) { o->bmax = atoi(v); i++; }
        else if (!strcmp(a, "--mode") && v) { mode = v; i++; }
        else if (!strcmp(a, "--kv-unified")) { o->kv_unified = true; }
        else if (!strcmp(a, "--kv-pages")) { o->kv_pages = true; }
        else if (!strcmp(a, "--copy-over")) { o->copy_over = true; }
        else if (!strcmp(a, "-q")) { o->quiet = true; }
        else if (!strcmp(a, "--bench") && v) { o->bench = atoi(v); i++; }
        else if (!strcmp(a, "--depth") && v) { o->depth = atoi(v); i++; }
        else if (!strcmp(a, "--ragged-bench") && v) { o->ragged_bench = atoi(v); i++; }
        else { fprintf(stderr, "unknown argument: %s\n", a); return 2; }
    }
    o->do_plain  = !strcmp(mode, "plain")  || !strcmp(mode, "all");
    o->do_reject = !strcmp(mode, "reject") || !strcmp(mode, "all");
    o->do_multi  = !strcmp(mode, "multi")  || !strcmp(mode, "all");
    o->do_ragged = !strcmp(mode, "ragged") || !strcmp(mode, "all");
    o->do_copied = !strcmp(mode, "copied") || !strcmp(mode, "all");
    if (o->bmin < 2) o->bmin = 2;
    if (o->n_gen < 2 || o->bmax < o->bmin) { fprintf(stderr, "bad -n / -bmin / -bmax\n"); return 2; }

    llama_log_set(log_cb, NULL);
    llama_backend_init();

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = o->n_gpu_layers;
    ggml_backend_dev_t devs[2] = { NULL, NULL };
    if (o->device) {
        devs[0] = ggml_backend_dev_by_name(o->device);
        if (!devs[0]) { fprintf(stderr, "no ggml device named %s\n", o->device); return 2; }
        mp.devices = devs;
        printf("device %s: %s\n", o->device, ggml_backend_dev_description(devs[0]));
    }
    g_model = llama_model_load_from_file(o->model_path, mp);
    if (!g_model) { fprintf(stderr, "failed to load %s\n", o->model_path); return 2; }
    g_vocab   = llama_model_get_vocab(g_model);
    g_n_vocab = llama_vocab_n_tokens(g_vocab);

    llama_token * prompt = NULL;
    const int n_prompt = tokenize(o->prompt, &prompt);
    const int N = o->n_gen;
    if (n_prompt + 2*N + 2*o->bmax + 8 > o->n_ctx) { fprintf(stderr, "context too small\n"); return 2; }

    const char * env = getenv("GGML_CPU_BATCH_INVARIANT_MAX");
    const char * env_vk = getenv("GGML_VK_BATCH_INVARIANT_MAX");
    printf("model %s\nprompt tokens %d, generated %d, flash_attn %s, threads %d, n_gpu_layers %d, "
           "GGML_CPU_BATCH_INVARIANT_MAX=%s, GGML_VK_BATCH_INVARIANT_MAX=%s\n",
           o->model_path, n_prompt, N, o->fa < 0 ? "auto" : o->fa ? "on" : "off", o->n_threads, o->n_gpu_layers,
           env ? env : "(unset)", env_vk ? env_vk : "(unset)");

    struct llama_batch batch = llama_batch_init(o->n_ctx, 0, RAGGED_NSEQ);
    const size_t lsz = sizeof(float) * (size_t) g_n_vocab;

    if (o->ragged_bench > 0 || o->bench > 0) {
        const int rc = o->ragged_bench > 0 ? run_ragged_bench(&batch, prompt, n_prompt) : run_bench(&batch, prompt, n_prompt);
        free(prompt);
        llama_batch_free(batch);
        llama_model_free(g_model);
        return rc;
    }

    // ---- reference: single-token greedy decode -------------------------------------------
    // tok[i] is decoded at position n_prompt + i; ref[i] are the logits after decoding it.
    llama_token * tok = (llama_token *) malloc(sizeof(llama_token) * (size_t) (N + 1));
    float * ref = (float *) malloc(lsz * (size_t) N);
    {
        struct llama_context * ctx = new_ctx(1);
        decode_prompt(ctx, &batch, prompt, n_prompt, 0);
        tok[0] = argmax(llama_get_logits_ith(ctx, -1));
        for (int i = 0; i < N; i++) {
            batch.n_tokens = 0;
            batch_add(&batch, tok[i], n_prompt + i, 0, true);
            decode_or_die(ctx, &batch);
            memcpy(ref + (size_t) i * g_n_vocab, llama_get_logits_ith(ctx, 0), lsz);
            tok[i + 1] = argmax(ref + (size_t) i * g_n_vocab);
        }
        llama_free(ctx);
    }
    if (!o->quiet) {
        char buf[4096]; int len = 0;
        for (int i = 0; i < N && len < (int) sizeof(buf) - 256; i++) {
            int n = llama_token_to_piece(g_vocab, tok[i], buf + len, (int32_t) sizeof(buf) - len - 1, 0, false);
            if (n > 0) len += n;
        }
        buf[len] = 0;
        printf("greedy continuation: %s\n", buf);
    }

    int total_mismatch = 0;
    printf("%-7s %3s %9s %10s %12s\n", "mode", "b", "compared", "mismatched", "max|diff|");

    // ---- plain: the same tokens in batches of b -----------------------------------------
    if (o->do_plain) {
        for (int b = o->bmin; b <= o->bmax; b++) {
            struct cmp_stats st = {0, 0, 0.0};
            struct llama_context * ctx = new_ctx(1);
            decode_prompt(ctx, &batch, prompt, n_prompt, 0);
            for (int i0 = 0; i0 < N; i0 += b) {
                const int nb = i0 + b <= N ? b : N - i0;
                batch.n_tokens = 0;
                for (int j = 0; j < nb; j++) {
                    batch_add(&batch, tok[i0 + j], n_prompt + i0 + j, 0, true);
                }
                decode_or_die(ctx, &batch);
                for (int j = 0; j < nb; j++) {
                    compare(&st, ref + (size_t) (i0 + j) * g_n_vocab, llama_get_logits_ith(ctx, j));
                }
            }
            llama_free(ctx);
            print_row("plain", b, &st);
            total_mismatch += st.mismatched;
        }
    }

    // ---- reject: verify batches with wrong draft tokens, removed with seq_rm ----------------
    if (o->do_reject) {
        for (int b = o->bmin; b <= o->bmax; b++) {
            struct cmp_stats st = {0, 0, 0.0};
            struct llama_context * ctx = new_ctx(1);
            llama_memory_t mem = llama_get_memory(ctx);
            decode_prompt(ctx, &batch, prompt, n_prompt, 0);
            int i = 0; // next position (index into tok) to decode; its history is correct
            while (i < N) {
                // server layout: [last accepted token, draft_1 .. draft_{b-1}]; the first
                // k-1 drafts are right, the rest wrong (k in 1..b-1 so there's always a wrong one)
                int k = 1 + (int) (rng() % (uint32_t) (b - 1));
                if (i + k > N) k = N - i;
                batch.n_tokens = 0;
                for (int j = 0; j < b; j++) {
                    llama_token t;
                    if (j < k) {
                        t = tok[i + j];
                    } else {
                        // wrong draft token (different from the right one)
                        t = (llama_token) ((tok[i + j <= N ? i + j : N] + 1 + (int) (rng() % 1000)) % g_n_vocab);
                        if (i + j <= N && t == tok[i + j]) t = (t + 1) % g_n_vocab;
                    }
                    batch_add(&batch, t, n_prompt + i + j, 0, true);
                }
                decode_or_die(ctx, &batch);
                for (int j = 0; j < k; j++) {
                    compare(&st, ref + (size_t) (i + j) * g_n_vocab, llama_get_logits_ith(ctx, j));
                }
                // reject the wrong drafts: remove their KV cells, like the server does
                if (!llama_memory_seq_rm(mem, 0, n_prompt + i + k, -1)) {
                    fprintf(stderr, "llama_memory_seq_rm failed\n");
                    return 2;
                }
                i += k;
            }
            llama_free(ctx);
            print_row("reject", b, &st);
            total_mismatch += st.mismatched;
        }
    }

    // ---- multi: two sequences (server slots) verified together -----------------------------
    if (o->do_multi) {
        llama_token * prompt2 = NULL;
        const int n_prompt2 = tokenize(o->prompt2, &prompt2);
        const int np[2] = { n_prompt, n_prompt2 };
        const llama_token * pt[2] = { prompt, prompt2 };

        // reference: both sequences advance one token per llama_decode (a non-speculative
        // server with two busy slots)
        llama_token * tk[2];
        float * rf[2];
        {
            struct llama_context * ctx = new_ctx(2);
            for (int s = 0; s < 2; s++) {
                tk[s] = (llama_token *) malloc(sizeof(llama_token) * (size_t) (N + 1));
                rf[s] = (float *) malloc(lsz * (size_t) N);
                decode_prompt(ctx, &batch, pt[s], np[s], s);
                tk[s][0] = argmax(llama_get_logits_ith(ctx, -1));
            }
            for (int i = 0; i < N; i++) {
                batch.n_tokens = 0;
                for (int s = 0; s < 2; s++) {
                    batch_add(&batch, tk[s][i], np[s] + i, s, true);
                }
                decode_or_die(ctx, &batch);
                for (int s = 0; s < 2; s++) {
                    memcpy(rf[s] + (size_t) i * g_n_vocab, llama_get_logits_ith(ctx, s), lsz);
                    tk[s][i + 1] = argmax(rf[s] + (size_t) i * g_n_vocab);
                }
            }
            llama_free(ctx);
        }
        const int bmax = o->bmax / 2 > o->bmin ? o->bmax / 2 : o->bmin;
        for (int b = o->bmin; b <= bmax; b++) {
            struct cmp_stats st = {0, 0, 0.0};
            struct llama_context * ctx = new_ctx(2);
            for (int s = 0; s < 2; s++) {
                decode_prompt(ctx, &batch, pt[s], np[s], s);
            }
            for (int i0 = 0; i0 < N; i0 += b) {
                const int nb = i0 + b <= N ? b : N - i0;
                batch.n_tokens = 0;
                for (int s = 0; s < 2; s++) {
                    for (int j = 0; j < nb; j++) {
                        batch_add(&batch, tk[s][i0 + j], np[s] + i0 + j, s, true);
                    }
                }
                decode_or_die(ctx, &batch);
                for (int s = 0; s < 2; s++) {
                    for (int j = 0; j < nb; j++) {
                        compare(&st, rf[s] + (size_t) (i0 + j) * g_n_vocab, llama_get_logits_ith(ctx, s*nb + j));
                    }
                }
            }
            llama_free(ctx);
            char name[16];
            snprintf(name, sizeof(name), "multi%s", o->kv_unified ? "U" : "");
            print_row(name, b, &st);
            total_mismatch += st.mismatched;
        }
        for (int s = 0; s < 2; s++) {
            free(tk[s]);
            free(rf[s]);
        }
        free(prompt2);
    }

    if (o->do_ragged) {
        total_mismatch += run_ragged(&batch, prompt, n_prompt, false);
    }
    if (o->do_copied) {
        total_mismatch += run_ragged(&batch, prompt, n_prompt, true);
    }

    printf("%s: %d mismatching positions\n", total_mismatch ? "FAIL" : "PASS", total_mismatch);

    free(ref);
    free(tok);
    free(prompt);
    llama_batch_free(batch);
    llama_model_free(g_model);
    llama_backend_free();
    return total_mismatch ? 1 : 0;
}
