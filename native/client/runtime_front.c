/* nvc-py-runtime stands where an engine runs runc: containerd and dockerd call it several times for every
 * container (create, start, state, kill, delete), and all but a GPU container's create only hand their
 * arguments to the runtime. Starting Python for those costs tens of milliseconds each; the front execs the
 * runtime itself, with the same arguments, environment (the caller's whole: environment.c), descriptors and so
 * exit status, where it can tell the Python program would do just that:
 *
 * - the command is not create (--help or --version alone: the about text the program stored first), or it is create and the
 *   bundle's config.json is a JSON object none of whose bytes could ask for a GPU (no NVIDIA_VISIBLE_DEVICES,
 *   no CUDA_VERSION (a legacy image's default), no nvidia-container-devices volume, no \u escape that could
 *   spell one): nvc/plan/fromenv.py's gpu_request would find nothing in it;
 * - and the runtime cache (hook/oci/runtimecache.py) names the runtime: the program writes it after resolving
 *   the configuration's `runtimes`, keyed by the configuration file's identity, PATH and PATH's directories,
 *   and this front believes only root's own file in root's own /run/nvc-py, and a key equal to what it
 *   computes now. Any doubt (another user, no cache, an edited configuration, an unreadable bundle) runs the
 *   program, which gives the same result and today's errors.
 *
 * A create whose spec may ask for a GPU, the cache naming the runtime, is handed to a running hook server
 * (hook_client.c), whose worker rewrites the spec as the program would (hook/oci/runtime.py's served_create);
 * once it says 0 the front executes the runtime itself, in the caller's process as the program would have. No
 * server, or any answer but 0, is what it is without one: the program runs the call, or the worker's status
 * and lines are the call's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "environment.h"
#include "runcache.h"
#include "runtime_front.h"
#include "version.h"

#define CACHE_NAME "runtime-cache"
#define CACHE_MAGIC "nvc-py-runtime/2 " NVC_VERSION /* an upgrade's front believes no older program's */
#define MAX_SPEC (64ll << 20)                       /* as hook/oci/spec.py's MAX_SPEC_SIZE */

/* As hook/oci/runtime.py's _GLOBAL_VALUE_OPTIONS: global options whose value is the next word. */
static const char *const value_options[] = {"--root", "--log",      "--log-format",
                                            "--criu", "--rootless", "--cgroup-manager"};
/* Words whose presence sends a create to the program (see the file's comment). */
static const char *const gpu_words[] = {"NVIDIA_VISIBLE_DEVICES", "CUDA_VERSION", "nvidia-container-devices", "\\u"};

/* The key the cache must hold for this call (hook/oci/runtimecache.py's key()); 0 where there can be none. */
static int cache_key(struct text *key)
{
    const char *path = getenv("PATH");
    struct stat st;
    if (!path)
        return 0;
    text_add_str(key, CACHE_MAGIC);
    text_end_field(key);
    if (!text_add_config(key))
        return 0;
    text_add_str(key, path);
    text_end_field(key);
    for (const char *dir = path;; dir++) {
        size_t n = strcspn(dir, ":");
        char name[4096];
        if (n == 0 || dir[0] != '/' || n >= sizeof name)
            return 0; /* the working directory, or a relative one: which runtime depends on where we are */
        memcpy(name, dir, n);
        name[n] = '\0';
        if (dir != path)
            text_add_str(key, ";");
        if (stat(name, &st) == 0)
            text_add_identity(key, &st);
        else
            text_add_str(key, "-");
        dir += n;
        if (!*dir)
            break;
    }
    text_end_field(key);
    return !key->full;
}

/* The runtime the cache names for this call, or NULL; *about: what --help/--version print first. Only root's own
 * file in root's own directory. */
static const char *cached_runtime(const char **about)
{
    static struct text key;
    static char cache[MAX_CACHE + 1];
    size_t n;
    /* root's alone: no key (a stat of every PATH directory) for another caller, who would find no cache */
    const char *runtime = geteuid() == 0 && cache_key(&key) ? runcache_values(CACHE_NAME, &key, cache, &n) : NULL;
    if (!runtime)
        return NULL;
    /* two NUL-terminated fields: a path and a text */
    size_t runtime_len = strlen(runtime) + 1;
    if (runtime_len >= n)
        return NULL;
    *about = runtime + runtime_len;
    if (n != runtime_len + strlen(*about) + 1 || runtime[0] != '/' || access(runtime, X_OK) != 0)
        return NULL;
    return runtime;
}

