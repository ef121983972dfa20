/* The front drops the caller's loader, libc and Python variables before it executes the Python program
 * or hands the call over: the interpreter would load an LD_PRELOAD library or search an LD_LIBRARY_PATH
 * as root before its own restart could drop them (nvc/system/loaderenv.py says why), and a program started
 * after that must not see them either. The names come from nvc/system/unsafe-environment.list, compiled in
 * (native/Makefile writes unsafe_env.h from it), so the front and the Python programs drop the same. */
#include <stdlib.h>
#include <string.h>

#include "environment.h"

extern char **environ;

static const char *const unsafe[] = {
#include "unsafe_env.h"
};

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
    size_t kept = 0;
    for (size_t i = 0; environ[i]; i++)
        if (!environment_entry_unsafe(environ[i]))
            environ[kept++] = environ[i];
    environ[kept] = NULL;
}
