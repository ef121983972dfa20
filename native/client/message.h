/* The call's message (message.c): what the client sends the hook server first. */
#ifndef NVC_CLIENT_MESSAGE_H
#define NVC_CLIENT_MESSAGE_H

#include <stddef.h>

#define MAX_MESSAGE (64 * 1024) /* the server reads no more */

/* The message for argv (argc strings) and this process's environment, its connect stamp last (zeros until
 * message_stamp() writes it; one the caller inherited is left out), into buf (MAX_MESSAGE bytes); 0 when
 * it would not fit. */
int message_build(char *buf, size_t *len, int argc, char **argv);

/* Writes the connect stamp (now) into the message message_build made. */
void message_stamp(char *buf, size_t len);

#endif
