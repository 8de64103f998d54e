/*
 * The compiled fronts' client of `nvhook serve` (csrc/hookfront.c: the prestart hook and
 * `cdi-hook createRuntime`; csrc/shimfront.c: the runtime shim's `create`): one
 * implementation of connecting, checking the listener, the hello, sending a request
 * and reading the reply (protocol: libinject/runtime/serve/protocol.py's docstring).
 *
 * The listener must be uid 0 and prove, with fds of its mount and pid namespaces in its
 * hello, that it runs in ours (a socket a container bound is never spoken to). The
 * front sends its request (argv, cwd, ... built with put_item), an optional fd (the
 * hook's state memfd) and fds of its own namespaces (the same proof for the service),
 * and nothing else -- never the runtime's stdout/stderr, our root or cwd, so a wedged
 * service cannot hold the runtime's pipes open. No service, or one that does not take
 * the request within SERVE_WAIT_S in all (one deadline over connect, hello, request and
 * "A": a starved or stopped service costs a start that and no more): the caller does the
 * work itself, and, where a service was there but did not take it, says so in one line
 * (serve_fallback_note; the exec'd Python writes the same to the log file). Once the service
 * has taken it ("A" + its timeout) and we have committed ("G"), there is no falling
 * back (a container may be partly configured, a bundle rewritten): its status is final.
 */
#ifndef NVHOOK_SERVECLIENT_H
#define NVHOOK_SERVECLIENT_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77         /* Linux 6.5 */
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

#ifndef NVHOOK_SOCKET_DEFAULT
#define NVHOOK_SOCKET_DEFAULT "/run/nvhook/hook.sock"   /* as [nvhook] socket's default */
#endif

#define MAX_REQUEST (64 << 10)  /* as libinject.runtime.serve.protocol.MAX_REQUEST */
#define MAX_REPLY (16 << 10)    /* as libinject.runtime.serve.protocol.MAX_OUTPUT + 5 */
#define SERVE_GRACE_S 30        /* beyond the service's own timeout, before we give up */
#define SERVE_WAIT_S 5          /* a wedged server costs a start this in all, then we do it ourselves */

/* serve_call's outcomes */
#define SERVE_NOT_TAKEN 0       /* not there, not trusted, declined, too slow: do it ourselves */
#define SERVE_ANSWERED 1        /* *status and the reply's text are final */
#define SERVE_LOST 2            /* committed, then no answer: fail (no falling back now) */

/* Why serve_call fell back, where a service was there (NULL: none was -- no socket, or
 * nobody listening -- which is no news): a word the exec'd Python maps to its log line
 * (libinject.runtime.serve.fallback), so nothing but these words ever reaches it. */
static const char *serve_fallback;

/* The deadline's time left, as a socket timeout; 0 when it has passed (a zero
 * SO_*TIMEO would mean "wait for ever"). */
static int time_left(const struct timespec *deadline, struct timeval *tv)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long us = (long long)(deadline->tv_sec - now.tv_sec) * 1000000 +
                   (deadline->tv_nsec - now.tv_nsec) / 1000;
    if (us <= 0)
        return 0;
    tv->tv_sec = us / 1000000;
    tv->tv_usec = us % 1000000;
    return 1;
}

/* Bound s's next send/recv/connect by what is left of deadline; 0 if nothing is. */
static int bound_by(int s, const struct timespec *deadline)
{
    struct timeval tv;
    if (!time_left(deadline, &tv))
        return 0;
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return 1;
}

