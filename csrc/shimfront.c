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
 * A `create` that is the shim's work goes first to `nvhook serve` on the config's
 * [nvhook] socket (csrc/serveclient.h, the hook front's client; a config spelling the
 * socket in a way config_socket() does not follow: no service): the front sends its
 * argv, cwd, the config path it found, its PATH, umask and own path; a worker rewrites
 * the bundle with the exec'd shim's code (libinject/runtime/serve/shim.py) and names
 * the runtime, which the front execs with its argv unchanged. No service, or one that
 * does not take it: Python, exec'd, as before; once taken, the service's status is final.
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
#include "serveclient.h"


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

#define FALLBACK_ENV "NVHOOK_SERVE_FALLBACK"  /* as libinject.runtime.serve.fallback.ENV */

static void exec_python(int argc, char **argv)
{
    exec_venv_python(PY_MAIN, argc, argv, environ, 127);
}

/* The config as the Python shim finds it ($NVHOOK_CONFIG, which must exist, else
 * ${XDG_CONFIG_HOME:-/etc}/nvidia-container-runtime/config.toml, defaults if absent),
 * read once. */
static struct {
    char path[PATH_MAX];
    int required;
    int odd;        /* unreadable, not a regular file, too large, a required one missing */
    char *text;     /* NULL: absent (NVIDIA's defaults) or odd */
} g_conf;

static void load_config(void)
{
    const char *env = getenv("NVHOOK_CONFIG");
    g_conf.required = env && *env;
    if (g_conf.required) {
        if (snprintf(g_conf.path, sizeof g_conf.path, "%s", env) >= (int)sizeof g_conf.path) {
            g_conf.odd = 1;
            return;
        }
    } else {
        const char *xdg = getenv("XDG_CONFIG_HOME");
        if (snprintf(g_conf.path, sizeof g_conf.path, "%s/nvidia-container-runtime/config.toml",
                     xdg && *xdg ? xdg : "/etc") >= (int)sizeof g_conf.path) {
            g_conf.odd = 1;
            return;
        }
    }
    int fd = open(g_conf.path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        g_conf.odd = g_conf.required || errno != ENOENT;
        return;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > MAX_CONF) {
        close(fd);
        g_conf.odd = 1;
        return;
    }
    char *text = malloc((size_t)st.st_size + 1);
    ssize_t n = text ? read(fd, text, (size_t)st.st_size) : -1;
    close(fd);
    if (n < 0) {
        free(text);
        g_conf.odd = 1;
        return;
    }
    text[n] = '\0';
    g_conf.text = text;
}

/* Does the config set a key from keys (outside comments)? Unreadable or odd: yes. */
static int config_needs_python(const char *const *keys)
{
    if (g_conf.odd)
        return 1;
    if (!g_conf.text)
        return 0;
    char *copy = strdup(g_conf.text);
    int hit = !copy || conf_names_key(copy, keys);
    free(copy);
    return hit;
}

/* The service's socket as the config sets it ([nvhook] socket, relative to the config's
 * directory as libinject.config takes it; not set: NVHOOK_SOCKET_DEFAULT), in out; 0
 * when the text says it in a way this scan does not follow (dotted keys, inline
 * tables, escapes, multi-line strings, "socket" elsewhere): then no service is asked
 * (Python's shim does the create, exec'd). */
static int config_socket(char *out, size_t size)
{
    snprintf(out, size, "%s", NVHOOK_SOCKET_DEFAULT);
    if (g_conf.odd)
        return 0;
    if (!g_conf.text)
        return 1;
    const char *text = g_conf.text;
    if (strstr(text, "\"\"\"") || strstr(text, "'''"))
        return 0;       /* a [table] line may sit inside a multi-line string */
    int in_nvhook = 0, found = 0;
    char value[PATH_MAX];
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        const char *p = line + strspn(line, " \t");
        const char *stop = line + len;
        int has = memmem(line, len, "socket", 6) != NULL;
        if (p < stop && *p == '[') {
            /* "[nvhook]" (spaces allowed), then only a comment */
            const char *q = p + 1;
            q += strspn(q, " \t");
            in_nvhook = 0;
            if (strncmp(q, "nvhook", 6) == 0) {
                q += 6;
                q += strspn(q, " \t");
                if (*q == ']') {
                    q++;
                    q += strspn(q, " \t");
                    in_nvhook = q >= stop || *q == '#' || *q == '\r';
                }
            }
            if (has)
                return 0;
        } else if (p < stop && *p != '#' && has) {
            /* socket = "VALUE" [# comment], in [nvhook], once */
            if (!in_nvhook || found || strncmp(p, "socket", 6) != 0)
                return 0;
            const char *q = p + 6;
            q += strspn(q, " \t");
            if (*q++ != '=')
                return 0;
            q += strspn(q, " \t");
            if (*q++ != '"')
                return 0;
            const char *close_q = q;
            while (close_q < stop && *close_q != '"' && *close_q != '\\')
                close_q++;
            if (close_q >= stop || *close_q != '"' || close_q == q ||
                (size_t)(close_q - q) >= sizeof value)
                return 0;
            memcpy(value, q, (size_t)(close_q - q));
            value[close_q - q] = '\0';
            q = close_q + 1;
            q += strspn(q, " \t\r");
            if (q < stop && *q != '#')
                return 0;
            found = 1;
        }
        line = end ? end + 1 : line + len;
    }
    if (!found)
        return 1;
    if (value[0] == '/') {
        snprintf(out, size, "%s", value);
        return 1;
    }
    const char *slash = strrchr(g_conf.path, '/');
    int dir = slash ? (int)(slash - g_conf.path) : 1;
    return snprintf(out, size, "%.*s/%s", dir ? dir : 1, slash ? g_conf.path : ".", value) < (int)size;
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

