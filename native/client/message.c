/* The call's message, as hook/server/handover.py reads it: MAGIC, the counts, the arguments, the
 * environment, the connect stamp last. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "message.h"

#define MAGIC "nvc-py-hook/2"
/* The last environment entry sent: CLOCK_MONOTONIC as it connects, ns, STAMP_DIGITS digits written just
 * before connecting (the server's queue wait; it removes the entry). As hook/server/handover.py's. */
#define CONNECTED_ENV "NVC_PY_HOOK_CONNECTED="
#define STAMP_DIGITS 20

extern char **environ;

/* Appends s and its NUL; 0 when the message would outgrow MAX_MESSAGE. */
static int put(char *buf, size_t *len, const char *s)
{
    size_t n = strlen(s) + 1;
    if (*len + n > MAX_MESSAGE)
        return 0;
    memcpy(buf + *len, s, n);
    *len += n;
    return 1;
}

static int is_stamp(const char *entry)
{
    return !strncmp(entry, CONNECTED_ENV, sizeof CONNECTED_ENV - 1);
}

/* One the caller inherited is left out: the server would read its stamp as this call's. */
int message_build(char *buf, size_t *len, int argc, char **argv)
{
    char count[32], stamp[sizeof CONNECTED_ENV + STAMP_DIGITS];
    int envc = 1;
    for (int i = 0; environ[i]; i++)
        envc += !is_stamp(environ[i]);
    if (!put(buf, len, MAGIC))
        return 0;
    snprintf(count, sizeof count, "%d", argc);
    if (!put(buf, len, count))
        return 0;
    snprintf(count, sizeof count, "%d", envc);
    if (!put(buf, len, count))
        return 0;
    for (int i = 0; i < argc; i++)
        if (!put(buf, len, argv[i]))
            return 0;
    for (int i = 0; environ[i]; i++)
        if (!is_stamp(environ[i]) && !put(buf, len, environ[i]))
            return 0;
    snprintf(stamp, sizeof stamp, CONNECTED_ENV "%0*d", STAMP_DIGITS, 0);
    return put(buf, len, stamp);
}

void message_stamp(char *buf, size_t len)
{
    struct timespec now;
    char digits[STAMP_DIGITS + 1];
    clock_gettime(CLOCK_MONOTONIC, &now);
    snprintf(digits, sizeof digits, "%0*llu", STAMP_DIGITS,
             (unsigned long long)now.tv_sec * 1000000000ull + (unsigned long long)now.tv_nsec);
    memcpy(buf + len - 1 - STAMP_DIGITS, digits, STAMP_DIGITS);
}
