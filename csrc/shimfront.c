/*
 * shimfront: the compiled front of nvhook's runtime shim (installed as .venv/bin/nvhook-runtime).
 *
 * Engines call their runtime for every step of every container (create, start, state,
 * kill, delete, ... several times each), and only `create` needs the shim's work: its
 * spec rewrite (libinject/runtime/shim.py). Starting Python for the rest costs ~70-100 ms
 * a call; this front execs the low-level runtime directly instead, with the arguments
 * unchanged, and execs Python (`nvhook runtime ARGS`) only for the `create` of a
 * container that may want a GPU (csrc/gpuscan.h, the hook front's filter: in every mode
 * the shim leaves such a spec as it is but for legacy mode's prestart hook, which would
 * find nothing to do in it) or when it cannot decide alone:
 * - the low-level runtime is the first of NVIDIA's default list (docker-runc, runc, crun)
 *   found on PATH, never this program (as libinject.runtime.shim.find_runtime); a
 *   config.toml that sets `runtimes` or `log-level`, or runc's --debug (both may ask
 *   for the debug line Python logs for each call), goes to Python;
 * - the config is found as Python finds it: $NVHOOK_CONFIG, else
 *   ${XDG_CONFIG_HOME:-/etc}/nvidia-container-runtime/config.toml (the shim's
 *   environment is the engine's own, not a container's).
 * Built static where possible; logic stays in Python.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpuscan.h"
#include "pyexec.h"


#define SAFE_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define MAX_CONF (1 << 20)

extern char **environ;

/* runc/crun global options that take a value (libinject/runtime/shim.py _GLOBAL_VALUED) */
static const char *const VALUED[] = {"--log", "--log-format", "--root", "--criu", "--rootless",
                                     "--cgroup-manager", NULL};
static const char *const RUNTIMES[] = {"docker-runc", "runc", "crun", NULL};
/* config keys that change what a pass-through does: Python handles those */
static const char *const CONF_KEYS[] = {"runtimes", "log-level", NULL};
/* and for `create`, those that widen what can ask for a GPU */
static const char *const CREATE_KEYS[] = {"runtimes", "log-level", WIDENING_KEYS, NULL};
static const char *const PY_MAIN =
    "import sys; sys.path[:0] = [p for p in sys.argv.pop(1).split(':') if p]; "
    "from nvhook.cli import main; sys.exit(main(['runtime', *sys.argv[1:]]))";

/* "--log=x" -> "--log"; "-log" (Go flag style) -> "--log", in buf */
static const char *flag_name(const char *a, char *buf, size_t size)
{
    const char *eq = strchr(a, '=');
    size_t n = eq ? (size_t)(eq - a) : strlen(a);
    int go = a[0] == '-' && a[1] != '-' && n > 2;
    if (n + 2 > size)
        return "";
    size_t off = 0;
    if (go)
        buf[off++] = '-';
    memcpy(buf + off, a, n);
    buf[off + n] = '\0';
    return buf;
}

/* The runc command (first non-option), as libinject.runtime.shim.parse_args finds it;
 * *at: its index. */
static const char *command(int argc, char **argv, int *debug, int *at)
{
    char name[256];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            *at = i;
            return a;
        }
        const char *f = flag_name(a, name, sizeof name);
        if (strcmp(f, "--debug") == 0)
            *debug = 1;
        int valued = 0;
        for (const char *const *v = VALUED; *v; v++)
            if (strcmp(f, *v) == 0)
                valued = 1;
        if (valued && !strchr(a, '='))
            i++;
    }
    return NULL;
}

static void exec_python(int argc, char **argv)
{
    exec_venv_python(PY_MAIN, argc, argv, environ, 127);
}

