/* Limits: the read-only limits file written by the hook (the authority inside containers) and,
 * for plain LD_PRELOAD use, the environment. Strict parsing: junk is an error, never a guess,
 * because a misread limit silently gives a tenant the whole GPU.
 *
 * The limits file's grammar, parsed here, is the one format the Python side writes (only
 * nvc/plan/share.py limits_text, from what nvc/containerenv/sharing.py read of the container's
 * env with the names and value grammar of env_names below):
 *   - lines of key=value, surrounding white space ignored; empty lines and '#' comments skipped;
 *   - the first entry version=1;
 *   - memory_limit[.SCOPE]=SIZE: decimal bytes, optionally K, M, G or T with an optional i (all
 *     powers of 1024), not 0, below 2^64;
 *   - compute_percent[.SCOPE]=1..100 (decimal digits);
 *   - compute_weight[.SCOPE]=1..1000 (decimal digits);
 *   - priority[.SCOPE]=latency-critical|batch: the latency class (scheduling/schedpolicy.h);
 *   - SCOPE: an NVML index of 1 to 3 digits, or a device UUID of at most 40 letters, digits and '-',
 *     matched without its GPU- or MIG- prefix and without case (the hook writes GPU-/MIG- UUIDs),
 *     not empty without it;
 *     at most 2 * NVC_MAX_DEVICES devices in one file (a file naming more is refused whole);
 *   - mps.NAME=VALUE: NAME one of nvc_mps_names, VALUE 1 to 63 letters, digits and "=-_/.,": a
 *     variable of MPS's client the shim sets in the process's environment as it loads (a container
 *     shared through MPS, nvc/plan/mps.py);
 *   - on_error=pass-through|fail-closed, context_overhead=SIZE or 0, enabled=0|1 (never written by
 *     the hook: for hand-written files).
 * tests/test_share_native.py (test_config_*) feeds one table of values to this parser and to the
 * Python reader and writer, and checks they agree. */
#include "base/config.h"
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const nvc_mps_names[NVC_MPS_VARS] = {
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_CLIENT_PRIORITY",
    "CUDA_MPS_PIPE_DIRECTORY",
};

int nvc_parse_size(const char *text, uint64_t *out)
{
    const char *p = text;
    uint64_t value = 0;
    if (!isdigit((unsigned char)*p))
        return -1;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned digit = (unsigned)(*p - '0');
        if (value > (UINT64_MAX - digit) / 10)
            return -1;
        value = value * 10 + digit;
    }
    unsigned shift = 0;
    if (*p) {
        switch (*p) {
        case 'k':
        case 'K': shift = 10; break;
        case 'm':
        case 'M': shift = 20; break;
        case 'g':
        case 'G': shift = 30; break;
        case 't':
        case 'T': shift = 40; break;
        default: return -1;
        }
        p++;
        if (*p == 'i') /* Ki/Mi/Gi/Ti: the same powers of 1024 as K/M/G/T */
            p++;
        if (*p)
            return -1;
    }
    if (value == 0 || (shift && value > (UINT64_MAX >> shift)))
        return -1;
    *out = value << shift;
    return 0;
}

int nvc_parse_percent(const char *text, int allow_zero, unsigned *out)
{
    unsigned value = 0;
    if (!*text)
        return -1;
    for (const char *p = text; *p; p++) {
        if (!isdigit((unsigned char)*p) || value > 1000)
            return -1;
        value = value * 10 + (unsigned)(*p - '0');
    }
    if (value == 0 && allow_zero)
        value = 100; /* HAMi: CUDA_DEVICE_SM_LIMIT=0 means unlimited */
    if (value < 1 || value > 100)
        return -1;
    *out = value;
    return 0;
}

void nvc_uuid_key(const char *uuid, char key[NVC_UUID_KEY_LEN])
{
    if (!strncmp(uuid, "GPU-", 4) || !strncmp(uuid, "MIG-", 4))
        uuid += 4;
    size_t i = 0;
    for (; uuid[i] && i < NVC_UUID_KEY_LEN - 1; i++)
        key[i] = (char)tolower((unsigned char)uuid[i]);
    key[i] = '\0';
}

