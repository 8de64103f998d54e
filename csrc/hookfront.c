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
 * The filter (csrc/gpuscan.h, shared with the runtime shim's front) only ever sends more
 * containers to Python, never fewer; a config.toml that sets swarm-resource or
 * annotation-prefixes (other variables / prefixes can ask for GPUs) sends everything.
 *
 * The environment is never read for a hook stage: runc runs a createContainer hook whose
 * entry has no env with the *container's* environment (CVE-2025-23266), so every setting
 * comes from the hook entry's arguments (--config, --socket) or fixed paths. The one
 * exception is not a hook: `nvhook-hook serve` (an administrator's systemd unit, never a
 * hook entry) gets systemd's NOTIFY_SOCKET passed on, see exec_python().
 *
 * A CDI spec's `cdi-hook createRuntime|createContainer` is always handed over (only GPU
 * containers have one): its state read here, as a hook stage's.
 *
 * A prestart hook, and `cdi-hook createRuntime` (both run in the runtime's namespaces),
 * go first to `nvhook serve` if one listens on --socket (default
 * NVHOOK_SOCKET_DEFAULT; "none" turns it off) and the listener is uid 0 in our own mount
 * and pid namespaces (its hello carries fds of them; a socket a container bound is never
 * spoken to): the front sends its argv,
 * its cwd, the state (a memfd) and fds of its own namespaces (the same proof for the
 * service), and nothing else -- never runc's stdout/stderr, our
 * root or cwd, so a wedged service cannot hold the runtime's pipes open. The service
 * sends back the hook's status and what it wrote to stderr, which the front writes and
 * exits with (protocol: libinject/runtime/service.py). No service, or one that does not
 * take the request within SERVE_WAIT_S: exec Python as before. Once the service has
 * taken it ("A" + its timeout) and we have committed ("G"), there is no falling back
 * (the container may be partly configured): its status is final.
 *
 * Built static where possible, so the dynamic loader (and an LD_PRELOAD in the hook's
 * environment) never runs. Logic stays in Python; this file only filters, forwards and
 * execs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
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

#include "gpuscan.h"
#include "pyexec.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77         /* Linux 6.5 */
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif


#ifndef NVHOOK_SOCKET_DEFAULT
#define NVHOOK_SOCKET_DEFAULT "/run/nvhook/hook.sock"   /* as [nvhook] socket's default */
#endif

#define MAX_STATE (1 << 20)     /* as libinject.request.oci_state.MAX_STATE_BYTES */
#define MAX_REQUEST (64 << 10)  /* as libinject.runtime.service.MAX_REQUEST */
#define MAX_REPLY (16 << 10)    /* as libinject.runtime.service.MAX_OUTPUT + 5 */
#define SERVE_GRACE_S 30        /* beyond the service's own timeout, before we give up */
#define SERVE_WAIT_S 5          /* a wedged server costs a container this, then we exec */
#define STATE_WAIT_S 30         /* for the runtime to write the state and close stdin */
#define MAX_CONF (1 << 20)

/* config.toml keys that widen what can ask for a GPU beyond TRIGGERS (gpuscan.h) */
static const char *const CONF_KEYS[] = {WIDENING_KEYS, NULL};
/* global options of nvhook that take a value (libinject/runtime/hook.py GLOBAL_VALUED) */
static const char *const VALUED[] = {"--root", "--ldcache", "--user", "--debug", "--config",
                                     "--socket", NULL};
/* Python runs with -I -S: no site module, so none of site-packages' .pth files (~20 ms of
 * start-up); the import path is the one `make venv` baked in (the package's and the
 * venv's site-packages), passed as the first argument. */
static const char *const PY_MAIN =
    "import sys; sys.path[:0] = [p for p in sys.argv.pop(1).split(':') if p]; "
    "from nvhook.cli import main; sys.exit(main())";
/* A hook stage: the same, then out without the interpreter's teardown (finalizing ~100
 * modules: ~4.5 ms of a GPU container's start). The hook writes files and its log with
 * os.write and keeps nothing buffered but stdio, flushed here; nothing of it registers
 * atexit work. */
static const char *const PY_HOOK =
    "import sys; sys.path[:0] = [p for p in sys.argv.pop(1).split(':') if p]; "
    "from nvhook.cli import main\n"
    "try:\n code = main()\n"
    "except SystemExit as e:\n"
    " code = 0 if e.code is None else e.code if isinstance(e.code, int) else print(e.code, file=sys.stderr) or 1\n"
    "try:\n sys.stdout.flush(); sys.stderr.flush()\nexcept Exception:\n pass\n"
    "import os; os._exit(code & 255)";

static char *const *g_argv;
static int g_argc;
static char g_cwd[PATH_MAX];
static char *g_state;
static size_t g_state_len;

static void state_timeout(int sig)
{
    (void)sig;
    static const char msg[] = "nvhook: timed out reading the container state on stdin\n";
    ssize_t r = write(2, msg, sizeof msg - 1);
    (void)r;
    _exit(1);
}

static int is_one_of(const char *s, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(s, *list) == 0)
            return 1;
    return 0;
}

