/* The ground of the shim (ground.c): logging, the one-time failure and the state it leaves, the
 * clock (and sleeping), the re-entrancy guard and the fork phases. Every other file may use it; it uses none of
 * them, so it includes nothing of the shim's own. */
#ifndef NVC_GROUND_H
#define NVC_GROUND_H

#include <stdint.h>

enum nvc_state { NVC_OFF = 0, NVC_ACTIVE = 1, NVC_CLOSED = 2 };
enum nvc_state nvc_current_state(void);
void nvc_set_active(void);            /* init.c, once the limits are in force */
void nvc_set_log_level(int level);    /* 0..3: errors, warnings (default), info, debug */
void nvc_set_fail_closed(int closed); /* what nvc_fail does: the limits' on_error */
void nvc_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int nvc_logs(int level);         /* whether nvc_log at that level writes: what only a log needs is skipped otherwise */
void nvc_fail(const char *what); /* loud one-time failure line; switches to on_error mode */
uint64_t nvc_now_ns(void);       /* CLOCK_MONOTONIC */
void nvc_sleep_ns(int64_t ns);

/* Re-entrancy guard: a driver that calls its own exported entry points must not be charged twice. */
extern __thread int nvc_depth __attribute__((tls_model("initial-exec")));

/* Fork handling, one hook per file with a mutex (shim.c calls them in a fixed lock order): phase 0 =
 * prepare (lock), 1 = parent (unlock), 2 = child (unlock and forget what belongs to the parent). */
enum nvc_fork_phase { NVC_FORK_PREPARE = 0, NVC_FORK_PARENT = 1, NVC_FORK_CHILD = 2 };

#endif
