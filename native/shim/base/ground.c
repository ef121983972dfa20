/* The ground of the shim: logging, the one-time failure (pass-through or fail-closed), the state
 * the wrappers ask for, the clock and the re-entrancy guard. It calls nothing of the other files. */
#define _GNU_SOURCE
#include "base/ground.h"
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

__thread int nvc_depth __attribute__((tls_model("initial-exec")));

static volatile enum nvc_state state = NVC_OFF;
static int log_level = 1;
static int fail_closed;
static int failed;

enum nvc_state nvc_current_state(void)
{
    return state;
}
void nvc_set_active(void)
{
    state = NVC_ACTIVE;
}
void nvc_set_log_level(int level)
{
    log_level = level;
}
int nvc_logs(int level)
{
    return level <= log_level;
}
void nvc_set_fail_closed(int closed)
{
    fail_closed = closed;
}

uint64_t nvc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void nvc_sleep_ns(int64_t ns)
{
    struct timespec ts = {.tv_sec = ns / 1000000000ll, .tv_nsec = ns % 1000000000ll};
    nanosleep(&ts, NULL);
}

void nvc_log(int level, const char *fmt, ...)
{
    if (level > log_level)
        return;
    char buf[512];
    int n = snprintf(buf, sizeof buf, "nvc-share[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, buf, (size_t)n); /* one write: lines do not interleave */
    (void)ignored;
}

void nvc_fail(const char *what)
{
    if (__atomic_exchange_n(&failed, 1, __ATOMIC_ACQ_REL))
        return;
    if (fail_closed) {
        nvc_log(0, "FAILED: %s; on_error=fail-closed: CUDA calls now fail", what);
        state = NVC_CLOSED;
    } else {
        nvc_log(0, "FAILED: %s; GPU sharing limits are NOT enforced in this process (pass-through)", what);
        state = NVC_OFF;
    }
}
