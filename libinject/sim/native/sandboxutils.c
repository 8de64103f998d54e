/* Simulated libnvidia-sandboxutils: the entry points NVIDIA's toolkit calls
 * (nvidia-container-toolkit internal/nvsandboxutils: nvSandboxUtilsInit, _Shutdown,
 * _GetDriverVersion, _GetGpuResource, _GetFileContent) with the structs and return codes
 * of NVIDIA's nvsandboxutils.h. It answers from the NVML of its own directory (the
 * simulated libnvidia-ml.so.1, loaded with dlopen as the real library loads NVML) and the
 * files of the driver root Init names (default: the root NVML sees).
 *
 * GetGpuResource lists, for a GPU: /dev/nvidia<minor> and /proc/driver/nvidia/gpus/<bus>
 * (and its DRM nodes where sys/bus/pci/devices/<bus>/drm has them); for a MIG device also
 * its GI and CI capability nodes and access files. Paths are where the files are: under
 * the root Init names ("/srv/sim/dev/nvidia0"; "/dev/nvidia0" for the default "/"), so
 * nvidia-ctk's spec on a simulated host points at its nodes, not the host's. Lists stay valid until nvSandboxUtilsShutdown. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nvml.h"

#define EXPORT __attribute__((visibility("default")))
#define INPUT_LENGTH 256

typedef enum {
    NVSANDBOXUTILS_SUCCESS = 0,
    NVSANDBOXUTILS_ERROR_UNINITIALIZED = 1,
    NVSANDBOXUTILS_ERROR_NOT_SUPPORTED = 2,
    NVSANDBOXUTILS_ERROR_INVALID_ARG = 3,
    NVSANDBOXUTILS_ERROR_INSUFFICIENT_SIZE = 4,
    NVSANDBOXUTILS_ERROR_VERSION_NOT_SUPPORTED = 5,
    NVSANDBOXUTILS_ERROR_LIBRARY_LOAD = 6,
    NVSANDBOXUTILS_ERROR_FUNCTION_NOT_FOUND = 7,
    NVSANDBOXUTILS_ERROR_DEVICE_NOT_FOUND = 8,
    NVSANDBOXUTILS_ERROR_NVML_LIB_CALL = 9,
    NVSANDBOXUTILS_ERROR_OUT_OF_MEMORY = 10,
    NVSANDBOXUTILS_ERROR_FILEPATH_NOT_FOUND = 11,
    NVSANDBOXUTILS_ERROR_UNKNOWN = 0xFFFF,
} nvSandboxUtilsRet_t;

typedef enum { NV_ROOTFS_DEFAULT, NV_ROOTFS_PATH, NV_ROOTFS_PID } nvSandboxUtilsRootfsInputType_t;
typedef enum { NV_DEV, NV_PROC, NV_SYS } nvSandboxUtilsFileType_t;
typedef enum {
    NV_DEV_NVIDIA, NV_DEV_DRI_CARD, NV_DEV_DRI_RENDERD, NV_DEV_DRI_CARD_SYMLINK,
    NV_DEV_DRI_RENDERD_SYMLINK, NV_DEV_NVIDIA_UVM, NV_DEV_NVIDIA_UVM_TOOLS,
    NV_DEV_NVIDIA_MODESET, NV_DEV_NVIDIA_CTL, NV_DEV_GDRDRV, NV_DEV_NVIDIA_CAPS_NVIDIA_CAP,
    NV_PROC_DRIVER_NVIDIA_GPUS_PCIBUSID, NV_PROC_DRIVER_NVIDIA_GPUS, NV_PROC_NVIDIA_PARAMS,
    NV_PROC_NVIDIA_CAPS_MIG_MINORS, NV_PROC_DRIVER_NVIDIA_CAPABILITIES_GPU,
    NV_PROC_DRIVER_NVIDIA_CAPABILITIES, NV_PROC_DRIVER_NVIDIA_CAPABILITIIES_GPU_MIG_CI_ACCESS,
    NV_SYS_MODULE_NVIDIA_DRIVER_PCIBUSID, NV_SYS_MODULE_NVIDIA_DRIVER, NV_NUM_SUBTYPE,
} nvSandboxUtilsFileSystemSubType_t;
typedef enum { NV_GPU, NV_MIG, NV_DRIVER_NVIDIA, NV_DRIVER_NVIDIA_UVM, NV_DRIVER_NVIDIA_MODESET,
               NV_DRIVER_GDRDRV, NV_SYSTEM } nvSandboxUtilsFileModule_t;
typedef enum { NV_FILE_FLAG_HINT = 1, NV_FILE_FLAG_MASKOUT = 2, NV_FILE_FLAG_CONTENT = 4,
               NV_FILE_FLAG_DEPRECTATED = 8, NV_FILE_FLAG_CANDIDATES = 16 } nvSandboxUtilsFileFlag_t;
typedef enum { NV_GPU_INPUT_GPU_UUID, NV_GPU_INPUT_MIG_UUID, NV_GPU_INPUT_PCI_ID,
               NV_GPU_INPUT_PCI_INDEX } nvSandboxUtilsGpuInputType_t;

typedef struct {
    unsigned int version;
    nvSandboxUtilsRootfsInputType_t type;
    char value[INPUT_LENGTH];
} nvSandboxUtilsInitInput_t;

typedef struct nvSandboxUtilsGpuFileInfo_v1_t {
    struct nvSandboxUtilsGpuFileInfo_v1_t *next;
    nvSandboxUtilsFileType_t fileType;
    nvSandboxUtilsFileSystemSubType_t fileSubType;
    nvSandboxUtilsFileModule_t module;
    nvSandboxUtilsFileFlag_t flags;
    char *filePath;
} nvSandboxUtilsGpuFileInfo_v1_t;

typedef struct {
    unsigned int version;
    nvSandboxUtilsGpuInputType_t inputType;
    char input[INPUT_LENGTH];
    nvSandboxUtilsGpuFileInfo_v1_t *files;
} nvSandboxUtilsGpuRes_t;

/* The NVML calls used, looked up in the NVML next to this library. */
static struct {
    void *handle;
    nvmlReturn_t (*init)(void);
    nvmlReturn_t (*shutdown)(void);
    nvmlReturn_t (*driver_version)(char *, unsigned int);
    nvmlReturn_t (*by_uuid)(const char *, nvmlDevice_t *);
    nvmlReturn_t (*by_bus)(const char *, nvmlDevice_t *);
    nvmlReturn_t (*by_index)(unsigned int, nvmlDevice_t *);
    nvmlReturn_t (*minor)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*pci)(nvmlDevice_t, nvmlPciInfo_t *);
    nvmlReturn_t (*parent)(nvmlDevice_t, nvmlDevice_t *);
    nvmlReturn_t (*is_mig)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*gi_id)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*ci_id)(nvmlDevice_t, unsigned int *);
} nvml;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static char rootfs[PATH_MAX];      /* "" for "/" */
/* Every list handed out, freed at shutdown. */
struct held {
    struct held *next;
    nvSandboxUtilsGpuFileInfo_v1_t *list;
};
static struct held *held;

