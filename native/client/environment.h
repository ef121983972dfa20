/* The variables no root program of nvc-py lets its caller choose (nvc/system/unsafe-environment.list). */
#ifndef NVC_CLIENT_ENVIRONMENT_H
#define NVC_CLIENT_ENVIRONMENT_H

/* As nvc/system/loaderenv.py's RUNTIME_STASH: the dropped entries, for the runtime the wrapper executes. */
#define RUNTIME_STASH "NVC_PY_RUNTIME_CALLER_ENVIRONMENT"

/* Whether the environment entry NAME=VALUE (or a bare NAME) is one of the list's. */
int environment_entry_unsafe(const char *entry);

/* Drops every unsafe entry from this process's environment, before anything is executed or sent; the
 * environment as it came stays for environment_original(). */
void environment_scrub(void);

/* The caller's environment as it came: what the wrapper's runtime is executed with. */
char **environment_original(void);

/* Sets RUNTIME_STASH to what the Python wrapper restores for the runtime alone: the dropped entries and the
 * caller's LC_CTYPE (hex of NAME=VALUE, NUL-separated; empty where there are none). */
void environment_stash_for_runtime(void);

#endif
