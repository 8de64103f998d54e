/*
 * What the compiled fronts (csrc/hookfront.c, csrc/shimfront.c) share: their one way into
 * Python -- exec the venv's interpreter isolated, `python -I [-S] -c MAIN PYPATH ARGS...`,
 * where MAIN puts PYPATH (the package's dir and site-packages, baked in by `make venv`)
 * on sys.path; -S skips site's .pth processing (~20 ms of start-up) -- and the scan of a
 * config.toml for keys that mean "let Python decide".
 */
#ifndef NVHOOK_PYEXEC_H
#define NVHOOK_PYEXEC_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Where the front finds its Python. Two builds:
 * - a checkout's venv (`make venv`): NVHOOK_PYTHON and NVHOOK_PYPATH baked in (the
 *   package is the checkout itself, reached through PYPATH). The front runs them only
 *   from the very bin directory it was built for: a moved or copied front refuses with
 *   one line, never running another tree's Python and code;
 * - an installed wheel (setup.py, NVHOOK_RELATIVE): the Python beside the front
 *   (bin/python) and the one lib/python3.N/site-packages of that environment, so an
 *   environment that is moved or copied whole runs its own code.
 * Run as the host's root, the front then checks every component of the interpreter's path and of
 * each PYPATH entry, through fds it opens from "/" without following symlinks: root's,
 * and writable by nobody else (a sticky directory excepted), or it refuses: a user who
 * can write there could choose the code root runs. */
#if !defined(NVHOOK_RELATIVE) && !defined(NVHOOK_PYTHON)
#define NVHOOK_PYTHON "/usr/bin/python3"
#endif
#ifndef NVHOOK_PYPATH
#define NVHOOK_PYPATH ""
#endif

static void pyexec_refuse(int fail, const char *fmt, const char *a, const char *b)
{
    dprintf(2, "nvhook: ");
    dprintf(2, fmt, a, b);
    dprintf(2, "\n");
    _exit(fail);
}

/* The directory of the running front (its real path). */
static const char *front_dir(int fail)
{
    static char dir[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
    if (n <= 0)
        pyexec_refuse(fail, "cannot tell where this front is (/proc/self/exe): %s%s", strerror(errno), "");
    dir[n] = '\0';
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else if (slash)
        *slash = '\0';
    return dir;
}

/* Is `path` (absolute, after symlinks resolved) root's all the way down, writable by
 * nobody else? Walked by fd from "/", never following a symlink. 0: yes; else sets why. */
static int root_only_path(const char *path, const char **why)
{
    char copy[PATH_MAX];
    if (snprintf(copy, sizeof copy, "%s", path) >= (int)sizeof copy) {
        *why = "too long";
        return -1;
    }
    int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    struct stat st;
    for (char *part = copy, *next; fd >= 0; part = next) {
        if (fstat(fd, &st) < 0)
            break;
        if (st.st_uid != 0) {
            *why = "not owned by root";
            close(fd);
            return -1;
        }
        if ((st.st_mode & 022) && !(S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX))) {
            *why = "writable by others than root";
            close(fd);
            return -1;
        }
        while (*part == '/')
            part++;
        if (!*part) {
            close(fd);
            return 0;
        }
        next = strchr(part, '/');
        if (next)
            *next++ = '\0';
        else
            next = part + strlen(part);
        int child = openat(fd, part, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        close(fd);
        fd = child;
    }
    *why = strerror(errno);
    if (fd >= 0)
        close(fd);
    return -1;
}

static void check_root_only(const char *path, int fail)
{
    char real[PATH_MAX];
    const char *why = NULL;
    if (!realpath(path, real))
        pyexec_refuse(fail, "cannot run Python from %s: %s", path, strerror(errno));
    if (root_only_path(real, &why) < 0)
        pyexec_refuse(fail, "refusing to run Python from %s: %s", real, why);
}

#ifdef NVHOOK_RELATIVE
/* <dir>/../lib/python3.N/site-packages, the one there is (a venv has one). */
static const char *beside_pypath(const char *dir, int fail)
{
    static char found[PATH_MAX];
    char lib[PATH_MAX];
    snprintf(lib, sizeof lib, "%s/../lib", dir);
    DIR *d = opendir(lib);
    if (!d)
        pyexec_refuse(fail, "no %s beside this front: %s", lib, strerror(errno));
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, "python3.", 8) == 0) {
            snprintf(found, sizeof found, "%s/%s/site-packages", lib, e->d_name);
            n++;
        }
    closedir(d);
    if (n != 1)
        pyexec_refuse(fail, "%s: expected one python3.N in it, found %s", lib, n ? "several" : "none");
    return found;
}
#endif

