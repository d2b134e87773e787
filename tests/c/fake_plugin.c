/* A plugin that never drafts and exports only the required symbols (none of the optional prediction ones:
 * tests/server_prediction.rs), and broken ones for the start-up error tests (tests/plugin_errors.rs):
 *   -DFAKE_NO_SYMBOLS   exports none of the llama_spec_plugin_* symbols
 *   -DFAKE_ABI=2        answers an ABI version the host does not speak
 *   -DFAKE_INIT_NULL    init fails with a message */
#include <stddef.h>
#include <stdint.h>

#ifdef FAKE_NO_SYMBOLS
int fake_plugin_nothing_here(void) { return 0; }
#else
#ifndef FAKE_ABI
#define FAKE_ABI 1
#endif
uint32_t llama_spec_plugin_abi_version(void) { return FAKE_ABI; }
const char *llama_spec_plugin_last_error(void) { return "fake plugin: init refused on purpose"; }
void *llama_spec_plugin_init(const void *params) {
    (void) params;
#ifdef FAKE_INIT_NULL
    return NULL;
#else
    static int state;
    return &state;
#endif
}
void llama_spec_plugin_begin(void *p, int32_t s, const int32_t *t, int32_t n) { (void) p; (void) s; (void) t; (void) n; }
int32_t llama_spec_plugin_draft(void *p, int32_t s, const int32_t *t, int32_t n, int32_t l, int32_t m, int32_t *o) {
    (void) p; (void) s; (void) t; (void) n; (void) l; (void) m; (void) o;
    return 0;
}
void llama_spec_plugin_accept(void *p, int32_t s, int32_t n) { (void) p; (void) s; (void) n; }
void llama_spec_plugin_free(void *p) { (void) p; }
#endif
