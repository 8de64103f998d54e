/* Simulated nvidia-smi: uses only NVML (linked via DT_NEEDED libnvidia-ml.so.1),
 * so it shows exactly what the NVML of the root it runs in shows.
 * Supports -L / --list-gpus (real format), --version, and a short table. */
#include <stdio.h>
#include <string.h>

#include "nvml.h"

static int init_or_die(void)
{
    nvmlReturn_t rc = nvmlInit_v2();
    if (rc == NVML_SUCCESS)
        return 0;
    if (rc == NVML_ERROR_DRIVER_NOT_LOADED) {
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n\n");
        return 9;
    }
    if (rc == NVML_ERROR_LIB_RM_VERSION_MISMATCH) {
        printf("Failed to initialize NVML: Driver/library version mismatch\n");
        return 18;
    }
    printf("Failed to initialize NVML: %s\n", nvmlErrorString(rc));
    return rc > 255 ? 255 : (int)rc;
}

static int count_or_die(unsigned int *n)
{
    if (nvmlDeviceGetCount_v2(n) != NVML_SUCCESS || *n == 0) {
        printf("No devices were found\n");
        return 6;
    }
    return 0;
}

static int list_gpus(void)
{
    unsigned int n, rc;
    if ((rc = count_or_die(&n)))
        return rc;
    for (unsigned int i = 0; i < n; i++) {
        nvmlDevice_t d;
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = "", uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = "";
        unsigned int cur = 0, pend = 0, max = 0;
        if (nvmlDeviceGetHandleByIndex_v2(i, &d) != NVML_SUCCESS)
            continue;
        nvmlDeviceGetName(d, name, sizeof name);
        nvmlDeviceGetUUID(d, uuid, sizeof uuid);
        printf("GPU %u: %s (UUID: %s)\n", i, name, uuid);
        if (nvmlDeviceGetMigMode(d, &cur, &pend) != NVML_SUCCESS || cur != NVML_DEVICE_MIG_ENABLE)
            continue;
        nvmlDeviceGetMaxMigDeviceCount(d, &max);
        for (unsigned int j = 0; j < max; j++) {
            nvmlDevice_t m;
            char mname[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = "", muuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = "";
            if (nvmlDeviceGetMigDeviceHandleByIndex(d, j, &m) != NVML_SUCCESS)
                continue;
            nvmlDeviceGetName(m, mname, sizeof mname);
            nvmlDeviceGetUUID(m, muuid, sizeof muuid);
            const char *profile = strstr(mname, " MIG ");
            profile = profile ? profile + 5 : mname;
            printf("  MIG %-12sDevice %2u: (UUID: %s)\n", profile, j, muuid);
        }
    }
    return 0;
}

static int table(void)
{
    char drv[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = "";
    int cuda = 0;
    unsigned int n, rc;
    nvmlSystemGetDriverVersion(drv, sizeof drv);
    nvmlSystemGetCudaDriverVersion_v2(&cuda);
    if ((rc = count_or_die(&n)))
        return rc;
    printf("+-----------------------------------------------------------------------------------------+\n");
    char cudas[16];
    snprintf(cudas, sizeof cudas, "%d.%d", cuda / 1000, (cuda % 1000) / 10);
    printf("| NVIDIA-SMI %-23sDriver Version: %-15sCUDA Version: %-9s|\n", drv, drv, cudas);
    printf("|-----------------------------------------+------------------------+----------------------+\n");
    printf("| GPU  Name                               | Bus-Id                 |         Memory-Usage |\n");
    printf("|=========================================+========================+======================|\n");
    for (unsigned int i = 0; i < n; i++) {
        nvmlDevice_t d;
        nvmlPciInfo_t pci;
        nvmlMemory_t mem;
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = "";
        if (nvmlDeviceGetHandleByIndex_v2(i, &d) != NVML_SUCCESS)
            continue;
        nvmlDeviceGetName(d, name, sizeof name);
        memset(&pci, 0, sizeof pci);
        memset(&mem, 0, sizeof mem);
        nvmlDeviceGetPciInfo_v3(d, &pci);
        nvmlDeviceGetMemoryInfo(d, &mem);
        printf("| %3u  %-34s | %-22s | %5lluMiB / %6lluMiB |\n", i, name, pci.busId,
               mem.used >> 20, mem.total >> 20);
    }
    printf("+-----------------------------------------+------------------------+----------------------+\n");
    return 0;
}

int main(int argc, char **argv)
{
    int rc;
    const char *mode = argc > 1 ? argv[1] : "";
    if (*mode && strcmp(mode, "-L") && strcmp(mode, "--list-gpus") && strcmp(mode, "--version")) {
        fprintf(stderr, "nvidia-smi (simulated): unsupported arguments; use -L, --list-gpus or --version\n");
        return 2;
    }
    if ((rc = init_or_die()))
        return rc;
    if (!strcmp(mode, "--version")) {
        char drv[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = "", nvml[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE] = "";
        int cuda = 0;
        nvmlSystemGetDriverVersion(drv, sizeof drv);
        nvmlSystemGetNVMLVersion(nvml, sizeof nvml);
        nvmlSystemGetCudaDriverVersion_v2(&cuda);
        printf("NVIDIA-SMI version  : %s\nNVML version        : %s\nDRIVER version      : %s\n"
               "CUDA Version        : %d.%d\n", drv, nvml, drv, cuda / 1000, (cuda % 1000) / 10);
    } else if (*mode) {
        rc = list_gpus();
    } else {
        rc = table();
    }
    nvmlShutdown();
    return rc;
}