/* All of text on stdout, or 0. */
static int write_all(const char *text)
{
    for (size_t left = strlen(text); left;) {
        ssize_t n = write(STDOUT_FILENO, text, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 0;
        text += n;
        left -= (size_t)n;
    }
    return 1;
}

static int is_value_option(const char *word)
{
    for (size_t i = 0; i < sizeof value_options / sizeof *value_options; i++)
        if (!strcmp(word, value_options[i]))
            return 1;
    return 0;
}

/* Whether bundle's config.json is a JSON object that cannot ask for a GPU; 0 for anything the program must
 * see (and say what is wrong with). */
static int spec_without_gpu(const char *bundle)
{
    char path[4096];
    struct stat st;
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", bundle) >= sizeof path)
        return 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char *spec = NULL;
    ssize_t got = 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && st.st_size <= MAX_SPEC &&
        (spec = malloc((size_t)st.st_size)) != NULL) {
        while (got < st.st_size) {
            ssize_t n = read(fd, spec + got, (size_t)(st.st_size - got));
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            got += n;
        }
    }
    close(fd);
    int without = spec && got == st.st_size;
    size_t start = 0;
    while (without && start < (size_t)got && strchr(" \t\r\n", spec[start]))
        start++;
    without = without && start < (size_t)got && spec[start] == '{';
    for (size_t i = 0; without && i < sizeof gpu_words / sizeof *gpu_words; i++)
        without = !memmem(spec, (size_t)got, gpu_words[i], strlen(gpu_words[i]));
    free(spec);
    return without;
}

/* What the Python program would do with these arguments (argv[1..]). */
enum call_kind {
    CALL_PROGRAM,      /* something of its own: --help or --version among others, no command */
    CALL_ABOUT,        /* --help or --version alone: say what nvc-py-runtime is, then execute the runtime */
    CALL_PASS_THROUGH, /* only execute the runtime */
    CALL_CREATE,       /* a create whose spec may ask for a GPU: rewrite it, then execute the runtime */
};

static int is_about_option(const char *word)
{
    return !strcmp(word, "--help") || !strcmp(word, "-h") || !strcmp(word, "--version") || !strcmp(word, "-v");
}

static enum call_kind call_kind(int argc, char **argv)
{
    if (argc == 2 && is_about_option(argv[1]))
        return CALL_ABOUT; /* as hook/oci/runtime.py's _ABOUT_OPTIONS */
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (is_about_option(argv[i]))
            return CALL_PROGRAM; /* the program says what it is first */
        if (!strchr(argv[i], '=') && is_value_option(argv[i]) && i + 1 < argc)
            i++;
    }
    if (i >= argc)
        return CALL_PROGRAM;
    if (strcmp(argv[i], "create"))
        return CALL_PASS_THROUGH;
    const char *bundle = ".";
    for (int j = i + 1; j < argc; j++) {
        if ((!strcmp(argv[j], "--bundle") || !strcmp(argv[j], "-b")) && j + 1 < argc)
            bundle = argv[j + 1];
        else if (!strncmp(argv[j], "--bundle=", 9))
            bundle = argv[j] + 9;
    }
    return spec_without_gpu(bundle) ? CALL_PASS_THROUGH : CALL_CREATE;
}

const char *runtime_pass_through(int argc, char **argv)
{
    enum call_kind kind = call_kind(argc, argv);
    const char *about = NULL;
    const char *runtime = kind == CALL_PROGRAM ? NULL : cached_runtime(&about);
    if (!runtime || kind == CALL_CREATE)
        return runtime;
    if (kind == CALL_ABOUT && !write_all(about))
        return NULL; /* the program says what is wrong with stdout */
    argv[0] = (char *)runtime;
    execve(runtime, argv, environment_original()); /* on failure the program runs, and says what is wrong */
    return NULL;
}