/* Are we root of the initial user namespace (uid_map the identity over all uids)? In
 * a user namespace (rootless engines) the host's root shows as the overflow uid and we
 * hold no privilege over the host: the ownership check is for real root only. An
 * unreadable uid_map counts as the initial namespace (the check then runs). */
static int host_root(void)
{
    if (geteuid() != 0)
        return 0;
    char buf[128];
    int fd = open("/proc/self/uid_map", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 1;
    buf[n] = '\0';
    unsigned long inside, outside, count;
    int lines = 0;
    for (char *p = buf; *p; p++)
        lines += *p == '\n';
    return lines == 1 && sscanf(buf, "%lu %lu %lu", &inside, &outside, &count) == 3 &&
           inside == 0 && outside == 0 && count == 4294967295UL;
}

/* Never returns: exits with `fail` if the interpreter cannot (or must not) be run. */
static void exec_venv_python(const char *main_code, int argc, char *const *argv, char *const *envp,
                             int fail)
{
    const char *dir = front_dir(fail);
    static char python_buf[PATH_MAX];
#ifdef NVHOOK_RELATIVE
    snprintf(python_buf, sizeof python_buf, "%s/python", dir);
    const char *python = python_buf;
    const char *pypath = beside_pypath(dir, fail);
#else
    const char *python = NVHOOK_PYTHON;
    const char *pypath = NVHOOK_PYPATH;
    /* Built for one venv's bin: run only from there */
    char built[PATH_MAX];
    snprintf(python_buf, sizeof python_buf, "%s", python);
    char *slash = strrchr(python_buf, '/');
    if (slash)
        *slash = '\0';
    if (!realpath(python_buf, built) || strcmp(built, dir) != 0)
        pyexec_refuse(fail, "this front was built for the install in %s, not %s where it is: "
                      "rebuild it there (make venv) or reinstall", python_buf, dir);
#endif
    if (host_root()) {
        check_root_only(python, fail);
        char entries[PATH_MAX * 2];
        snprintf(entries, sizeof entries, "%s", pypath);
        for (char *e = entries, *next; e && *e; e = next) {
            next = strchr(e, ':');
            if (next)
                *next++ = '\0';
            if (*e)
                check_root_only(e, fail);
        }
    }
    char **av = calloc((size_t)argc + 6, sizeof *av);
    if (!av)
        _exit(fail);
    int na = 0;
    av[na++] = (char *)python;
    av[na++] = "-I";
    if (*pypath)
        av[na++] = "-S";
    av[na++] = "-c";
    av[na++] = (char *)main_code;
    av[na++] = (char *)pypath;
    for (int i = 1; i < argc; i++)
        av[na++] = argv[i];
    av[na] = NULL;
    execve(python, av, envp);
    dprintf(2, "nvhook: cannot run %s: %s\n", python, strerror(errno));
    _exit(fail);
}

/* Does text (NUL-terminated, modified) name one of keys outside a comment line? Anywhere
 * in the line: quoted, dotted and inline-table spellings count too (a false hit only
 * sends the work to Python). */
static int conf_names_key(char *text, const char *const *keys)
{
    for (char *line = text; line && *line;) {
        char *end = strchr(line, '\n');
        if (end)
            *end = '\0';
        char *p = line + strspn(line, " \t");
        if (*p != '#')
            for (const char *const *k = keys; *k; k++)
                if (strstr(p, *k))
                    return 1;
        line = end ? end + 1 : NULL;
    }
    return 0;
}

#endif
