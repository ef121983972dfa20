/* limits_parse: the shim's limits parsers (native/shim/base/config.c) on one input, printing what they read,
 * for tests/test_share_native.py to hold against the Python reader and writer of the same grammar.
 *
 *   limits_parse file             parses a limits file's text from stdin
 *   limits_parse env NAME=VALUE…  parses the arguments as the environment
 *
 * Prints "error <message>", or "default memory=M compute=C weight=W priority=P" and then, in the canonical
 * order (nvc_config_finish), one "rule index=I key=K memory=M compute=C weight=W priority=P" per device rule
 * (key "-" for an index rule; 0 or "-": not given), then one "mps NAME=VALUE" per MPS client variable it sets. */
#include <stdio.h>
#include <string.h>

#include "base/config.h"

int main(int argc, char **argv)
{
    struct nvc_config cfg;
    char err[256] = "";
    int rc;
    if (argc >= 2 && !strcmp(argv[1], "file")) {
        static char text[65536];
        size_t n = fread(text, 1, sizeof text - 1, stdin);
        text[n] = '\0';
        rc = nvc_parse_limits_text(text, &cfg, err, sizeof err);
    } else if (argc >= 2 && !strcmp(argv[1], "env")) {
        rc = nvc_config_from_env(argv + 2, &cfg, err, sizeof err);
    } else {
        fprintf(stderr, "usage: limits_parse file < TEXT | limits_parse env NAME=VALUE...\n");
        return 2;
    }
    if (rc) {
        printf("error %s\n", err);
        return 0;
    }
    nvc_config_finish(&cfg);
    static const char *const classes[] = {"-", "batch", "latency-critical"};
    printf("default memory=%llu compute=%u weight=%u priority=%s\n", (unsigned long long)cfg.memory_default,
           cfg.compute_default, cfg.weight_default, classes[cfg.class_default]);
    for (int i = 0; i < cfg.nrules; i++) {
        const struct nvc_limit_rule *r = &cfg.rules[i];
        printf("rule index=%d key=%s memory=%llu compute=%u weight=%u priority=%s\n", r->index,
               r->key[0] ? r->key : "-", (unsigned long long)r->memory, r->compute, r->weight, classes[r->klass]);
    }
    for (int i = 0; i < NVC_MPS_VARS; i++)
        if (cfg.mps_env[i][0]) printf("mps %s=%s\n", nvc_mps_names[i], cfg.mps_env[i]);
    return 0;
}