/* A device selector: all digits = NVML index, otherwise a UUID with optional GPU-/MIG- prefix. */
static struct nvc_limit_rule *rule_for(struct nvc_config *cfg, const char *selector)
{
    int index = -1;
    char key[NVC_UUID_KEY_LEN] = "";
    size_t n = strlen(selector);
    if (n == 0)
        return NULL;
    if (strspn(selector, "0123456789") == n) {
        if (n > 3)
            return NULL;
        index = atoi(selector);
    } else {
        if (n >= NVC_UUID_KEY_LEN + 4)
            return NULL;
        for (size_t i = 0; i < n; i++)
            if (!isalnum((unsigned char)selector[i]) && selector[i] != '-')
                return NULL;
        nvc_uuid_key(selector, key);
        if (!key[0])
            return NULL; /* "GPU-" alone: a rule no device would ever match */
    }
    for (int i = 0; i < cfg->nrules; i++)
        if (cfg->rules[i].index == index && !strcmp(cfg->rules[i].key, key))
            return &cfg->rules[i];
    if (cfg->nrules == (int)(sizeof cfg->rules / sizeof cfg->rules[0]))
        return NULL;
    struct nvc_limit_rule *rule = &cfg->rules[cfg->nrules++];
    memset(rule, 0, sizeof *rule);
    rule->index = index;
    strcpy(rule->key, key);
    return rule;
}

static void config_defaults(struct nvc_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->enabled = 1;
    cfg->compute_default = 100;
}

/* A value for every device (no scope: *default_value) or for the scope's rule (its unsigned field at
 * offset `field`). */
static int put(struct nvc_config *cfg, const char *dot, unsigned value, unsigned *default_value, size_t field)
{
    if (!dot) {
        *default_value = value;
        return 0;
    }
    struct nvc_limit_rule *rule = rule_for(cfg, dot + 1);
    if (!rule)
        return -1;
    *(unsigned *)((char *)rule + field) = value;
    return 0;
}

/* One key=value of the limits file (and, translated, of the environment). */
static int apply(struct nvc_config *cfg, const char *key, const char *value, int hami_percent)
{
    const char *dot = strchr(key, '.');
    size_t base = dot ? (size_t)(dot - key) : strlen(key);
    if (base == 3 && !strncmp(key, "mps", base) && dot) {
        size_t n = strlen(value);
        const char *allowed = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789=-_/.,";
        if (!n || n >= NVC_MPS_VALUE_LEN || strspn(value, allowed) != n)
            return -1;
        for (int i = 0; i < NVC_MPS_VARS; i++)
            if (!strcmp(dot + 1, nvc_mps_names[i])) {
                memcpy(cfg->mps_env[i], value, n + 1);
                return 0;
            }
        return -1;
    }
    if (base == 12 && !strncmp(key, "memory_limit", base)) {
        uint64_t bytes;
        if (nvc_parse_size(value, &bytes))
            return -1;
        if (!dot) {
            cfg->memory_default = bytes;
            return 0;
        }
        struct nvc_limit_rule *rule = rule_for(cfg, dot + 1);
        if (!rule)
            return -1;
        rule->memory = bytes;
        return 0;
    }
    if (base == 15 && !strncmp(key, "compute_percent", base)) {
        unsigned percent;
        if (nvc_parse_percent(value, hami_percent, &percent))
            return -1;
        return put(cfg, dot, percent, &cfg->compute_default, offsetof(struct nvc_limit_rule, compute));
    }
    if (base == 14 && !strncmp(key, "compute_weight", base)) {
        char *end = "";
        unsigned long weight = isdigit((unsigned char)*value) ? strtoul(value, &end, 10) : 0;
        if (!weight || *end || weight > 1000)
            return -1;
        return put(cfg, dot, (unsigned)weight, &cfg->weight_default, offsetof(struct nvc_limit_rule, weight));
    }
    if (base == 8 && !strncmp(key, "priority", base)) {
        unsigned klass = !strcmp(value, "latency-critical") ? NVC_CLASS_LATENCY_CRITICAL
                         : !strcmp(value, "batch")          ? NVC_CLASS_BATCH
                                                            : NVC_CLASS_NONE;
        if (klass == NVC_CLASS_NONE)
            return -1;
        return put(cfg, dot, klass, &cfg->class_default, offsetof(struct nvc_limit_rule, klass));
    }
    if (dot)
        return -1;
    if (!strcmp(key, "on_error")) {
        if (!strcmp(value, "pass-through"))
            cfg->on_error = NVC_PASS_THROUGH;
        else if (!strcmp(value, "fail-closed"))
            cfg->on_error = NVC_FAIL_CLOSED;
        else
            return -1;
        return 0;
    }
    if (!strcmp(key, "context_overhead")) {
        if (!strcmp(value, "0")) {
            cfg->context_overhead = 0;
            return 0;
        }
        return nvc_parse_size(value, &cfg->context_overhead);
    }
    if (!strcmp(key, "enabled")) {
        if (strcmp(value, "0") && strcmp(value, "1"))
            return -1;
        cfg->enabled = value[0] == '1';
        return 0;
    }
    return -1;
}

