/* The rule for the hook server's socket directory, shared by the client (before it sends anything to a socket
 * there) and the on-demand start (before it creates or opens anything there): whoever else could write there
 * could answer root's calls, or plant the start's lock and log. As hook/server/handover.py's not_roots. */
#ifndef NVC_SOCKET_DIR_H
#define NVC_SOCKET_DIR_H

#include <sys/stat.h>

#define SOCKET_DIR_PROBLEM "its directory is not root's, or others can write there"

/* Whether st (not followed through a symlink: lstat, or fstat of an O_NOFOLLOW open) is a directory of root's
 * that group and others cannot write. */
static inline int socket_dir_is_roots(const struct stat *st)
{
    return S_ISDIR(st->st_mode) && st->st_uid == 0 && !(st->st_mode & 022);
}

#endif
