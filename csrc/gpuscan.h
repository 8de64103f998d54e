/*
 * What the compiled fronts (csrc/hookfront.c, csrc/shimfront.c) share to tell, without
 * JSON logic and before Python starts, that a container cannot be asking for a GPU: the
 * strings a GPU request needs in its config.json (TRIGGERS), the config.toml keys that
 * widen them, and reading a file without blocking on a FIFO or a device.
 *
 * The filter only ever sends more containers to Python, never fewer: any occurrence of a
 * trigger counts, except an env entry spelled exactly "NVIDIA_VISIBLE_DEVICES=void" or
 * "NVIDIA_VISIBLE_DEVICES=" (not a GPU container). A config.json spelling a trigger with
 * \u escapes goes unseen: that only denies the container GPUs, it never grants anything.
 */
#ifndef NVHOOK_GPUSCAN_H
#define NVHOOK_GPUSCAN_H

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_SPEC (16 << 20)     /* as libinject.request.oci_state.MAX_CONFIG_BYTES */

/* env names, the device-list mount root and CDI annotations (libinject.request.oci_spec) */
static const char *const TRIGGERS[] = {
    "NVIDIA_VISIBLE_DEVICES", "CUDA_VERSION", "nvidia-container-devices", "cdi.k8s.io/", NULL,
};
/* config.toml keys that let other variables or annotation prefixes ask for GPUs */
#define WIDENING_KEYS "swarm-resource", "annotation-prefixes"

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

/* open(2) that never blocks on a FIFO or device: a regular file's fd, -2 for anything
 * else (closed), -1 with errno if it cannot be opened. */
static int open_regular(int dirfd, const char *path)
{
    int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -2;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
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

/* Can the config.json in directory dirfd ask for a GPU? Unreadable, too big or odd: yes. */
static int bundle_may_want_gpu(int dirfd)
{
    int fd = open_regular(dirfd, "config.json");
    if (fd < 0)
        return 1;
    size_t len;
    char *spec = read_all(fd, MAX_SPEC, &len);
    close(fd);
    int want = !spec || len > MAX_SPEC || spec_may_want_gpu(spec, len);
    free(spec);
    return want;
}

#endif
