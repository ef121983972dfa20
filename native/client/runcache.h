/* Root's cache files in /run/nvc-py as the fronts read them (nvc/system/runcache.py writes them): a key of
 * NUL-terminated fields the front computes as the program did, then the values, believed only from root's own
 * file in root's own directory (runcache.c). */
#ifndef NVC_CLIENT_RUNCACHE_H
#define NVC_CLIENT_RUNCACHE_H

#include <stddef.h>
#include <sys/stat.h>

#define MAX_CACHE (64 * 1024) /* bytes: paths and a few numbers */

/* A growing text, for a key (NUL-separated fields); full once something did not fit. */
struct text {
    char buf[MAX_CACHE];
    size_t len;
    int full;
};

void text_add(struct text *t, const char *s, size_t n);
void text_add_str(struct text *t, const char *s);
void text_end_field(struct text *t);
/* A file's identity as nvc/system/runcache.py's identity(): device, inode, size, modification and change times. */
void text_add_identity(struct text *t, const struct stat *st);
/* Two fields: the configuration file the program reads ($NVC_PY_CONFIG, else the default) and its identity
 * ("absent" where there is none); 0 where it cannot be told. */
int text_add_config(struct text *t);

/* What follows key in root's own cache file /run/nvc-py/NAME (read into cache, MAX_CACHE + 1 bytes), its length
 * in *size, the file ending in a NUL; NULL where this is not root, or the file is not root's own regular file
 * that no one else reads, in root's own directory, or does not begin with key. */
const char *runcache_values(const char *name, const struct text *key, char *cache, size_t *size);

#endif