/* Does the config set a key from keys (outside comments)? Unreadable or odd: yes. */
static int config_needs_python(const char *const *keys)
{
    char buf[PATH_MAX];
    const char *path = getenv("NVHOOK_CONFIG");
    int required = path && *path;
    if (!required) {
        const char *xdg = getenv("XDG_CONFIG_HOME");
        snprintf(buf, sizeof buf, "%s/nvidia-container-runtime/config.toml", xdg && *xdg ? xdg : "/etc");
        path = buf;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return required || errno != ENOENT;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > MAX_CONF) {
        close(fd);
        return 1;
    }
    char *text = malloc((size_t)st.st_size + 1);
    ssize_t n = text ? read(fd, text, (size_t)st.st_size) : -1;
    close(fd);
    if (n < 0) {
        free(text);
        return 1;
    }
    text[n] = '\0';
    int hit = conf_names_key(text, keys);
    free(text);
    return hit;
}

/* The first of RUNTIMES on PATH that is not this program, in buf; NULL if none. */
static const char *find_runtime(char *buf, size_t size)
{
    struct stat self;
    if (stat("/proc/self/exe", &self) < 0)
        return NULL;
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = SAFE_PATH;
    for (const char *const *r = RUNTIMES; *r; r++) {
        for (const char *d = path; d;) {
            const char *colon = strchr(d, ':');
            size_t len = colon ? (size_t)(colon - d) : strlen(d);
            if (len && d[0] == '/' && len + strlen(*r) + 2 <= size) { /* absolute entries only */
                memcpy(buf, d, len);
                buf[len] = '/';
                strcpy(buf + len + 1, *r);
                struct stat st;
                /* never ourselves (a symlink or hard link to us), by inode */
                if (stat(buf, &st) == 0 && S_ISREG(st.st_mode) && access(buf, X_OK) == 0 &&
                    !(st.st_dev == self.st_dev && st.st_ino == self.st_ino))
                    return buf;
            }
            d = colon ? colon + 1 : NULL;
        }
    }
    return NULL;
}

/* runc create's options that take a value (libinject/runtime/shim.py _CREATE_VALUED) */
static const char *const CREATE_VALUED[] = {"--bundle", "--console-socket", "--pid-file",
                                            "--preserve-fds", NULL};

/* `create`'s bundle directory, parsed as runc's flag package does (-x, --x, -x=v, --x=v;
 * "-b" and "--b" are --bundle; the values of valued options skipped; "--" ends options),
 * as an fd; default the cwd; -1 if anything is odd (Python sorts it out). */
static int create_bundle(int argc, char **argv, int at)
{
    const char *bundle = ".";
    char name[256];
    for (int i = at + 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0 || a[0] != '-')
            break;              /* the container id: options end there */
        const char *f = flag_name(a, name, sizeof name);
        if (strcmp(f, "-b") == 0 || strcmp(f, "--b") == 0)
            f = "--bundle";
        const char *eq = strchr(a, '=');
        int valued = 0;
        for (const char *const *v = CREATE_VALUED; *v; v++)
            if (strcmp(f, *v) == 0)
                valued = 1;
        if (!valued)
            continue;
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v)
            return -1;
        if (strcmp(f, "--bundle") == 0) {
            if (!*v)
                return -1;
            bundle = v;
        }
    }
    return open(bundle, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

int main(int argc, char **argv)
{
    int debug = 0, at = 0;
    const char *cmd = command(argc, argv, &debug, &at);
    if (!cmd || debug)
        exec_python(argc, argv);
    if (strcmp(cmd, "create") == 0) {
        /* A container that cannot want a GPU is created as runc would: no Python. */
        int bfd = config_needs_python(CREATE_KEYS) ? -1 : create_bundle(argc, argv, at);
        if (bfd < 0 || bundle_may_want_gpu(bfd))
            exec_python(argc, argv);
        close(bfd);
    } else if (config_needs_python(CONF_KEYS)) {
        exec_python(argc, argv);
    }
    static char runtime[PATH_MAX];
    if (!find_runtime(runtime, sizeof runtime))
        exec_python(argc, argv); /* Python says which were tried */
    argv[0] = runtime;
    execv(runtime, argv);
    exec_python(argc, argv);
    return 127;
}