static void *open_nvml(void)
{
    Dl_info info;
    char path[PATH_MAX];
    if (dladdr((void *)&open_nvml, &info) && info.dli_fname && strrchr(info.dli_fname, '/')) {
        snprintf(path, sizeof path, "%.*s/libnvidia-ml.so.1",
                 (int)(strrchr(info.dli_fname, '/') - info.dli_fname), info.dli_fname);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
    }
    return dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
}

static int load_nvml(void)
{
    if (!(nvml.handle = open_nvml()))
        return -1;
#define SYM(field, name) if (!(*(void **)&nvml.field = dlsym(nvml.handle, name))) return -1
    SYM(init, "nvmlInit_v2");
    SYM(shutdown, "nvmlShutdown");
    SYM(driver_version, "nvmlSystemGetDriverVersion");
    SYM(by_uuid, "nvmlDeviceGetHandleByUUID");
    SYM(by_bus, "nvmlDeviceGetHandleByPciBusId_v2");
    SYM(by_index, "nvmlDeviceGetHandleByIndex_v2");
    SYM(minor, "nvmlDeviceGetMinorNumber");
    SYM(pci, "nvmlDeviceGetPciInfo_v3");
    SYM(parent, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    SYM(is_mig, "nvmlDeviceIsMigDeviceHandle");
    SYM(gi_id, "nvmlDeviceGetGpuInstanceId");
    SYM(ci_id, "nvmlDeviceGetComputeInstanceId");
#undef SYM
    return 0;
}

static void free_list(nvSandboxUtilsGpuFileInfo_v1_t *f)
{
    while (f) {
        nvSandboxUtilsGpuFileInfo_v1_t *next = f->next;
        free(f->filePath);
        free(f);
        f = next;
    }
}

EXPORT nvSandboxUtilsRet_t nvSandboxUtilsInit(nvSandboxUtilsInitInput_t *input)
{
    nvSandboxUtilsRet_t rc = NVSANDBOXUTILS_SUCCESS;
    struct stat st;
    if (!input)
        return NVSANDBOXUTILS_ERROR_INVALID_ARG;
    if (input->version != 1)
        return NVSANDBOXUTILS_ERROR_VERSION_NOT_SUPPORTED;
    if (input->type == NV_ROOTFS_PID)
        return NVSANDBOXUTILS_ERROR_NOT_SUPPORTED;
    if (input->type != NV_ROOTFS_DEFAULT && input->type != NV_ROOTFS_PATH)
        return NVSANDBOXUTILS_ERROR_INVALID_ARG;
    pthread_mutex_lock(&lock);
    if (initialized)
        goto out;
    rootfs[0] = 0;
    if (input->type == NV_ROOTFS_PATH && input->value[0]) {
        size_t n = strnlen(input->value, INPUT_LENGTH);
        if (n == INPUT_LENGTH || input->value[0] != '/' || stat(input->value, &st) || !S_ISDIR(st.st_mode)) {
            rc = NVSANDBOXUTILS_ERROR_INVALID_ARG;
            goto out;
        }
        snprintf(rootfs, sizeof rootfs, "%.*s", (int)n, input->value);
        while ((n = strlen(rootfs)) && rootfs[n - 1] == '/')
            rootfs[n - 1] = 0;
    }
    if (!nvml.handle && load_nvml() < 0) {
        rc = NVSANDBOXUTILS_ERROR_LIBRARY_LOAD;
        goto out;
    }
    if (nvml.init() != NVML_SUCCESS) {
        rc = NVSANDBOXUTILS_ERROR_NVML_LIB_CALL;
        goto out;
    }
    initialized = 1;
out:
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT nvSandboxUtilsRet_t nvSandboxUtilsShutdown(void)
{
    pthread_mutex_lock(&lock);
    if (initialized) {
        nvml.shutdown();
        initialized = 0;
    }
    while (held) {
        struct held *next = held->next;
        free_list(held->list);
        free(held);
        held = next;
    }
    pthread_mutex_unlock(&lock);
    return NVSANDBOXUTILS_SUCCESS;
}

EXPORT nvSandboxUtilsRet_t nvSandboxUtilsGetDriverVersion(char *version, unsigned int length)
{
    if (!version)
        return NVSANDBOXUTILS_ERROR_INVALID_ARG;
    if (!initialized)
        return NVSANDBOXUTILS_ERROR_UNINITIALIZED;
    nvmlReturn_t r = nvml.driver_version(version, length);
    if (r == NVML_ERROR_INSUFFICIENT_SIZE)
        return NVSANDBOXUTILS_ERROR_INSUFFICIENT_SIZE;
    return r == NVML_SUCCESS ? NVSANDBOXUTILS_SUCCESS : NVSANDBOXUTILS_ERROR_NVML_LIB_CALL;
}

static int exists(const char *rel, int follow)
{
    char p[PATH_MAX];
    struct stat st;
    snprintf(p, sizeof p, "%s%s", rootfs, rel);
    return (follow ? stat(p, &st) : lstat(p, &st)) == 0;
}

/* Appends a node to the list being built (kept in request order). */
static int add(nvSandboxUtilsGpuFileInfo_v1_t ***tail, nvSandboxUtilsFileType_t type,
               nvSandboxUtilsFileSystemSubType_t sub, nvSandboxUtilsFileModule_t module,
               nvSandboxUtilsFileFlag_t flags, const char *path)
{
    char full[PATH_MAX];
    snprintf(full, sizeof full, "%s%s", rootfs, path);
    nvSandboxUtilsGpuFileInfo_v1_t *f = calloc(1, sizeof *f);
    if (!f || !(f->filePath = strdup(full))) {
        free(f);
        return -1;
    }
    f->fileType = type;
    f->fileSubType = sub;
    f->module = module;
    f->flags = flags;
    **tail = f;
    *tail = &f->next;
    return 0;
}

/* "DeviceFileMinor: N" of a capability's access file, or -1. */
static int cap_minor(const char *rel)
{
    char p[PATH_MAX], line[128];
    int minor = -1;
    snprintf(p, sizeof p, "%s%s", rootfs, rel);
    FILE *f = fopen(p, "re");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "DeviceFileMinor: %d", &minor) == 1)
            break;
    fclose(f);
    return minor;
}

