/*
 * The compiled fronts' one way into Python (csrc/hookfront.c, csrc/shimfront.c): exec the
 * venv's interpreter isolated, `python -I [-S] -c MAIN PYPATH ARGS...`, where MAIN puts
 * PYPATH (the package's dir and site-packages, baked in by `make venv`) on sys.path.
 * -S skips site's .pth processing (~20 ms of start-up) when the path is known.
 */
#ifndef NVHOOK_PYEXEC_H
#define NVHOOK_PYEXEC_H

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef NVHOOK_PYTHON
#define NVHOOK_PYTHON "/usr/bin/python3"
#endif
#ifndef NVHOOK_PYPATH
#define NVHOOK_PYPATH ""
#endif

/* Never returns: exits with `fail` if the interpreter cannot be run. */
static void exec_venv_python(const char *main_code, int argc, char *const *argv, char *const *envp,
                             int fail)
{
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
    char **av = calloc((size_t)argc + 6, sizeof *av);
    if (!av)
        _exit(fail);
    int na = 0;
    av[na++] = (char *)python;
    av[na++] = "-I";
    if (*NVHOOK_PYPATH)
        av[na++] = "-S";
    av[na++] = "-c";
    av[na++] = (char *)main_code;
    av[na++] = NVHOOK_PYPATH;
    for (int i = 1; i < argc; i++)
        av[na++] = argv[i];
    av[na] = NULL;
    execve(python, av, envp);
    dprintf(2, "nvhook: cannot run %s: %s\n", python, strerror(errno));
    _exit(fail);
}

#endif
