/*
 * hookfront: the compiled front of the nvhook OCI hook (installed as .venv/bin/nvhook-hook).
 *
 * Most containers on a node want no GPU, and Python's start-up alone (~15 ms) is more
 * than NVIDIA's Go hook adds. This front decides before Python starts, with no JSON
 * logic: it reads the state on stdin, finds the bundle's config.json and looks for the
 * strings a GPU request needs (NVIDIA_VISIBLE_DEVICES, CUDA_VERSION, the device-list
 * mount root, CDI annotations). No string: exit 0. Any possible hit, or anything it does
 * not understand: exec `<venv python> -I -c <nvhook main> ARGS...` with the state on
 * stdin (a memfd), an explicit minimal environment and cwd "/"; Python decides.
 *
 * The filter only ever sends more containers to Python, never fewer:
 * - a config.toml that sets swarm-resource or annotation-prefixes (other variables /
 *   prefixes can ask for GPUs) sends everything to Python;
 * - the one string it skips is an env entry spelled exactly "NVIDIA_VISIBLE_DEVICES=void"
 *   or "NVIDIA_VISIBLE_DEVICES=" (not a GPU container; any other entry still counts).
 *   A config.json spelling a trigger with \u escapes goes unseen: that only denies the
 *   container GPUs, it never grants anything.
 *
 * A GPU container goes first to `nvhook serve` if one listens on $NVHOOK_SOCKET (from
 * the hook's env, the runtime's trusted hook entry; default NVHOOK_SOCKET_DEFAULT; "none"
 * turns it off): the front sends its argv, the two env entries Python would honour and
 * fds (state memfd, stdout, stderr, cwd, root), then exits with the status the server
 * sends (protocol: libinject/runtime/service.py). No server, or one that does not take the
 * request: exec Python as before. Once the server has taken it ("A"), there is no
 * falling back (the container may be partly configured): its status is final.
 *
 * Built static where possible, so the dynamic loader (and an LD_PRELOAD in the hook's
 * environment) never runs. Logic stays in Python; this file only filters, forwards and
 * execs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef NVHOOK_PYTHON
#define NVHOOK_PYTHON "/usr/bin/python3"
#endif

#ifndef NVHOOK_SOCKET_DEFAULT
#define NVHOOK_SOCKET_DEFAULT "/run/nvhook/hook.sock"   /* as [nvhook] socket's default */
#endif

#define MAX_STATE (1 << 20)     /* as libinject.request.oci_state.MAX_STATE_BYTES */
#define MAX_REQUEST (64 << 10)  /* as libinject.runtime.service.MAX_REQUEST */
#define SERVE_WAIT_S 5          /* a wedged server costs a container this, then we exec */
#define MAX_SPEC (16 << 20)     /* as libinject.request.oci_state.MAX_CONFIG_BYTES */
#define MAX_CONF (1 << 20)

static const char *const TRIGGERS[] = {
    "NVIDIA_VISIBLE_DEVICES", "CUDA_VERSION", "nvidia-container-devices", "cdi.k8s.io/", NULL,
};
/* config.toml keys that widen what can ask for a GPU beyond TRIGGERS */
static const char *const CONF_KEYS[] = {"swarm-resource", "annotation-prefixes", NULL};
/* global options of nvhook that take a value (libinject/runtime/hook.py GLOBAL_VALUED) */
static const char *const VALUED[] = {"--root", "--ldcache", "--user", "--debug", "--config", NULL};
/* Python runs with -I -S: no site module, so none of site-packages' .pth files (~20 ms of
 * start-up); the import path is the one `make venv` baked in (the package's and the
 * venv's site-packages), passed as the first argument. */
static const char *const PY_MAIN =
    "import sys; sys.path[:0] = [p for p in sys.argv.pop(1).split(':') if p]; "
    "from nvhook.cli import main; sys.exit(main())";
#ifndef NVHOOK_PYPATH
#define NVHOOK_PYPATH ""
#endif

static char *const *g_argv;
static int g_argc;
static char g_cwd[PATH_MAX];
static char *g_state;
static size_t g_state_len;

