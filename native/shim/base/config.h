/* A container's limits (config.c): the limits file or the environment, per device. */
#ifndef NVC_CONFIG_H
#define NVC_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define NVC_MAX_DEVICES 16
#define NVC_UUID_KEY_LEN 37 /* 36 hex-and-dash characters + NUL, prefix (GPU-/MIG-) dropped */
#define NVC_FIXED_DIR "/var/run/nvc-share"

enum nvc_on_error { NVC_PASS_THROUGH = 0, NVC_FAIL_CLOSED = 1 };

/* MPS's per-client variables the limits file may give (nvc/plan/mps.py CLIENT_VARIABLES), in this order */
#define NVC_MPS_VARS 4
#define NVC_MPS_VALUE_LEN 64
extern const char *const nvc_mps_names[NVC_MPS_VARS];

/* Latency classes (priority=...), most urgent highest; NONE: none given (counts as batch beside a
 * latency-critical tenant) */
enum nvc_class { NVC_CLASS_NONE = 0, NVC_CLASS_BATCH = 1, NVC_CLASS_LATENCY_CRITICAL = 2 };

struct nvc_limit_rule {
    char key[NVC_UUID_KEY_LEN]; /* UUID key (prefix dropped), or "" when by index */
    int index;                  /* NVML index, or -1 when by UUID */
    uint64_t memory;            /* bytes; 0 = not given */
    unsigned compute;           /* percent 1..100; 0 = not given */
    unsigned weight;            /* 1..1000; 0 = not given */
    unsigned klass;             /* enum nvc_class; NONE = not given */
};

struct nvc_config {
    int enabled;   /* 0: kill switch, everything passes through */
    int from_file; /* limits came from the read-only limits file */
    enum nvc_on_error on_error;
    uint64_t memory_default;   /* 0 = unlimited */
    unsigned compute_default;  /* 100 = unthrottled */
    unsigned weight_default;   /* 0 = not weighted */
    unsigned class_default;    /* enum nvc_class */
    uint64_t context_overhead; /* bytes charged per process per device with a context */
    int nrules;
    struct nvc_limit_rule rules[2 * NVC_MAX_DEVICES];
    char dir[256];                                 /* per-container directory holding the region */
    char mps_env[NVC_MPS_VARS][NVC_MPS_VALUE_LEN]; /* values of nvc_mps_names to set; "" = none */
    uint64_t hash;                                 /* FNV-1a of the canonical limits, stored in the region */
};

int nvc_parse_size(const char *text, uint64_t *out);
int nvc_parse_percent(const char *text, int allow_zero, unsigned *out);
/* Parse limits-file text; on error writes a message naming the line into err and returns -1. */
int nvc_parse_limits_text(const char *text, struct nvc_config *cfg, char *err, size_t errlen);
/* A text file's content (at most size - 1 bytes, NUL-terminated): 0, -1 with errno, or -2 when larger. */
int nvc_read_text(const char *path, char *buf, size_t size);
int nvc_config_from_env(char *const *envp, struct nvc_config *cfg, char *err, size_t errlen);
void nvc_config_finish(struct nvc_config *cfg);
/* Limits for one device: key = UUID key, index = NVML index or -1 when unknown. */
uint64_t nvc_config_memory(const struct nvc_config *cfg, const char *key, int index);
unsigned nvc_config_compute(const struct nvc_config *cfg, const char *key, int index);
unsigned nvc_config_weight(const struct nvc_config *cfg, const char *key, int index);
/* The weight of device `key` when its NVML index is unknown (another container's limits, numbered as
 * that container numbers its GPUs): its UUID rule, else the largest it could be (the default or any
 * index rule's). 0 = not weighted. */
unsigned nvc_config_weight_bound(const struct nvc_config *cfg, const char *key);
unsigned nvc_config_class(const struct nvc_config *cfg, const char *key, int index);
/* The latency class of device `key` when its NVML index is unknown (as nvc_config_weight_bound): its UUID
 * rule, else the most urgent it could be. */
unsigned nvc_config_class_bound(const struct nvc_config *cfg, const char *key);
int nvc_config_has_index_rules(const struct nvc_config *cfg);
void nvc_uuid_key(const char *uuid, char key[NVC_UUID_KEY_LEN]);

#endif
