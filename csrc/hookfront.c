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
 * spoken to): the front sends its argv, its cwd, the state (a memfd) and fds of its own
 * namespaces (the same proof for the service), and nothing else (csrc/serveclient.h,
 * shared with the runtime shim's front). The service
 * sends back the hook's status and what it wrote to stderr, which the front writes and
 * exits with (protocol: libinject/runtime/serve/protocol.py). No service, or one that does not
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
#include "serveclient.h"

#define MAX_STATE (1 << 20)     /* as libinject.request.oci_state.MAX_STATE_BYTES */
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

/* Where the command (first positional argument) is, as nvhook/cli.py finds it; 0: none. */
static int command_at(void)
{
    for (int i = 1; i < g_argc; i++) {
        if (is_one_of(g_argv[i], VALUED)) {
            i++;
            continue;
        }
        if (g_argv[i][0] != '-')
            return i;
    }
    return 0;
}

static const char *command(void)
{
    int i = command_at();
    return i ? g_argv[i] : NULL;
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
    static char fallback_env[64];
    char *envp[5];
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
    /* The service was there and did not take this start: the hook logs why (a word of
     * serve_call's own, never anything from outside). */
    if (serve_fallback) {
        snprintf(fallback_env, sizeof fallback_env, "NVHOOK_SERVE_FALLBACK=%s", serve_fallback);
        envp[ne++] = fallback_env;
    }
    envp[ne] = NULL;

    exec_venv_python(main_code, g_argc, g_argv, envp, 1);
}

/* The argument after the command (cdi-hook's own subcommand), else NULL. */
static const char *subcommand(void)
{
    int i = command_at();
    return i && i + 1 < g_argc ? g_argv[i + 1] : NULL;
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

/* Hand the request to `nvhook serve` (csrc/serveclient.h). Returns if it is not there
 * or does not take it (the caller then execs Python); once it has taken it, exits with
 * its status, having written what the hook wrote to stderr. */
static void try_serve(const char *cmd)
{
    const char *path = opt_value("--socket");
    if (!path || !*path)
        path = NVHOOK_SOCKET_DEFAULT;
    if (!g_state || !served_stage(cmd))
        return;

    static char req[MAX_REQUEST];
    size_t len = 0;
    memcpy(req, "NVHOOK2", 8);
    len = 8;
    for (int i = 0; i < g_argc; i++)
        if (!put_item(req, &len, 'a', g_argv[i], NULL))
            return;
    if (g_cwd[0] && !put_item(req, &len, 'c', g_cwd, NULL))
        return;

    int fd = state_memfd();
    if (fd < 0)
        return;
    static char reply[MAX_REPLY];
    ssize_t n = 0;
    int status = 0;
    int got = serve_call(path, req, len, fd, reply, sizeof reply, &n, &status);
    close(fd);
    if (got == SERVE_NOT_TAKEN) {
        serve_fallback_note(path);
        return;
    }
    if (got == SERVE_LOST) {
        dprintf(2, "nvhook: hook service: no answer while configuring the container\n");
        _exit(1);
    }
    write_err(reply + 5, (size_t)(n - 5)); /* what the hook wrote to stderr */
    _exit(served_exit(status, "configuring the container"));
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
    /* A stage is the last argument as runtimes call it; anything after it (--help, a
     * mistake) is Python's to answer (usage, or one error line). */
    int noop = cmd && command_at() == g_argc - 1 &&
               (strcmp(cmd, "poststart") == 0 || strcmp(cmd, "poststop") == 0);
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