/* Read fd to EOF, at most max+1 bytes (so the caller can tell "too big"). */
static char *read_all(int fd, size_t max, size_t *len)
{
    size_t cap = 8192, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf)
        return NULL;
    for (;;) {
        if (n == cap) {
            if (cap > max)
                break;
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            free(buf);
            return NULL;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int is_one_of(const char *s, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(s, *list) == 0)
            return 1;
    return 0;
}

/* The value of --config (or --config=), else NULL. */
static const char *opt_config(void)
{
    for (int i = 1; i < g_argc; i++) {
        if (strcmp(g_argv[i], "--config") == 0 && i + 1 < g_argc)
            return g_argv[i + 1];
        if (strncmp(g_argv[i], "--config=", 9) == 0)
            return g_argv[i] + 9;
    }
    return NULL;
}

/* The command (first positional argument), as nvhook/cli.py finds it. */
static const char *command(void)
{
    for (int i = 1; i < g_argc; i++) {
        if (is_one_of(g_argv[i], VALUED)) {
            i++;
            continue;
        }
        if (g_argv[i][0] == '-')
            continue;
        return g_argv[i];
    }
    return NULL;
}

static void die(const char *what)
{
    dprintf(2, "nvhook: %s: %s\n", what, strerror(errno));
    _exit(1);
}

/* The state in a memfd (offset 0), or -1. */
static int state_memfd(void)
{
    int fd = (int)syscall(SYS_memfd_create, "nvhook-state", 1 /* MFD_CLOEXEC */);
    if (fd < 0)
        return -1;
    size_t off = 0;
    while (off < g_state_len) {
        ssize_t w = write(fd, g_state + off, g_state_len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            close(fd);
            return -1;
        }
        off += (size_t)w;
    }
    if (lseek(fd, 0, SEEK_SET) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Hand over to Python: state on fd 0, cwd "/", explicit environment. Never returns. */
static void exec_python(void)
{
    if (g_state) {
        int fd = state_memfd();
        if (fd < 0)
            die("state memfd");
        if (dup2(fd, 0) < 0)
            die("state fd");
        close(fd);
    }
    if (chdir("/") < 0)
        die("chdir /");

    static char cwd_env[PATH_MAX + 32], config_env[PATH_MAX + 32], xdg_env[PATH_MAX + 32];
    char *envp[8];
    int ne = 0;
    envp[ne++] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    if (g_cwd[0]) {
        snprintf(cwd_env, sizeof cwd_env, "NVHOOK_HOOK_CWD=%s", g_cwd);
        envp[ne++] = cwd_env;
    }
    /* The hook's own env comes from the runtime's hook entry (trusted): keep only how
     * to find the config. The container's env is never ours (it is in config.json). */
    const char *v;
    if ((v = getenv("NVHOOK_CONFIG")) && strlen(v) < PATH_MAX) {
        snprintf(config_env, sizeof config_env, "NVHOOK_CONFIG=%s", v);
        envp[ne++] = config_env;
    }
    if ((v = getenv("XDG_CONFIG_HOME")) && strlen(v) < PATH_MAX) {
        snprintf(xdg_env, sizeof xdg_env, "XDG_CONFIG_HOME=%s", v);
        envp[ne++] = xdg_env;
    }
    envp[ne] = NULL;

    const char *python = NVHOOK_PYTHON;
    static char beside[PATH_MAX];
    if (access(python, X_OK) != 0) {
        /* Not where it was built: try the python next to us (a moved venv). */
        ssize_t n = readlink("/proc/self/exe", beside, sizeof beside - 8);
        if (n > 0) {
            beside[n] = '\0';
            char *slash = strrchr(beside, '/');
            if (slash) {
                strcpy(slash + 1, "python");
                python = beside;
            }
        }
    }
    char **av = calloc((size_t)g_argc + 6, sizeof *av);
    if (!av)
        die("calloc");
    int na = 0;
    av[na++] = (char *)python;
    av[na++] = "-I";
    if (*NVHOOK_PYPATH)
        av[na++] = "-S";
    av[na++] = "-c";
    av[na++] = (char *)PY_MAIN;
    av[na++] = NVHOOK_PYPATH;
    for (int i = 1; i < g_argc; i++)
        av[na++] = g_argv[i];
    av[na] = NULL;
    execve(python, av, envp);
    dprintf(2, "nvhook: cannot run %s: %s\n", python, strerror(errno));
    _exit(1);
}

/* Append a protocol item (kind + NUL-terminated value) to buf; 0 if it does not fit. */
static int put_item(char *buf, size_t *len, char kind, const char *a, const char *b)
{
    size_t la = strlen(a), lb = b ? strlen(b) + 1 : 0;
    if (*len + 1 + la + lb + 1 > MAX_REQUEST)
        return 0;
    buf[(*len)++] = kind;
    memcpy(buf + *len, a, la);
    *len += la;
    if (b) {
        buf[(*len)++] = '=';
        memcpy(buf + *len, b, lb - 1);
        *len += lb - 1;
    }
    buf[(*len)++] = '\0';
    return 1;
}

/* Hand the request to `nvhook serve`. Returns if it is not there or does not take it
 * (the caller then execs Python); once it has taken it, exits with its status. */
static void try_serve(void)
{
    const char *path = getenv("NVHOOK_SOCKET");
    if (!path || !*path)
        path = NVHOOK_SOCKET_DEFAULT;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strcmp(path, "none") == 0 || strlen(path) >= sizeof addr.sun_path || !g_state)
        return;
    strcpy(addr.sun_path, path);

    static char req[MAX_REQUEST];
    size_t len = 0;
    memcpy(req, "NVHOOK1", 8);
    len = 8;
    for (int i = 0; i < g_argc; i++)
        if (!put_item(req, &len, 'a', g_argv[i], NULL))
            return;
    static const char *const env_names[] = {"NVHOOK_CONFIG", "XDG_CONFIG_HOME", NULL};
    for (const char *const *n = env_names; *n; n++) {
        const char *v = getenv(*n);
        if (v && !put_item(req, &len, 'e', *n, v))
            return;
    }

    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0)
        return;
    /* Until the server has taken the request, waiting is bounded (connect on a full
     * backlog honours SO_SNDTIMEO); afterwards its status is all that counts. */
    struct timeval tv = {.tv_sec = SERVE_WAIT_S};
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(s, (struct sockaddr *)&addr, sizeof addr) < 0) {
        close(s); /* ENOENT, ECONNREFUSED, EACCES...: no service for us */
        return;
    }
    int fds[5] = {state_memfd(), 1, 2, open(".", O_PATH | O_DIRECTORY | O_CLOEXEC),
                  open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)};
    int ok = fds[0] >= 0 && fds[3] >= 0 && fds[4] >= 0;
    if (ok) {
        union {
            char buf[CMSG_SPACE(sizeof fds)];
            struct cmsghdr align;
        } ctl;
        memset(&ctl, 0, sizeof ctl);
        struct iovec iov = {.iov_base = req, .iov_len = len};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                             .msg_controllen = sizeof ctl.buf};
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof fds);
        memcpy(CMSG_DATA(c), fds, sizeof fds);
        ssize_t w;
        do
            w = sendmsg(s, &msg, MSG_NOSIGNAL);
        while (w < 0 && errno == EINTR);
        ok = w == (ssize_t)len;
    }
    for (int i = 0; i < 5; i++)
        if (i == 0 || i >= 3)
            if (fds[i] >= 0)
                close(fds[i]);
    char reply[8];
    ssize_t n = -1;
    if (ok)
        do
            n = recv(s, reply, sizeof reply, 0);
        while (n < 0 && errno == EINTR);
    if (n != 1 || reply[0] != 'A') {
        close(s); /* refused, declined, too slow or gone before taking it: do it ourselves */
        return;
    }
    /* "G": we are committed to the server. Only now does the worker start; had we timed
     * out and fallen back just as "A" came, it would see us gone and do nothing. */
    ssize_t w;
    do
        w = send(s, "G", 1, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w != 1) {
        close(s);
        return;
    }
    tv.tv_sec = 0;
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    do
        n = recv(s, reply, sizeof reply, 0);
    while (n < 0 && errno == EINTR);
    if (n != 5 || reply[0] != 'S') {
        dprintf(2, "nvhook: hook service: connection lost while configuring the container\n");
        _exit(1);
    }
    int status;
    memcpy(&status, reply + 1, sizeof status);
    if (status == -2)
        dprintf(2, "nvhook: hook service: timed out configuring the container\n");
    else if (status < 0 || status > 255)
        dprintf(2, "nvhook: hook service: worker died configuring the container\n");
    _exit(status < 0 || status > 255 ? 1 : status);
}