int nvc_parse_limits_text(const char *text, struct nvc_config *cfg, char *err, size_t errlen)
{
    config_defaults(cfg);
    cfg->from_file = 1;
    /* on_error decides what a junk line does, wherever it sits in the file */
    if (!strncmp(text, "on_error=fail-closed\n", 21) || strstr(text, "\non_error=fail-closed\n"))
        cfg->on_error = NVC_FAIL_CLOSED;
    int lineno = 0, seen_version = 0;
    const char *p = text;
    while (*p) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char line[512];
        lineno++;
        if (len >= sizeof line) {
            snprintf(err, errlen, "limits line %d is too long", lineno);
            return -1;
        }
        memcpy(line, p, len);
        line[len] = '\0';
        p += len + (end ? 1 : 0);
        char *s = line;
        while (isspace((unsigned char)*s))
            s++;
        char *e = s + strlen(s);
        while (e > s && isspace((unsigned char)e[-1]))
            *--e = '\0';
        if (!*s || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(err, errlen, "limits line %d: expected key=value, got '%s'", lineno, s);
            return -1;
        }
        *eq = '\0';
        if (!seen_version) {
            if (strcmp(s, "version") || strcmp(eq + 1, "1")) {
                snprintf(err, errlen, "limits line %d: the first entry must be version=1", lineno);
                return -1;
            }
            seen_version = 1;
            continue;
        }
        if (apply(cfg, s, eq + 1, 0)) {
            snprintf(err, errlen, "limits line %d: invalid %s=%s", lineno, s, eq + 1);
            return -1;
        }
    }
    if (!seen_version) {
        snprintf(err, errlen, "limits file has no version=1 line");
        return -1;
    }
    return 0;
}

/* Environment names -> limits-file keys. NVC_SHARE_* beat HAMi's names, which are applied first. */
static const struct {
    const char *prefix;
    const char *key;
    int hami;
} env_names[] = {
    {"CUDA_DEVICE_MEMORY_LIMIT", "memory_limit", 1}, {"CUDA_DEVICE_SM_LIMIT", "compute_percent", 1},
    {"NVC_SHARE_MEMORY_LIMIT", "memory_limit", 0},   {"NVC_SHARE_COMPUTE", "compute_percent", 0},
    {"NVC_SHARE_WEIGHT", "compute_weight", 0},       {"NVC_SHARE_PRIORITY", "priority", 0},
};

