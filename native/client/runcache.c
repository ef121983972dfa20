/* Root's cache files in /run/nvc-py, as the fronts read them (runcache.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runcache.h"
#include "socket_dir.h"

#define CACHE_DIR "/run/nvc-py"
#define CONFIG_ENV "NVC_PY_CONFIG"
#define DEFAULT_CONFIG "/etc/nvc-py/config.yaml"

void text_add(struct text *t, const char *s, size_t n)
{
    if (t->full || t->len + n + 1 > sizeof t->buf) {
        t->full = 1;
        return;
    }
    memcpy(t->buf + t->len, s, n);
    t->len += n;
}

void text_add_str(struct text *t, const char *s)
{
    text_add(t, s, strlen(s));
}

void text_end_field(struct text *t)
{
    text_add(t, "", 1);
}

void text_add_identity(struct text *t, const struct stat *st)
{
    char id[160];
    snprintf(id, sizeof id, "%llu %llu %lld %llu %llu", (unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
             (long long)st->st_size,
             (unsigned long long)st->st_mtim.tv_sec * 1000000000ull + (unsigned long long)st->st_mtim.tv_nsec,
             (unsigned long long)st->st_ctim.tv_sec * 1000000000ull + (unsigned long long)st->st_ctim.tv_nsec);
    text_add_str(t, id);
}

int text_add_config(struct text *t)
{
    const char *config = getenv(CONFIG_ENV);
    struct stat st;
    if (!config || !*config)
        config = DEFAULT_CONFIG;
    text_add_str(t, config);
    text_end_field(t);
    if (stat(config, &st) == 0)
        text_add_identity(t, &st);
    else if (errno == ENOENT)
        text_add_str(t, "absent");
    else
        return 0;
    text_end_field(t);
    return !t->full;
}

const char *runcache_values(const char *name, const struct text *key, char *cache, size_t *size)
{
    struct stat st;
    if (geteuid() != 0 || key->full)
        return NULL;
    int dir = open(CACHE_DIR, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir < 0)
        return NULL;
    int ok = fstat(dir, &st) == 0 && socket_dir_is_roots(&st);
    int fd = ok ? openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) : -1;
    close(dir);
    if (fd < 0)
        return NULL;
    ssize_t n = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 && !(st.st_mode & 077) && st.st_size <= MAX_CACHE)
        n = read(fd, cache, MAX_CACHE + 1);
    close(fd);
    if (n <= 0 || n > MAX_CACHE || (size_t)n <= key->len || memcmp(cache, key->buf, key->len) != 0 || cache[n - 1])
        return NULL;
    *size = (size_t)n - key->len;
    return cache + key->len;
}
