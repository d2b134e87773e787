// The CPU backend's own symbols (its kernels, ggml_graph_compute_with_ctx) are not part of ggml's linked API:
// tests/c programs load libggml-cpu from the directory of the libggml-base they are linked with (the build's bin
// directory) and look them up by name. Not by bare name: ASan's dlopen interceptor becomes the caller, and the
// program's rpath no longer applies.
#pragma once

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "ggml.h"

// The loaded libggml-cpu, or NULL after printing why not (a FAIL line).
static void * open_cpu_backend(void) {
    Dl_info base;
    if (!dladdr((void *) ggml_fp32_to_fp16, &base) || !base.dli_fname) {
        printf("FAIL: cannot locate libggml-base: %s\n", dlerror());
        return NULL;
    }
    const char * slash = strrchr(base.dli_fname, '/');
    char path[4096];
    snprintf(path, sizeof(path), "%.*slibggml-cpu.so", slash ? (int) (slash - base.dli_fname + 1) : 0, base.dli_fname);
    void * cpu = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!cpu) {
        printf("FAIL: cannot load libggml-cpu.so: %s\n", dlerror());
    }
    return cpu;
}
