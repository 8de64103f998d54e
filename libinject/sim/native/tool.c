/* A simulated driver binary (nvidia-debugdump, nvidia-persistenced,
 * nvidia-cuda-mps-control, nvidia-cuda-mps-server, nv-fabricmanager): a real
 * executable that says what it is. -DSIM_TOOL="name" -DSIM_DRIVER_VERSION="...". */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-v"))) {
        printf("%s version %s (nvhook simulated)\n", SIM_TOOL, SIM_DRIVER_VERSION);
        return 0;
    }
    printf("%s (nvhook simulated driver %s): nothing to do without a GPU\n", SIM_TOOL, SIM_DRIVER_VERSION);
    return 0;
}