static int add_drm(nvSandboxUtilsGpuFileInfo_v1_t ***tail, const char *bus)
{
    char dir[PATH_MAX], node[PATH_MAX + 300];
    snprintf(dir, sizeof dir, "%s/sys/bus/pci/devices/%s/drm", rootfs, bus);
    DIR *d = opendir(dir);
    struct dirent *e;
    if (!d)
        return 0;
    while ((e = readdir(d))) {
        int card = !strncmp(e->d_name, "card", 4), render = !strncmp(e->d_name, "renderD", 7);
        if (!card && !render)
            continue;
        snprintf(node, sizeof node, "/dev/dri/%s", e->d_name);
        if (exists(node, 0) && add(tail, NV_DEV, card ? NV_DEV_DRI_CARD : NV_DEV_DRI_RENDERD, NV_GPU, 0, node) < 0)
            goto fail;
        snprintf(node, sizeof node, "/dev/dri/by-path/pci-%s-%s", bus, card ? "card" : "render");
        if (exists(node, 0) && add(tail, NV_DEV, card ? NV_DEV_DRI_CARD_SYMLINK : NV_DEV_DRI_RENDERD_SYMLINK,
                                   NV_GPU, NV_FILE_FLAG_CONTENT, node) < 0)
            goto fail;
    }
    closedir(d);
    return 0;
fail:
    closedir(d);
    return -1;
}