/* The value of a global option (--name V or --name=V) before the command, else NULL. */
static const char *opt_value(const char *name)
{
    size_t n = strlen(name);
    for (int i = 1; i < g_argc; i++) {
        if (strcmp(g_argv[i], name) == 0 && i + 1 < g_argc)
            return g_argv[i + 1];
        if (strncmp(g_argv[i], name, n) == 0 && g_argv[i][n] == '=')
            return g_argv[i] + n + 1;
        if (is_one_of(g_argv[i], VALUED))
            i++;
        else if (g_argv[i][0] != '-')
            break;  /* the command: what follows is its own */
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

/* Hand over to Python (main_code: PY_MAIN, or PY_HOOK for a hook stage): state on fd
 * 0, cwd "/", explicit environment. Never returns. serve: the command is `serve`
 * (decided from argv, as nvhook/cli.py decides it), never a hook stage. */
static void exec_python(const char *main_code, int serve)
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

    /* Nothing of our own environment goes on: it may be the container's. */
    static char cwd_env[PATH_MAX + 32];
    static char notify_env[sizeof(((struct sockaddr_un *)0)->sun_path) + 16];
    char *envp[4];
    int ne = 0;
    envp[ne++] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    if (g_cwd[0]) {
        snprintf(cwd_env, sizeof cwd_env, "NVHOOK_HOOK_CWD=%s", g_cwd);
        envp[ne++] = cwd_env;
    }
    /* `nvhook serve` under systemd (Type=notify): its NOTIFY_SOCKET, a unix socket path
     * or @abstract name, goes on so the service can say READY=1 from this very pid (exec
     * keeps it: NotifyAccess=main). Only for serve, which only a unit runs: a hook
     * stage never gets here with serve set, so its environment stays the two above. */
    const char *notify = serve ? getenv("NOTIFY_SOCKET") : NULL;
    if (notify && (notify[0] == '/' || notify[0] == '@') &&
        strlen(notify) < sizeof(((struct sockaddr_un *)0)->sun_path)) {
        snprintf(notify_env, sizeof notify_env, "NOTIFY_SOCKET=%s", notify);
        envp[ne++] = notify_env;
    }
    envp[ne] = NULL;

    exec_venv_python(main_code, g_argc, g_argv, envp, 1);
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

/* Is the listener on s the real service: uid 0, in our own mount namespace (so not in a
 * container), checked against the very process through its pidfd where the kernel has one? */
static int listener_trusted(int s)
{
    struct ucred cr;
    socklen_t l = sizeof cr;
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &l) < 0 || cr.uid != 0 || cr.pid <= 0)
        return 0; /* pid 0: it lives in a pid namespace we cannot see */
    int pidfd = -1;
    l = sizeof pidfd;
    if (getsockopt(s, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &l) < 0) {
        if (errno != ENOPROTOOPT)
            return 0; /* e.g. the listener is gone: its pid may name another process now */
        pidfd = -1;   /* kernels before 6.5: the pid alone (the hello below proves it) */
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/mnt", cr.pid);
    struct stat a, b;
    int ok = stat(path, &a) == 0 && stat("/proc/self/ns/mnt", &b) == 0 && a.st_dev == b.st_dev &&
             a.st_ino == b.st_ino;
    /* The pid still names the listener (not a process that took its pid since). */
    if (ok && pidfd >= 0)
        ok = syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0;
    if (pidfd >= 0)
        close(pidfd);
    return ok;
}

/* Is fd the namespace /proc/self/ns/<name> is (same nsfs inode)? */
static int same_ns(int fd, const char *name)
{
    char path[32];
    snprintf(path, sizeof path, "/proc/self/ns/%s", name);
    struct stat a, b;
    return fd >= 0 && fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

/* The service's hello: "H" with fds of its mount and pid namespaces. Proof, on any kernel
 * (no pid involved), that the listener runs in ours: a process elsewhere cannot hold
 * them unless it could enter them anyway. */
static int hello_proves_ours(int s)
{
    char buf[8];
    union {
        char b[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
                         .msg_controllen = sizeof ctl.b};
    ssize_t n;
    do
        n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    int fds[2] = {-1, -1};
    struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&msg) : NULL;
    if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len == CMSG_LEN(2 * sizeof(int)))
        memcpy(fds, CMSG_DATA(c), sizeof fds);
    int ok = n == 1 && buf[0] == 'H' && !(msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) &&
             same_ns(fds[0], "mnt") && same_ns(fds[1], "pid");
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return ok;
}

static ssize_t recv_retry(int s, char *buf, size_t len)
{
    ssize_t n;
    do
        n = recv(s, buf, len, 0);
    while (n < 0 && errno == EINTR);
    return n;
}

/* The argument after the command (cdi-hook's own subcommand), else NULL. */
static const char *subcommand(void)
{
    for (int i = 1; i < g_argc; i++) {
        if (is_one_of(g_argv[i], VALUED)) {
            i++;
            continue;
        }
        if (g_argv[i][0] == '-')
            continue;
        return i + 1 < g_argc ? g_argv[i + 1] : NULL;
    }
    return NULL;
}

/* Is this a stage the runtime runs in its own namespaces, where the service may take it:
 * prestart, or `cdi-hook createRuntime` (libinject.runtime.hook.served_stage decides the
 * same from the argv the service gets). A createContainer hook runs in the container's
 * namespaces, which the service never enters. */
static int served_stage(const char *cmd)
{
    if (strcmp(cmd, "prestart") == 0)
        return 1;
    const char *sub = subcommand();
    return strcmp(cmd, "cdi-hook") == 0 && sub && strcmp(sub, "createRuntime") == 0;
}

/* Hand the request to `nvhook serve`. Returns if it is not there or does not take it
 * (the caller then execs Python); once it has taken it, exits with its status. */
static void try_serve(const char *cmd)
{
    const char *path = opt_value("--socket");
    if (!path || !*path)
        path = NVHOOK_SOCKET_DEFAULT;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strcmp(path, "none") == 0 || strlen(path) >= sizeof addr.sun_path || !g_state ||
        !served_stage(cmd))
        return;
    strcpy(addr.sun_path, path);

    static char req[MAX_REQUEST];
    size_t len = 0;
    memcpy(req, "NVHOOK2", 8);
    len = 8;
    for (int i = 0; i < g_argc; i++)
        if (!put_item(req, &len, 'a', g_argv[i], NULL))
            return;
    if (g_cwd[0] && !put_item(req, &len, 'c', g_cwd, NULL))
        return;

    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0)
        return;
    /* Until the service has taken the request, every wait is bounded (connect on a full
     * backlog honours SO_SNDTIMEO). */
    struct timeval tv = {.tv_sec = SERVE_WAIT_S};
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(s, (struct sockaddr *)&addr, sizeof addr) < 0 || !listener_trusted(s) ||
        !hello_proves_ours(s)) {
        close(s); /* ENOENT, ECONNREFUSED, EACCES, not the real service: do it ourselves */
        return;
    }
    /* The state, and our own namespaces: the same proof for the service. */
    int sfds[3] = {state_memfd(), open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC),
                   open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC)};
    int ok = sfds[0] >= 0 && sfds[1] >= 0 && sfds[2] >= 0;
    if (ok) {
        union {
            char buf[CMSG_SPACE(sizeof sfds)];
            struct cmsghdr align;
        } ctl;
        memset(&ctl, 0, sizeof ctl);
        struct iovec iov = {.iov_base = req, .iov_len = len};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                             .msg_controllen = sizeof ctl.buf};
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof sfds);
        memcpy(CMSG_DATA(c), sfds, sizeof sfds);
        ssize_t w;
        do
            w = sendmsg(s, &msg, MSG_NOSIGNAL);
        while (w < 0 && errno == EINTR);
        ok = w == (ssize_t)len;
    }
    for (int i = 0; i < 3; i++)
        if (sfds[i] >= 0)
            close(sfds[i]);
    static char reply[MAX_REPLY];
    ssize_t n = ok ? recv_retry(s, reply, sizeof reply) : -1;
    if (n != 5 || reply[0] != 'A') {
        close(s); /* refused, declined, too slow or gone before taking it: do it ourselves */
        return;
    }
    int limit;
    memcpy(&limit, reply + 1, sizeof limit);
    /* "G": we are committed to the service. Only now does the worker start; had we timed
     * out and fallen back just as "A" came, it would see us gone and do nothing. */
    ssize_t w;
    do
        w = send(s, "G", 1, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w != 1) {
        close(s);
        return;
    }
    /* The service kills a worker past its timeout and answers; wait that long and a grace. */
    tv.tv_sec = (limit > 0 && limit < 86400 ? limit : 3600) + SERVE_GRACE_S;
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    n = recv_retry(s, reply, sizeof reply);
    if (n < 5 || reply[0] != 'S') {
        dprintf(2, "nvhook: hook service: no answer while configuring the container\n");
        _exit(1);
    }
    int status;
    memcpy(&status, reply + 1, sizeof status);
    for (ssize_t off = 5; off < n;) { /* what the hook wrote to stderr */
        ssize_t k = write(2, reply + off, (size_t)(n - off));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        off += k;
    }
    if (status == -2)
        dprintf(2, "nvhook: hook service: timed out configuring the container\n");
    else if (status < 0 || status > 255)
        dprintf(2, "nvhook: hook service: worker died configuring the container\n");
    _exit(status < 0 || status > 255 ? 1 : status);
}

