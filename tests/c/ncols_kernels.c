// The multi-column kernels of patches 0002 and 0005 against their single-column originals, bit for bit,
// and patch 0011's vectorised quantize_row_q8_K against ggml's reference.
//
// Patch 0002 adds ggml_gemv_q4_K_8x8_q8_K_ncols (repacked Q4_K, up to 16 columns per pass over the
// weights) and patch 0005 ggml_vec_dot_q6_K_q8_K_ncols (Q6_K). Each must give every column exactly what
// the kernel that decodes a single token gives it; the whole-model check (batch_invariance.c) covers the
// shapes one model happens to have, this one random blocks, odd lengths and every column count 1..16.
// The kernels exist only in x86 builds with AVX2; elsewhere the program says so and passes.
// quantize_row_q8_K feeds every K-quant matmul, one column or many: it must equal quantize_row_q8_K_ref
// (ties of |x|, zero blocks, NaN and infinity included).
//
//   ncols_kernels            exit 0 when every result is bitwise equal, 1 otherwise
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"
#include "ggml.h"

#define QK_K 256
#define NCOLS 16

// Layouts of ggml-common.h (block_q6_K, block_q8_K) and ggml-cpu/repack.h (block_q4_Kx8).
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; ggml_fp16_t d; } block_q6_K;
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;
typedef struct { ggml_fp16_t d[8]; ggml_fp16_t dmin[8]; uint8_t scales[96]; uint8_t qs[1024]; } block_q4_Kx8;

typedef void (*vec_dot_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
typedef void (*q6_ncols_fn)(int, float *, const void *, const void *, size_t, int);
typedef void (*gemv_fn)(int, float *, size_t, const void *, const void *, int, int);
typedef void (*quantize_fn)(const float *, void *, int64_t);

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t) (g_rng >> 16);
}
static void fill(void * p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        ((uint8_t *) p)[i] = (uint8_t) rnd();
    }
}
static float unit(void) { return (float) (rnd() % 20001) / 10000.0f - 1.0f; } // [-1, 1]

// Activations as quantize_row_q8_K leaves them: codes in [-127, 127], bsums the sums of 16.
static void fill_q8(block_q8_K * y, int nb) {
    for (int i = 0; i < nb; i++) {
        y[i].d = unit() * 0.05f;
        for (int j = 0; j < QK_K; j++) {
            y[i].qs[j] = (int8_t) ((int) (rnd() % 255) - 127);
        }
        for (int b = 0; b < QK_K / 16; b++) {
            int s = 0;
            for (int j = 0; j < 16; j++) {
                s += y[i].qs[16 * b + j];
            }
            y[i].bsums[b] = (int16_t) s;
        }
    }
}

static int check_q6(vec_dot_fn one, q6_ncols_fn many, int n) {
    const int nb = n / QK_K, rows = 24;
    block_q6_K * x = malloc(sizeof(block_q6_K) * (size_t) (nb * rows));
    block_q8_K * y = malloc(sizeof(block_q8_K) * (size_t) (nb * NCOLS));
    fill(x, sizeof(block_q6_K) * (size_t) (nb * rows));
    for (int i = 0; i < nb * rows; i++) {
        x[i].d = ggml_fp32_to_fp16(unit() * 0.01f);
    }
    fill_q8(y, nb * NCOLS);
    const size_t by = sizeof(block_q8_K) * (size_t) nb;
    int bad = 0;
    for (int ncols = 1; ncols <= NCOLS; ncols++) {
        for (int r = 0; r < rows; r++) {
            float got[NCOLS], want;
            many(n, got, x + (size_t) r * nb, y, by, ncols);
            for (int c = 0; c < ncols; c++) {
                one(n, &want, 0, x + (size_t) r * nb, 0, (const char *) y + c * by, 0, 1);
                if (memcmp(&got[c], &want, sizeof(float)) != 0) {
                    if (bad++ < 5) {
                        printf("q6_K n=%d ncols=%d row %d col %d: %.9g, single column %.9g\n", n, ncols, r, c, got[c], want);
                    }
                }
            }
        }
    }
    free(x);
    free(y);
    return bad;
}

static int check_q4(gemv_fn one, gemv_fn many, int n) {
    const int nb = n / QK_K, nc = 32; // 4 groups of 8 interleaved rows
    block_q4_Kx8 * x = malloc(sizeof(block_q4_Kx8) * (size_t) (nb * nc / 8));
    block_q8_K * y = malloc(sizeof(block_q8_K) * (size_t) (nb * NCOLS));
    fill(x, sizeof(block_q4_Kx8) * (size_t) (nb * nc / 8));
    for (int i = 0; i < nb * nc / 8; i++) {
        for (int k = 0; k < 8; k++) {
            x[i].d[k] = ggml_fp32_to_fp16(unit() * 0.01f);
            x[i].dmin[k] = ggml_fp32_to_fp16(unit() * 0.01f);
        }
    }
    fill_q8(y, nb * NCOLS);
    int bad = 0;
    for (int ncols = 1; ncols <= NCOLS; ncols++) {
        float got[NCOLS * 32], want[32];
        many(n, got, nc, x, y, ncols, nc);
        for (int c = 0; c < ncols; c++) {
            one(n, want, nc, x, y + (size_t) c * nb, 1, nc);
            for (int r = 0; r < nc; r++) {
                if (memcmp(&got[c * nc + r], &want[r], sizeof(float)) != 0) {
                    if (bad++ < 5) {
                        printf("q4_K n=%d ncols=%d row %d col %d: %.9g, single column %.9g\n", n, ncols, r, c, got[c * nc + r], want[r]);
                    }
                }
            }
        }
    }
    free(x);
    free(y);
    return bad;
}

