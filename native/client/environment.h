/* The variables no root program of nvc-py lets its caller choose (nvc/system/unsafe-environment.list). */
#ifndef NVC_CLIENT_ENVIRONMENT_H
#define NVC_CLIENT_ENVIRONMENT_H

/* Whether the environment entry NAME=VALUE (or a bare NAME) is one of the list's. */
int environment_entry_unsafe(const char *entry);

/* Drops every unsafe entry from this process's environment, before anything is executed or sent. */
void environment_scrub(void);

#endif