EXPORT nvSandboxUtilsRet_t nvSandboxUtilsGetGpuResource(nvSandboxUtilsGpuRes_t *request)
{
    nvmlDevice_t dev, gpu;
    unsigned int minor, is_mig = 0, gi = 0, ci = 0;
    nvmlPciInfo_t pci;
    char input[INPUT_LENGTH + 1], path[PATH_MAX], bus[32];
    nvSandboxUtilsGpuFileInfo_v1_t *head = NULL, **tail = &head;
    nvmlReturn_t r;

    if (!request)
        return NVSANDBOXUTILS_ERROR_INVALID_ARG;
    if (request->version != 1)
        return NVSANDBOXUTILS_ERROR_VERSION_NOT_SUPPORTED;
    if (!initialized)
        return NVSANDBOXUTILS_ERROR_UNINITIALIZED;
    snprintf(input, sizeof input, "%.*s", INPUT_LENGTH, request->input);
    switch (request->inputType) {
    case NV_GPU_INPUT_GPU_UUID:
    case NV_GPU_INPUT_MIG_UUID:
        r = nvml.by_uuid(input, &dev);
        break;
    case NV_GPU_INPUT_PCI_ID:
        r = nvml.by_bus(input, &dev);
        break;
    case NV_GPU_INPUT_PCI_INDEX:
        r = nvml.by_index((unsigned int)strtoul(input, NULL, 10), &dev);
        break;
    default:
        return NVSANDBOXUTILS_ERROR_INVALID_ARG;
    }
    if (r != NVML_SUCCESS)
        return NVSANDBOXUTILS_ERROR_INVALID_ARG;    /* "input doesn't match any device" */
    gpu = dev;
    if (nvml.is_mig(dev, &is_mig) != NVML_SUCCESS)
        return NVSANDBOXUTILS_ERROR_NVML_LIB_CALL;
    if ((request->inputType == NV_GPU_INPUT_MIG_UUID) != (is_mig != 0))
        return NVSANDBOXUTILS_ERROR_INVALID_ARG;
    if (is_mig && (nvml.parent(dev, &gpu) != NVML_SUCCESS || nvml.gi_id(dev, &gi) != NVML_SUCCESS ||
                   nvml.ci_id(dev, &ci) != NVML_SUCCESS))
        return NVSANDBOXUTILS_ERROR_NVML_LIB_CALL;
    if (nvml.minor(gpu, &minor) != NVML_SUCCESS || nvml.pci(gpu, &pci) != NVML_SUCCESS)
        return NVSANDBOXUTILS_ERROR_NVML_LIB_CALL;
    snprintf(bus, sizeof bus, "%04x:%02x:%02x.0", pci.domain, pci.bus, pci.device);

    pthread_mutex_lock(&lock);
    snprintf(path, sizeof path, "/dev/nvidia%u", minor);
    if (add(&tail, NV_DEV, NV_DEV_NVIDIA, NV_GPU, 0, path) < 0)
        goto oom;
    snprintf(path, sizeof path, "/proc/driver/nvidia/gpus/%s", bus);
    if (add(&tail, NV_PROC, NV_PROC_DRIVER_NVIDIA_GPUS_PCIBUSID, NV_GPU, 0, path) < 0)
        goto oom;
    if (is_mig) {
        char access[PATH_MAX];
        const char *levels[2] = {"", ""};
        char ci_part[32];
        snprintf(ci_part, sizeof ci_part, "/ci%u", ci);
        levels[1] = ci_part;
        for (int i = 0; i < 2; i++) {
            snprintf(access, sizeof access, "/proc/driver/nvidia/capabilities/gpu%u/mig/gi%u%s/access",
                     minor, gi, levels[i]);
            int cap = cap_minor(access);
            if (cap < 0)
                continue;
            snprintf(path, sizeof path, "/dev/nvidia-caps/nvidia-cap%d", cap);
            if (add(&tail, NV_DEV, NV_DEV_NVIDIA_CAPS_NVIDIA_CAP, NV_MIG, 0, path) < 0)
                goto oom;
            if (i == 1 && add(&tail, NV_PROC, NV_PROC_DRIVER_NVIDIA_CAPABILITIIES_GPU_MIG_CI_ACCESS, NV_MIG, 0,
                              access) < 0)
                goto oom;
        }
    } else if (add_drm(&tail, bus) < 0) {
        goto oom;
    }
    struct held *keep = calloc(1, sizeof *keep);
    if (!keep)
        goto oom;
    keep->list = head;
    keep->next = held;
    held = keep;
    pthread_mutex_unlock(&lock);
    request->files = head;
    return NVSANDBOXUTILS_SUCCESS;
oom:
    pthread_mutex_unlock(&lock);
    free_list(head);
    return NVSANDBOXUTILS_ERROR_OUT_OF_MEMORY;
}

