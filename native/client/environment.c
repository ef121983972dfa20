/* The front drops the caller's loader, libc and Python variables before it executes the Python program
 * or hands the call over: the interpreter would load an LD_PRELOAD library or search an LD_LIBRARY_PATH
 * as root before its own restart could drop them (nvc/system/loaderenv.py says why), and a program started
 * after that must not see them either. The names come from nvc/system/unsafe-environment.list, compiled in
 * (native/Makefile writes unsafe_env.h from it), so the front and the Python programs drop the same.
 *
 * The runtime nvc-py-runtime stands for is the one exception: the engine's environment is its own, not a
 * container's, and runc gets it whole from an engine without the wrapper. The front keeps the caller's
 * environment as it came for that exec, and hands the Python program what it needs to restore it as data
 * (RUNTIME_STASH) for its own exec of the runtime. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "environment.h"

extern char **environ;

static const char *const unsafe[] = {
#include "unsafe_env.h"
};

static char **original; /* the caller's environment, as it came */

int environment_entry_unsafe(const char *entry)
{
    size_t name = strcspn(entry, "=");
    for (size_t i = 0; i < sizeof unsafe / sizeof *unsafe; i++) {
        size_t n = strlen(unsafe[i]);
        if (unsafe[i][n - 1] == '*' ? name >= n - 1 && !strncmp(entry, unsafe[i], n - 1)
                                    : name == n && !strncmp(entry, unsafe[i], n))
            return 1;
    }
    return 0;
}

void environment_scrub(void)
{
    size_t count = 0;
    while (environ[count])
        count++;
    original = malloc((count + 1) * sizeof *original);
    if (!original) {
        perror("nvc-py: the environment");
        exit(1);
    }
    memcpy(original, environ, (count + 1) * sizeof *original);
    size_t kept = 0;
    for (size_t i = 0; environ[i]; i++)
        if (!environment_entry_unsafe(environ[i]))
            environ[kept++] = environ[i];
    environ[kept] = NULL;
}

char **environment_original(void)
{
    return original;
}

/* Whether the program must be told of this entry: one it runs without, or LC_CTYPE, which its interpreter
 * sets itself where the locale is C (PEP 538's coercion), so only the caller's may reach the runtime. */
static int stashed(const char *entry)
{
    return environment_entry_unsafe(entry) || !strncmp(entry, "LC_CTYPE=", 9);
}

void environment_stash_for_runtime(void)
{
    static const char hex[] = "0123456789abcdef";
    size_t size = sizeof RUNTIME_STASH + 1;
    for (size_t i = 0; original[i]; i++)
        if (stashed(original[i]))
            size += 2 * (strlen(original[i]) + 1);
    char *entry = malloc(size);
    if (!entry) {
        perror("nvc-py: the environment");
        exit(1);
    }
    char *out = entry + sprintf(entry, "%s=", RUNTIME_STASH);
    int first = 1;
    for (size_t i = 0; original[i]; i++) {
        if (!stashed(original[i]))
            continue;
        if (!first) { /* entries are NUL-separated before the hex */
            *out++ = '0';
            *out++ = '0';
        }
        first = 0;
        for (const unsigned char *c = (const unsigned char *)original[i]; *c; c++) {
            *out++ = hex[*c >> 4];
            *out++ = hex[*c & 15];
        }
    }
    *out = 0;
    putenv(entry); /* in place of any the caller set: only the front says what it dropped */
}