/* The service's create (libinject/runtime/serve/shim.py): the worker rewrites the
 * bundle exactly as `nvhook runtime` would here (same code, same config, our PATH, cwd
 * and umask) and says which runtime to run; we exec it with our argv unchanged, as for
 * the pass-through commands. Returns if the service is not there or does not take it
 * (the caller then execs Python); once it has, never returns. */
static void try_serve_create(int argc, char **argv)
{
    static char sock[PATH_MAX];
    if (!config_socket(sock, sizeof sock))
        return;
    static char req[MAX_REQUEST];
    static char cwd[PATH_MAX], self[PATH_MAX], mask[16];
    size_t len = 0;
    memcpy(req, "NVSHIM1", 8);
    len = 8;
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (!getcwd(cwd, sizeof cwd) || k <= 0)
        return;
    self[k] = '\0';
    mode_t um = umask(022);
    umask(um);
    snprintf(mask, sizeof mask, "%o", (unsigned)um);
    const char *path = getenv("PATH");
    for (int i = 0; i < argc; i++)
        if (!put_item(req, &len, 'a', argv[i], NULL))
            return;
    if (!put_item(req, &len, 'c', cwd, NULL) ||
        !put_item(req, &len, g_conf.required ? 'F' : 'f', g_conf.path, NULL) ||
        (path && !put_item(req, &len, 'p', path, NULL)) || !put_item(req, &len, 'x', self, NULL) ||
        !put_item(req, &len, 'u', mask, NULL))
        return;

    static char reply[MAX_REPLY + 1];
    ssize_t n = 0;
    int status = 0;
    int got = serve_call(sock, req, len, -1, reply, MAX_REPLY, &n, &status);
    if (got == SERVE_NOT_TAKEN) {
        serve_fallback_note(sock);
        /* The exec'd shim logs why (a word of serve_call's own) and drops it from the
         * environment the runtime gets. */
        if (serve_fallback)
            setenv(FALLBACK_ENV, serve_fallback, 1);
        return;
    }
    if (got == SERVE_LOST) {
        dprintf(2, "nvhook: hook service: no answer while rewriting the bundle\n");
        _exit(1);
    }
    reply[n] = '\0';
    char *text = reply + 5;
    if (status != 0) {          /* the shim's one line, as the exec'd shim would print it */
        write_err(text, (size_t)(n - 5));
        _exit(served_exit(status, "rewriting the bundle"));
    }
    /* Status 0: "RUNTIME\0" then anything the shim wrote to stderr. */
    char *nul = memchr(text, '\0', (size_t)(n - 5));
    if (!nul || text[0] != '/') {
        dprintf(2, "nvhook: hook service: no runtime in its answer\n");
        _exit(1);
    }
    write_err(nul + 1, (size_t)(reply + n - nul - 1));
    struct stat a, b;
    if (stat(text, &a) == 0 && stat("/proc/self/exe", &b) == 0 && a.st_dev == b.st_dev &&
        a.st_ino == b.st_ino) {
        dprintf(2, "nvhook: the runtime found, %s, is this shim\n", text);
        _exit(1);
    }
    argv[0] = text;
    execv(text, argv);
    dprintf(2, "nvhook: cannot run %s: %s\n", text, strerror(errno));
    _exit(1);
}

int main(int argc, char **argv)
{
    unsetenv(FALLBACK_ENV);     /* only ever ours (try_serve_create) */
    int debug = 0, at = 0;
    const char *cmd = command(argc, argv, &debug, &at);
    load_config();
    if (cmd && strcmp(cmd, "create") == 0) {
        /* A container that cannot want a GPU is created as runc would: no Python, no
         * service. Every other create (a GPU, --debug, a config naming runtimes or a log
         * level, anything undecided) is the shim's work: the service's if it takes it,
         * else Python's, exec'd. */
        int bfd = debug || config_needs_python(CREATE_KEYS) ? -1 : create_bundle(argc, argv, at);
        if (bfd < 0 || bundle_may_want_gpu(bfd)) {
            try_serve_create(argc, argv);
            exec_python(argc, argv);
        }
        close(bfd);
    } else if (!cmd || debug || config_needs_python(CONF_KEYS)) {
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