int nvc_read_text(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t got = 0;
    ssize_t n;
    while (got < size - 1 && (n = read(fd, buf + got, size - 1 - got)) != 0) {
        if (n < 0) {
            if (errno == EINTR)
                continue;
            close(fd);
            return -1;
        }
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    return got == size - 1 ? -2 : 0;
}

/* A variable's device suffix: an NVML index (1-3 digits) or a GPU-/MIG- UUID (nvc/containerenv/sharing.py _SCOPE). */
static int env_scope(const char *s, size_t n)
{
    if (n >= 1 && n <= 3)
        return strspn(s, "0123456789") >= n;
    if (n < 5 || n > NVC_UUID_KEY_LEN + 3 || (strncmp(s, "GPU-", 4) && strncmp(s, "MIG-", 4)))
        return 0;
    return strspn(s + 4, "0123456789abcdefABCDEF-") >= n - 4;
}

int nvc_config_from_env(char *const *envp, struct nvc_config *cfg, char *err, size_t errlen)
{
    config_defaults(cfg);
    /* on_error first: it decides what a junk value below does */
    for (char *const *e = envp; *e; e++)
        if (!strncmp(*e, "NVC_SHARE_ON_ERROR=", 19) && apply(cfg, "on_error", *e + 19, 0)) {
            snprintf(err, errlen, "invalid %s (want pass-through or fail-closed)", *e);
            return -1;
        }
    for (size_t n = 0; n < sizeof env_names / sizeof env_names[0]; n++) {
        size_t plen = strlen(env_names[n].prefix);
        for (char *const *e = envp; *e; e++) {
            if (strncmp(*e, env_names[n].prefix, plen))
                continue;
            const char *rest = *e + plen, *eq = strchr(rest, '=');
            if (!eq)
                continue;
            char key[64];
            if (rest == eq) {
                snprintf(key, sizeof key, "%s", env_names[n].key);
            } else if (*rest == '_' && env_scope(rest + 1, (size_t)(eq - rest - 1))) {
                snprintf(key, sizeof key, "%s.%.*s", env_names[n].key, (int)(eq - rest - 1), rest + 1);
            } else {
                continue; /* another variable sharing the prefix */
            }
            if (apply(cfg, key, eq + 1, env_names[n].hami)) {
                snprintf(err, errlen, "invalid %.*s='%s'", (int)(eq - *e), *e, eq + 1);
                return -1;
            }
        }
    }
    for (char *const *e = envp; *e; e++) {
        const char *v;
        if (!strncmp(*e, "NVC_SHARE_CONTEXT_OVERHEAD=", 27) && apply(cfg, "context_overhead", *e + 27, 0)) {
            snprintf(err, errlen, "invalid %s", *e);
            return -1;
        }
        if (!strncmp(*e, "NVC_SHARE_DISABLE=", 18)) {
            v = *e + 18;
            cfg->enabled = !(v[0] == '1' && !v[1]);
        }
    }
    return 0;
}

static int rule_cmp(const void *a, const void *b)
{
    const struct nvc_limit_rule *x = a, *y = b;
    if (x->index != y->index)
        return x->index < y->index ? -1 : 1;
    return strcmp(x->key, y->key);
}

static uint64_t fnv(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Canonical order and the hash the region stores: same limits -> same hash, whatever the source. */
void nvc_config_finish(struct nvc_config *cfg)
{
    qsort(cfg->rules, (size_t)cfg->nrules, sizeof cfg->rules[0], rule_cmp);
    uint64_t h = 14695981039346656037ull;
    h = fnv(h, &cfg->memory_default, sizeof cfg->memory_default);
    h = fnv(h, &cfg->compute_default, sizeof cfg->compute_default);
    h = fnv(h, &cfg->context_overhead, sizeof cfg->context_overhead);
    h = fnv(h, &cfg->weight_default, sizeof cfg->weight_default);
    h = fnv(h, &cfg->class_default, sizeof cfg->class_default);
    for (int i = 0; i < cfg->nrules; i++) {
        const struct nvc_limit_rule *r = &cfg->rules[i];
        h = fnv(h, r->key, strlen(r->key) + 1);
        h = fnv(h, &r->index, sizeof r->index);
        h = fnv(h, &r->memory, sizeof r->memory);
        h = fnv(h, &r->compute, sizeof r->compute);
        h = fnv(h, &r->weight, sizeof r->weight);
        h = fnv(h, &r->klass, sizeof r->klass);
    }
    cfg->hash = h;
}

enum field { F_MEMORY, F_COMPUTE, F_WEIGHT, F_CLASS };

static unsigned rule_field(const struct nvc_limit_rule *r, enum field f)
{
    return f == F_MEMORY ? r->memory != 0 : f == F_COMPUTE ? r->compute : f == F_WEIGHT ? r->weight : r->klass;
}

static const struct nvc_limit_rule *find(const struct nvc_config *cfg, const char *key, int index, enum field f)
{
    const struct nvc_limit_rule *by_index = NULL;
    for (int i = 0; i < cfg->nrules; i++) {
        const struct nvc_limit_rule *r = &cfg->rules[i];
        if (!rule_field(r, f))
            continue;
        if (r->key[0] && key && !strcmp(r->key, key))
            return r; /* a UUID rule beats an index rule */
        if (r->index >= 0 && r->index == index)
            by_index = r;
    }
    return by_index;
}

uint64_t nvc_config_memory(const struct nvc_config *cfg, const char *key, int index)
{
    const struct nvc_limit_rule *r = find(cfg, key, index, F_MEMORY);
    return r ? r->memory : cfg->memory_default;
}

unsigned nvc_config_compute(const struct nvc_config *cfg, const char *key, int index)
{
    const struct nvc_limit_rule *r = find(cfg, key, index, F_COMPUTE);
    return r ? r->compute : cfg->compute_default;
}

unsigned nvc_config_weight(const struct nvc_config *cfg, const char *key, int index)
{
    const struct nvc_limit_rule *r = find(cfg, key, index, F_WEIGHT);
    return r ? r->weight : cfg->weight_default;
}

unsigned nvc_config_class(const struct nvc_config *cfg, const char *key, int index)
{
    const struct nvc_limit_rule *r = find(cfg, key, index, F_CLASS);
    return r ? r->klass : cfg->class_default;
}

/* A field's value on device `key` whose NVML index is unknown: its UUID rule, else the largest of the
 * default and the index rules'. */
static unsigned bound(const struct nvc_config *cfg, const char *key, enum field f, unsigned default_value)
{
    const struct nvc_limit_rule *r = find(cfg, key, -1, f);
    if (r)
        return rule_field(r, f);
    unsigned most = default_value;
    for (int i = 0; i < cfg->nrules; i++)
        if (cfg->rules[i].index >= 0 && rule_field(&cfg->rules[i], f) > most)
            most = rule_field(&cfg->rules[i], f);
    return most;
}

unsigned nvc_config_weight_bound(const struct nvc_config *cfg, const char *key)
{
    return bound(cfg, key, F_WEIGHT, cfg->weight_default);
}

unsigned nvc_config_class_bound(const struct nvc_config *cfg, const char *key)
{
    return bound(cfg, key, F_CLASS, cfg->class_default);
}

int nvc_config_has_index_rules(const struct nvc_config *cfg)
{
    for (int i = 0; i < cfg->nrules; i++)
        if (cfg->rules[i].index >= 0)
            return 1;
    return 0;
}
