/* The native driver helper of an `nvc-py info` that no server answers, started as the front executes the
 * Python program (driver_start.c). */
#ifndef NVC_CLIENT_DRIVER_START_H
#define NVC_CLIENT_DRIVER_START_H

/* As nvc/rpc/native_snapshot.py's ENV: "FD PID UID GID ROOT" of the helper started. */
#define DRIVER_SNAPSHOT_ENV "NVC_PY_DRIVER_SNAPSHOT"

/* Where base is nvc-py and argv is `nvc-py [--root ROOT] [--ldcache PATH] info [OPTION...]`: starts
 * PROGRAM_DIR/nvc-py-driver-snapshot for ROOT (default: the configuration's, as recorded for root, else /) and
 * the configuration's identity (as recorded, else the default), its answer on a pipe this process's program
 * inherits, and names it in DRIVER_SNAPSHOT_ENV. Anything else, or any failure on the way,
 * starts nothing: the program then starts its own helper. */
void driver_start(const char *base, char **argv);

#endif