EXPORT nvSandboxUtilsRet_t nvSandboxUtilsGetFileContent(char *filePath, char *content, unsigned int *contentSize)
{
    char p[PATH_MAX], buf[4096];
    struct stat st;
    ssize_t n;
    if (!filePath || !content || !contentSize)
        return NVSANDBOXUTILS_ERROR_INVALID_ARG;
    if (!initialized)
        return NVSANDBOXUTILS_ERROR_UNINITIALIZED;
    /* a path as answered (under the root) is read as it is */
    size_t rl = strlen(rootfs);
    int under = rl && !strncmp(filePath, rootfs, rl) && filePath[rl] == '/';
    snprintf(p, sizeof p, "%s%s", under ? "" : rootfs, filePath);
    if (lstat(p, &st) != 0)
        return NVSANDBOXUTILS_ERROR_FILEPATH_NOT_FOUND;
    if (S_ISLNK(st.st_mode)) {
        /* a symlink's content is the name it links to */
        if ((n = readlink(p, buf, sizeof buf - 1)) < 0)
            return NVSANDBOXUTILS_ERROR_FILEPATH_NOT_FOUND;
    } else {
        FILE *f = fopen(p, "re");
        if (!f)
            return NVSANDBOXUTILS_ERROR_FILEPATH_NOT_FOUND;
        n = (ssize_t)fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
    }
    buf[n] = 0;
    if ((unsigned int)n + 1 > *contentSize) {
        *contentSize = (unsigned int)n + 1;
        return NVSANDBOXUTILS_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(content, buf, (size_t)n + 1);
    *contentSize = (unsigned int)n + 1;
    return NVSANDBOXUTILS_SUCCESS;
}