/* The one line a fallback gets on stderr (why: serve_fallback's word). */
static void serve_fallback_note(const char *path)
{
    const char *text = NULL;
    if (!serve_fallback)
        return;
    if (strcmp(serve_fallback, "timeout") == 0)
        text = "did not take the start within 5 s";
    else if (strcmp(serve_fallback, "declined") == 0)
        text = "declined the start";
    else
        text = "is not one this front may use (not root's, or not in its namespaces)";
    dprintf(2, "nvhook: hook service at %s %s; running it without the service\n", path, text);
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
static int hello_proves_ours(int s, const struct timespec *deadline)
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
        n = bound_by(s, deadline) ? recvmsg(s, &msg, MSG_CMSG_CLOEXEC) : (errno = EAGAIN, -1);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        serve_fallback = "timeout";
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

/* recv, bounded by deadline (NULL: by the timeout already set). */
static ssize_t recv_retry(int s, char *buf, size_t len, const struct timespec *deadline)
{
    ssize_t n;
    do
        n = !deadline || bound_by(s, deadline) ? recv(s, buf, len, 0) : (errno = EAGAIN, -1);
    while (n < 0 && errno == EINTR);
    return n;
}

/* Hand the request req[0..len) to the service listening at path, with fd (>= 0: the
 * hook's state memfd; -1: none) and fds of our mount and pid namespaces. Returns
 * SERVE_NOT_TAKEN (the caller does the work itself), SERVE_LOST, or SERVE_ANSWERED
 * with *status and the service's text (what the work wrote, or the shim's runtime) in
 * reply[5..*n). The caller keeps fd. */
static int serve_call(const char *path, const char *req, size_t len, int fd, char *reply,
                      size_t size, ssize_t *n, int *status)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (!path || strcmp(path, "none") == 0 || strlen(path) >= sizeof addr.sun_path)
        return SERVE_NOT_TAKEN;
    strcpy(addr.sun_path, path);
    serve_fallback = NULL;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += SERVE_WAIT_S;
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0)
        return SERVE_NOT_TAKEN;
    /* Until the service has taken the request, every wait is bounded by what is left of
     * one deadline (connect on a full backlog honours SO_SNDTIMEO). */
    int rc;
    do
        rc = bound_by(s, &deadline) ? connect(s, (struct sockaddr *)&addr, sizeof addr) : (errno = EAGAIN, -1);
    while (rc < 0 && errno == EINTR);
    if (rc < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ETIMEDOUT)
            serve_fallback = "timeout";   /* ENOENT, ECONNREFUSED, EACCES: no service, no news */
        close(s);
        return SERVE_NOT_TAKEN;
    }
    if (!listener_trusted(s)) {
        serve_fallback = "untrusted";
        close(s);
        return SERVE_NOT_TAKEN;
    }
    if (!hello_proves_ours(s, &deadline)) {
        if (!serve_fallback)
            serve_fallback = "untrusted";
        close(s); /* not the real service, or too slow to say hello: do it ourselves */
        return SERVE_NOT_TAKEN;
    }
    /* fd, and our own namespaces: the same proof for the service. */
    int sfds[3] = {fd, open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC),
                   open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC)};
    int *send_fds = fd >= 0 ? sfds : sfds + 1;
    size_t nfds = fd >= 0 ? 3 : 2;
    int ok = sfds[1] >= 0 && sfds[2] >= 0;
    if (ok) {
        union {
            char buf[CMSG_SPACE(sizeof sfds)];
            struct cmsghdr align;
        } ctl;
        memset(&ctl, 0, sizeof ctl);
        struct iovec iov = {.iov_base = (void *)req, .iov_len = len};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                             .msg_controllen = CMSG_SPACE(nfds * sizeof(int))};
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(c), send_fds, nfds * sizeof(int));
        ssize_t w;
        do
            w = bound_by(s, &deadline) ? sendmsg(s, &msg, MSG_NOSIGNAL) : (errno = EAGAIN, -1);
        while (w < 0 && errno == EINTR);
        ok = w == (ssize_t)len;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            serve_fallback = "timeout";
    }
    for (int i = 1; i < 3; i++)
        if (sfds[i] >= 0)
            close(sfds[i]);
    ssize_t got = ok ? recv_retry(s, reply, size, &deadline) : -1;
    if (ok && got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        serve_fallback = "timeout";
    if (got != 5 || reply[0] != 'A') {
        if (!serve_fallback)
            serve_fallback = "declined";
        close(s); /* refused, declined, too slow or gone before taking it: do it ourselves */
        return SERVE_NOT_TAKEN;
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
        serve_fallback = "declined";
        close(s);
        return SERVE_NOT_TAKEN;
    }
    /* The service kills a worker past its timeout and answers; wait that long and a grace. */
    struct timeval tv = {.tv_sec = (limit > 0 && limit < 86400 ? limit : 3600) + SERVE_GRACE_S};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    got = recv_retry(s, reply, size, NULL);
    close(s);
    if (got < 5 || reply[0] != 'S')
        return SERVE_LOST;
    memcpy(status, reply + 1, sizeof *status);
    *n = got;
    return SERVE_ANSWERED;
}

/* Write buf[0..len) to fd 2, as far as it goes. */
static void write_err(const char *buf, size_t len)
{
    for (size_t off = 0; off < len;) {
        ssize_t k = write(2, buf + off, len - off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        off += (size_t)k;
    }
}

/* The exit status for a served status; says why on stderr when the service, not the
 * work, ended it (what: "configuring the container", "rewriting the bundle"). */
static int served_exit(int status, const char *what)
{
    if (status == -2)
        dprintf(2, "nvhook: hook service: timed out %s\n", what);
    else if (status < 0 || status > 255)
        dprintf(2, "nvhook: hook service: worker died %s\n", what);
    return status < 0 || status > 255 ? 1 : status;
}

#endif