// Rows of several magnitudes, with the awkward cases the reference handles its own way: an element of
// each sign at the row's maximum |x| (the first one sets the scale), an all-zero block, NaN, infinity.
static int check_quantize(quantize_fn fast, quantize_fn ref) {
    enum { NB = 6, ROWS = 64 };
    float * x = malloc(sizeof(float) * QK_K * NB);
    block_q8_K * got = malloc(sizeof(block_q8_K) * NB);
    block_q8_K * want = malloc(sizeof(block_q8_K) * NB);
    int bad = 0;
    for (int r = 0; r < ROWS; r++) {
        const float mag = r % 4 == 0 ? 1e-3f : r % 4 == 1 ? 1.0f : r % 4 == 2 ? 37.5f : 1e4f;
        for (int i = 0; i < QK_K * NB; i++) {
            x[i] = unit() * mag;
        }
        x[5] = 2 * mag;
        x[6] = -2 * mag; // a tie of |x| with the other sign: the reference keeps the first
        x[QK_K + 200] = -3 * mag;
        x[QK_K + 7] = 3 * mag;
        for (int i = 2 * QK_K; i < 3 * QK_K; i++) {
            x[i] = r % 2 ? 0.0f : -0.0f;
        }
        if (r % 8 == 3) {
            x[3 * QK_K + 17] = __builtin_nanf("");
        }
        if (r % 8 == 5) {
            x[4 * QK_K + 100] = -__builtin_inff();
        }
        // the bytes the reference leaves alone (a zero block's bsums) must match too
        memset(got, 0x5A, sizeof(block_q8_K) * NB);
        memset(want, 0x5A, sizeof(block_q8_K) * NB);
        fast(x, got, QK_K * NB);
        ref(x, want, QK_K * NB);
        if (memcmp(got, want, sizeof(block_q8_K) * NB) != 0) {
            if (bad++ < 5) {
                printf("quantize_row_q8_K row %d differs from quantize_row_q8_K_ref\n", r);
            }
        }
    }
    free(x);
    free(got);
    free(want);
    return bad;
}

int main(void) {
    void * cpu = open_cpu_backend();
    if (!cpu) {
        return 1;
    }
    vec_dot_fn q6_one = (vec_dot_fn) dlsym(cpu, "ggml_vec_dot_q6_K_q8_K");
    q6_ncols_fn q6_many = (q6_ncols_fn) dlsym(cpu, "ggml_vec_dot_q6_K_q8_K_ncols");
    gemv_fn q4_one = (gemv_fn) dlsym(cpu, "ggml_gemv_q4_K_8x8_q8_K");
    gemv_fn q4_many = (gemv_fn) dlsym(cpu, "ggml_gemv_q4_K_8x8_q8_K_ncols");
    quantize_fn q8k = (quantize_fn) dlsym(cpu, "quantize_row_q8_K");
    quantize_fn q8k_ref = (quantize_fn) dlsym(RTLD_DEFAULT, "quantize_row_q8_K_ref");
    int bad = 0, checked = 0;
    if (q8k && q8k_ref) {
        bad += check_quantize(q8k, q8k_ref);
        checked++;
    } else {
        printf("FAIL: quantize_row_q8_K or quantize_row_q8_K_ref not found\n");
        return 1;
    }
    if (!q6_many && !q4_many) {
        printf("%s: quantize_row_q8_K %s; no multi-column kernels in this build (not x86 with AVX2)\n", bad ? "FAIL" : "PASS", bad ? "differs" : "equal");
        return bad ? 1 : 0;
    }
    const int lengths[] = { 256, 1536, 2304, 8960 };
    for (size_t i = 0; i < sizeof(lengths) / sizeof(lengths[0]); i++) {
        if (q6_one && q6_many) {
            bad += check_q6(q6_one, q6_many, lengths[i]);
            checked++;
        }
        if (q4_one && q4_many) {
            bad += check_q4(q4_one, q4_many, lengths[i]);
            checked++;
        }
    }
    printf("%s: %d mismatching results in %d checks (quantize_row_q8_K; kernel x length, 1..%d columns)\n", bad ? "FAIL" : "PASS", bad, checked, NCOLS);
    dlclose(cpu);
    return bad ? 1 : 0;
}
