/* libFuzzer target: the shim's limit parsing (config.c), both ways a container's limits reach it:
 * the read-only limits file (nvc_parse_limits_text) and, for plain LD_PRELOAD use, the environment
 * (nvc_config_from_env: each input line one NAME=VALUE entry). Each parsed configuration is then
 * finished and asked for every device's limits, as the shim does. Besides ASan and UBSan's
 * findings, a parse that succeeds must keep the grammar's bounds (native/shim/base/config.c's header).
 * Built and run by `make fuzz` (native/Makefile's fuzz target, tests/harness/fuzzing.py). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "base/config.h"

#define MAX_ENTRIES 64

static void check(struct nvc_config *cfg)
{
    nvc_config_finish(cfg);
    if (cfg->nrules < 0 || cfg->nrules > 2 * NVC_MAX_DEVICES)
        abort();
    if (cfg->compute_default < 1 || cfg->compute_default > 100 || cfg->weight_default > 1000)
        abort();
    for (int i = 0; i < cfg->nrules; i++) {
        const struct nvc_limit_rule *r = &cfg->rules[i];
        if (r->compute > 100 || r->weight > 1000 || strlen(r->key) >= NVC_UUID_KEY_LEN)
            abort();
        if ((r->index < 0) == !r->key[0]) /* a rule is by index or by UUID, never both or neither */
            abort();
        nvc_config_memory(cfg, r->key[0] ? r->key : NULL, r->index);
        nvc_config_compute(cfg, r->key, r->index);
        nvc_config_weight(cfg, r->key, -1);
        nvc_config_weight_bound(cfg, r->key);
    }
    nvc_config_has_index_rules(cfg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    struct nvc_config cfg;
    char err[256];
    if (nvc_parse_limits_text(text, &cfg, err, sizeof err) == 0)
        check(&cfg);

    char *envp[MAX_ENTRIES + 1];
    size_t n = 0;
    for (char *line = text, *next; line && n < MAX_ENTRIES; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        envp[n++] = line;
    }
    envp[n] = NULL;
    if (nvc_config_from_env(envp, &cfg, err, sizeof err) == 0)
        check(&cfg);
    free(text);
    return 0;
}