/* A hook stage that needs Python's answer: the warm service if there is one, else exec. */
static void hand_over(void)
{
    try_serve(command());
    exec_python(PY_HOOK, 0);
}

/* Does config.toml set a key from CONF_KEYS (in a line that is not a comment)? */
static int config_widens(void)
{
    const char *path = opt_value("--config");
    int required = 1;
    if (!path || !*path) {
        path = "/etc/nvidia-container-runtime/config.toml"; /* as libinject.config */
        required = 0;
    }
    int fd = open_regular(AT_FDCWD, path);
    if (fd == -2)
        return 1; /* not a regular file: Python says so */
    if (fd < 0)
        return required; /* a missing explicit config is Python's error to report */
    size_t len;
    char *text = read_all(fd, MAX_CONF, &len);
    close(fd);
    if (!text || len > MAX_CONF) {
        free(text);
        return 1;
    }
    int hit = conf_names_key(text, CONF_KEYS);
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

int main(int argc, char **argv)
{
    g_argc = argc;
    g_argv = argv;
    if (!getcwd(g_cwd, sizeof g_cwd))
        g_cwd[0] = '\0';

    const char *cmd = command();
    int hook = cmd && (strcmp(cmd, "prestart") == 0 || strcmp(cmd, "createContainer") == 0);
    int noop = cmd && (strcmp(cmd, "poststart") == 0 || strcmp(cmd, "poststop") == 0);
    /* A CDI spec's hook (`cdi-hook STAGE ...`): always Python's work (only GPU containers
     * have it), served where the stage allows. The older one-step hooks go as before. */
    const char *sub = cmd && strcmp(cmd, "cdi-hook") == 0 ? subcommand() : NULL;
    int cdi = sub && (strcmp(sub, "createRuntime") == 0 || strcmp(sub, "createContainer") == 0);
    if (!hook && !noop && !cdi)
        exec_python(PY_MAIN, cmd && strcmp(cmd, "serve") == 0); /* any other command: nvhook itself */

    /* The runtime writes the state and closes stdin; one that never closes it must not
     * hold the container start for ever. */
    signal(SIGALRM, state_timeout);
    alarm(STATE_WAIT_S);
    g_state = read_all(0, MAX_STATE, &g_state_len);
    alarm(0);
    if (noop)
        return 0;
    if (cdi)
        hand_over();
    if (!g_state || g_state_len > MAX_STATE || config_widens())
        hand_over();

    char *bundle = state_bundle();
    if (!bundle)
        hand_over();
    /* A relative bundle is relative to where the runtime started us (we have not moved). */
    int bfd = open(bundle, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (bfd < 0 || bundle_may_want_gpu(bfd))
        hand_over();
    return 0;
}
