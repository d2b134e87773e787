// Patch 0012 computes the rows of the CPU flash attention that read the same K and V rows together. Each row
// must be bitwise what the row-at-a-time loop gives it. The op splits its rows into chunks of
// ceil(rows / (4 * threads)): with one thread a chunk holds many rows of one KV head (computed together),
// with as many threads as it takes a chunk holds one row (the row-at-a-time loop). This program runs the same
// op both ways and compares every output bit, over the shapes that reach the code's corners: head sizes with
// a remainder after the vector steps (80), 64 to 256, grouped-query ratios 1 to 8, one to 16 query
// positions, a causal mask with masked cells, ALiBi slopes and a logit softcap.
//
//   fa_rows            exit 0 when every output is bitwise equal, 1 otherwise
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"
#include "ggml.h"

typedef enum ggml_status (*compute_fn)(struct ggml_context *, struct ggml_cgraph *, int);
typedef void (*init_fn)(void);

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float unit(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float) ((g_rng >> 16) % 20001) / 10000.0f - 1.0f; // [-1, 1]
}

// One flash_attn_ext of n query positions over depth + n cells; returns the mismatching outputs.
static int check(compute_fn compute, int d, int n_head, int n_head_kv, int n, int depth, float max_bias, float softcap) {
    const int nkv = depth + n;
    struct ggml_init_params ip = { 64u << 20, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, n, n_head, 1);
    struct ggml_tensor * k = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, d, nkv, n_head_kv, 1);
    struct ggml_tensor * v = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, d, nkv, n_head_kv, 1);
    struct ggml_tensor * m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, nkv, GGML_PAD(n, 64), 1, 1);
    for (int64_t i = 0; i < ggml_nelements(q); i++) {
        ((float *) q->data)[i] = 2.0f * unit();
    }
    for (int64_t i = 0; i < ggml_nelements(k); i++) {
        ((ggml_fp16_t *) k->data)[i] = ggml_fp32_to_fp16(unit());
        ((ggml_fp16_t *) v->data)[i] = ggml_fp32_to_fp16(unit());
    }
    // causal: position depth + j sees cells 0..depth + j; some early cells masked as well (a sliding window's)
    for (int j = 0; j < GGML_PAD(n, 64); j++) {
        for (int i = 0; i < nkv; i++) {
            const int seen = j < n && i <= depth + j && !(i % 7 == 3 && j % 2 == 1);
            ((ggml_fp16_t *) m->data)[j * nkv + i] = ggml_fp32_to_fp16(seen ? 0.0f : -INFINITY);
        }
    }
    struct ggml_tensor * out = ggml_flash_attn_ext(ctx, q, k, v, m, 8.0f / (float) d, max_bias, softcap);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);

    const size_t bytes = ggml_nbytes(out);
    float * together = malloc(bytes);
    compute(ctx, gf, 1); // chunks of many rows: computed together
    memcpy(together, out->data, bytes);
    const int rows = n * n_head;
    compute(ctx, gf, (rows + 3) / 4); // chunks of one row: the row-at-a-time loop
    int bad = 0;
    for (size_t i = 0; i < bytes / sizeof(float); i++) {
        if (memcmp(&together[i], &((float *) out->data)[i], sizeof(float)) != 0) {
            if (bad++ < 3) {
                printf("d=%d heads %d/%d n=%d depth %d max_bias %g softcap %g: output %zu %.9g together, %.9g alone\n", d,
                       n_head, n_head_kv, n, depth, max_bias, softcap, i, together[i], ((float *) out->data)[i]);
            }
        }
    }
    free(together);
    ggml_free(ctx);
    return bad;
}

int main(void) {
    void * cpu = open_cpu_backend();
    if (!cpu) {
        return 1;
    }
    init_fn init = (init_fn) dlsym(cpu, "ggml_cpu_init");
    compute_fn compute = (compute_fn) dlsym(cpu, "ggml_graph_compute_with_ctx");
    if (!init || !compute) {
        printf("FAIL: ggml_cpu_init or ggml_graph_compute_with_ctx not found\n");
        return 1;
    }
    init();
    struct { int d, n_head, n_head_kv; } shapes[] = {
        { 128, 12, 2 }, // Qwen2.5-Coder-1.5B
        { 64, 14, 2 },  // Qwen2.5-Coder-0.5B
        { 64, 9, 3 },   // SmolLM2-135M
        { 256, 4, 1 },  // Gemma-3-270M
        { 80, 8, 8 },   // no grouping by KV head; 16 elements past the last vector step
    };
    const int ns[] = { 1, 2, 5, 16 };
    int bad = 0, checked = 0;
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
            bad += check(compute, shapes[s].d, shapes[s].n_head, shapes[s].n_head_kv, ns[i], 37 + 50 * (int) i, 0.0f, 0.0f);
            checked++;
        }
        bad += check(compute, shapes[s].d, shapes[s].n_head, shapes[s].n_head_kv, 4, 100, 8.0f, 0.0f);  // ALiBi
        bad += check(compute, shapes[s].d, shapes[s].n_head, shapes[s].n_head_kv, 4, 100, 0.0f, 30.0f); // softcap
        checked += 2;
    }
    printf("%s: %d mismatching outputs in %d flash-attention ops (rows together against one at a time)\n", bad ? "FAIL" : "PASS", bad, checked);
    dlclose(cpu);
    return bad ? 1 : 0;
}
