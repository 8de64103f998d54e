/*
 * What the compiled fronts (csrc/hookfront.c, csrc/shimfront.c) share: their one way into
 * Python -- exec the venv's interpreter isolated, `python -I [-S] -c MAIN PYPATH ARGS...`,
 * where MAIN puts PYPATH (the package's dir and site-packages, baked in by `make venv`)
 * on sys.path; -S skips site's .pth processing (~20 ms of start-up) -- and the scan of a
 * config.toml for keys that mean "let Python decide".
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