/* A hook stage that needs Python's answer: the warm service if there is one, else exec. */
static void hand_over(void)
{
    try_serve();
    exec_python();
}

/* Does config.toml set a key from CONF_KEYS (in a line that is not a comment)? */
static int config_widens(void)
{
    const char *path = opt_config();
    char buf[PATH_MAX];
    int required = 1;
    if (!path)
        path = getenv("NVHOOK_CONFIG");
    if (!path || !*path) {
        const char *xdg = getenv("XDG_CONFIG_HOME");
        snprintf(buf, sizeof buf, "%s/nvidia-container-runtime/config.toml",
                 xdg && *xdg ? xdg : "/etc");
        path = buf;
        required = 0;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return required; /* a missing explicit config is Python's error to report */
    size_t len;
    char *text = read_all(fd, MAX_CONF, &len);
    close(fd);
    if (!text || len > MAX_CONF) {
        free(text);
        return 1;
    }
    int hit = 0;
    for (char *line = text; line && *line && !hit;) {
        char *end = strchr(line, '\n');
        if (end)
            *end = '\0';
        char *p = line + strspn(line, " \t");
        if (*p != '#')
            for (const char *const *k = CONF_KEYS; *k; k++)
                if (strstr(p, *k))
                    hit = 1;
        line = end ? end + 1 : NULL;
    }
    free(text);
    return hit;
}

/* The bundle path from the state: exactly one plain "bundle" (or "bundlePath") string
 * value without escapes, else NULL (Python will sort it out). */
static char *state_bundle(void)
{
    char *found = NULL;
    static const char *const keys[] = {"\"bundle\"", "\"bundlePath\"", NULL};
    for (const char *const *k = keys; *k; k++) {
        size_t klen = strlen(*k);
        for (char *p = memmem(g_state, g_state_len, *k, klen); p;
             p = memmem(p + 1, g_state_len - (size_t)(p + 1 - g_state), *k, klen)) {
            char *q = p + klen;
            q += strspn(q, " \t\r\n");
            if (*q != ':')
                continue; /* a value, not a key */
            q++;
            q += strspn(q, " \t\r\n");
            if (*q != '"' || found)
                return NULL; /* not a string, or a second bundle */
            char *end = strchr(q + 1, '"');
            if (!end || memchr(q + 1, '\\', (size_t)(end - q - 1)) || end == q + 1)
                return NULL;
            found = strndup(q + 1, (size_t)(end - q - 1));
            if (!found)
                return NULL;
        }
    }
    return found;
}

/* Is the occurrence at p of NVIDIA_VISIBLE_DEVICES an env entry that asks for nothing? */
static int is_void_entry(const char *spec, const char *p, const char *end)
{
    static const char name[] = "NVIDIA_VISIBLE_DEVICES=";
    size_t n = sizeof name - 1;
    if (p == spec || p[-1] != '"' || (size_t)(end - p) < n + 1 || memcmp(p, name, n) != 0)
        return 0;
    p += n;
    if (*p == '"')
        return 1;
    return (size_t)(end - p) >= 5 && memcmp(p, "void\"", 5) == 0;
}

static int spec_may_want_gpu(const char *spec, size_t len)
{
    const char *end = spec + len;
    for (const char *const *t = TRIGGERS; *t; t++) {
        size_t tlen = strlen(*t);
        int visible = strcmp(*t, "NVIDIA_VISIBLE_DEVICES") == 0;
        for (const char *p = memmem(spec, len, *t, tlen); p;
             p = memmem(p + 1, (size_t)(end - p - 1), *t, tlen)) {
            if (visible && is_void_entry(spec, p, end))
                continue;
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    g_argc = argc;
    g_argv = argv;
    if (!getcwd(g_cwd, sizeof g_cwd))
        g_cwd[0] = '\0';

    const char *cmd = command();
    int hook = cmd && (strcmp(cmd, "prestart") == 0 || strcmp(cmd, "createContainer") == 0);
    int noop = cmd && (strcmp(cmd, "poststart") == 0 || strcmp(cmd, "poststop") == 0);
    if (!hook && !noop)
        exec_python(); /* any other command: nvhook itself */

    g_state = read_all(0, MAX_STATE, &g_state_len);
    if (noop)
        return 0;
    if (!g_state || g_state_len > MAX_STATE || config_widens())
        hand_over();

    char *bundle = state_bundle();
    if (!bundle)
        hand_over();
    /* A relative bundle is relative to where the runtime started us (we have not moved). */
    int bfd = open(bundle, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int fd = bfd < 0 ? -1 : openat(bfd, "config.json", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        hand_over();
    size_t len;
    char *spec = read_all(fd, MAX_SPEC, &len);
    if (!spec || len > MAX_SPEC || spec_may_want_gpu(spec, len))
        hand_over();
    return 0;
}
