/* Simulated libnvidia-ml: answers NVML calls from the files of the driver root
 * it was loaded from, like the real library answers from the kernel driver.
 *
 * Root: its own location (dladdr) minus the library directory, so the same file
 * works loaded from a sim dir on the host (ROOT/usr/lib/x86_64-linux-gnu/...) and
 * inside a chroot/container ("/"). No host path is compiled in.
 *
 * A GPU is visible when ROOT/proc/driver/nvidia/gpus/<busid>/information exists
 * and ROOT/dev/nvidia<minor> is a char device; a MIG device when its gi and ci
 * access files under proc/driver/nvidia/capabilities name nvidia-caps minors whose
 * ROOT/dev/nvidia-caps/nvidia-cap<N> nodes exist. Per-GPU data the kernel would
 * know (brand, cc, arch, memory, MIG layout) is in gpus/<busid>/nvhook-sim, which
 * travels with the gpus/<busid> dir when it is bind-mounted into a container.
 *
 * Compile-time: SIM_DRIVER_VERSION "550.163.01", SIM_CUDA_VERSION 12040.
 * Test knobs (env beats ROOT/etc/nvhook-sim/nvml.conf): NVHOOK_SIM_NVML_DELAY_MS,
 * NVHOOK_SIM_NVML_ERROR (number or name, e.g. 9 or DRIVER_NOT_LOADED).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nvml_sim.h"

#ifndef SIM_DRIVER_VERSION
#define SIM_DRIVER_VERSION "550.163.01"
#endif
#ifndef SIM_CUDA_VERSION
#define SIM_CUDA_VERSION 12040
#endif

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int refcount;
static char root[PATH_MAX];
static char driver_version[64];
sim_gpu sim_gpus[MAX_GPUS];
unsigned int sim_n_gpus;


static const struct { nvmlReturn_t code; const char *name, *text; } errors[] = {
    {NVML_SUCCESS, "SUCCESS", "Success"},
    {NVML_ERROR_UNINITIALIZED, "UNINITIALIZED", "Uninitialized"},
    {NVML_ERROR_INVALID_ARGUMENT, "INVALID_ARGUMENT", "Invalid Argument"},
    {NVML_ERROR_NOT_SUPPORTED, "NOT_SUPPORTED", "Not Supported"},
    {NVML_ERROR_NO_PERMISSION, "NO_PERMISSION", "Insufficient Permissions"},
    {NVML_ERROR_ALREADY_INITIALIZED, "ALREADY_INITIALIZED", "Already Initialized"},
    {NVML_ERROR_NOT_FOUND, "NOT_FOUND", "Not Found"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "INSUFFICIENT_SIZE", "Insufficient Size"},
    {NVML_ERROR_INSUFFICIENT_POWER, "INSUFFICIENT_POWER", "Insufficient External Power"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "DRIVER_NOT_LOADED", "Driver Not Loaded"},
    {NVML_ERROR_TIMEOUT, "TIMEOUT", "Timeout"},
    {NVML_ERROR_IRQ_ISSUE, "IRQ_ISSUE", "Interrupt request issue"},
    {NVML_ERROR_LIBRARY_NOT_FOUND, "LIBRARY_NOT_FOUND", "NVML Shared Library Not Found"},
    {NVML_ERROR_FUNCTION_NOT_FOUND, "FUNCTION_NOT_FOUND", "Function Not Found"},
    {NVML_ERROR_CORRUPTED_INFOROM, "CORRUPTED_INFOROM", "Corrupted infoROM"},
    {NVML_ERROR_GPU_IS_LOST, "GPU_IS_LOST", "GPU is lost"},
    {NVML_ERROR_RESET_REQUIRED, "RESET_REQUIRED", "GPU requires restart"},
    {NVML_ERROR_OPERATING_SYSTEM, "OPERATING_SYSTEM", "The operating system has blocked the request."},
    {NVML_ERROR_LIB_RM_VERSION_MISMATCH, "LIB_RM_VERSION_MISMATCH", "RM has detected an NVML/RM version mismatch."},
    {NVML_ERROR_IN_USE, "IN_USE", "In use by another client"},
    {NVML_ERROR_MEMORY, "MEMORY", "Insufficient Memory"},
    {NVML_ERROR_NO_DATA, "NO_DATA", "No data"},
    {NVML_ERROR_VGPU_ECC_NOT_SUPPORTED, "VGPU_ECC_NOT_SUPPORTED", "The requested vgpu operation is not available on target device, because ECC is enabled"},
    {NVML_ERROR_INSUFFICIENT_RESOURCES, "INSUFFICIENT_RESOURCES", "Insufficient resources"},
    {NVML_ERROR_FREQ_NOT_SUPPORTED, "FREQ_NOT_SUPPORTED", "Frequency not supported"},
    {NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "ARGUMENT_VERSION_MISMATCH", "Argument version mismatch"},
    {NVML_ERROR_DEPRECATED, "DEPRECATED", "Deprecated"},
    {NVML_ERROR_NOT_READY, "NOT_READY", "Not ready"},
    {NVML_ERROR_GPU_NOT_FOUND, "GPU_NOT_FOUND", "GPU not found"},
    {NVML_ERROR_INVALID_STATE, "INVALID_STATE", "Invalid state"},
    {NVML_ERROR_UNKNOWN, "UNKNOWN", "Unknown Error"},
};

/* ---------- small helpers ---------- */

static char *trim(char *s)
{
    while (*s && isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = 0;
    return s;
}

static void copy_str(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src);
}

static void root_path(char *out, size_t n, const char *rel)
{
    /* root is "" for "/" so paths never start with "//". */
    snprintf(out, n, "%s/%s", root, rel);
}

static int is_chardev(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISCHR(st.st_mode);
}

/* Strip the library directory off our own path: what is left is the driver root. */
static void find_root(void)
{
    static const char *libdirs[] = {
        "/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu",
        "/usr/lib/i386-linux-gnu", "/lib/i386-linux-gnu",
        "/usr/lib/aarch64-linux-gnu", "/lib/aarch64-linux-gnu",
        "/usr/lib64", "/lib64", "/usr/lib32", "/lib32", "/usr/lib", "/lib",
    };
    Dl_info info;
    char dir[PATH_MAX] = "";
    const char *override = getenv("NVHOOK_SIM_ROOT");

    root[0] = 0;
    if (override && *override) {
        copy_str(root, sizeof root, override);
    } else if (dladdr((void *)&find_root, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
        if (info.dli_fname[0] != '/') {
            char cwd[PATH_MAX];
            if (!getcwd(cwd, sizeof cwd))
                cwd[0] = 0;
            snprintf(dir, sizeof dir, "%s/%s", cwd, info.dli_fname);
        } else {
            copy_str(dir, sizeof dir, info.dli_fname);
        }
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        /* drop "/./" and trailing "/." from relative loads */
        for (char *p; (p = strstr(dir, "/./"));)
            memmove(p, p + 2, strlen(p + 2) + 1);
        size_t len = strlen(dir);
        if (len >= 2 && !strcmp(dir + len - 2, "/."))
            dir[len - 2] = 0;
        for (size_t i = 0; i < sizeof libdirs / sizeof *libdirs; i++) {
            size_t dl = strlen(dir), ll = strlen(libdirs[i]);
            if (dl >= ll && !strcmp(dir + dl - ll, libdirs[i])) {
                dir[dl - ll] = 0;
                copy_str(root, sizeof root, dir);
                break;
            }
        }
    }
    size_t len = strlen(root);
    while (len && root[len - 1] == '/')
        root[--len] = 0;
}

/* Reads "Key: value" lines; calls fn for each. Returns -1 if the file is missing. */
static int read_kv(const char *path, void (*fn)(void *, const char *, char *), void *arg)
{
    FILE *f = fopen(path, "re");
    char line[512];
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        *colon = 0;
        fn(arg, trim(line), trim(colon + 1));
    }
    fclose(f);
    return 0;
}

static nvmlReturn_t parse_error(const char *s)
{
    if (!s || !*s)
        return NVML_SUCCESS;
    if (isdigit((unsigned char)*s))
        return (nvmlReturn_t)strtoul(s, NULL, 10);
    if (!strncmp(s, "NVML_ERROR_", 11))
        s += 11;
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (!strcasecmp(s, errors[i].name))
            return errors[i].code;
    return NVML_ERROR_UNKNOWN;
}

struct knobs { long delay_ms; nvmlReturn_t error; };

static void knob_line(struct knobs *k, char *line)
{
    char *eq = strchr(line, '=');
    if (!eq || line[0] == '#')
        return;
    *eq = 0;
    char *key = trim(line), *val = trim(eq + 1);
    if (!strcmp(key, "delay_ms"))
        k->delay_ms = strtol(val, NULL, 10);
    else if (!strcmp(key, "error"))
        k->error = parse_error(val);
}

static void read_knobs(struct knobs *k)
{
    char path[PATH_MAX], line[256];
    k->delay_ms = 0;
    k->error = NVML_SUCCESS;
    root_path(path, sizeof path, "etc/nvhook-sim/nvml.conf");
    FILE *f = fopen(path, "re");
    if (f) {
        while (fgets(line, sizeof line, f))
            knob_line(k, line);
        fclose(f);
    }
    const char *d = getenv("NVHOOK_SIM_NVML_DELAY_MS"), *e = getenv("NVHOOK_SIM_NVML_ERROR");
    if (d && *d)
        k->delay_ms = strtol(d, NULL, 10);
    if (e && *e)
        k->error = parse_error(e);
}

/* ---------- loading the driver state ---------- */

static void info_kv(void *arg, const char *key, char *val)
{
    sim_gpu *g = arg;
    if (!strcmp(key, "Model"))
        copy_str(g->name, sizeof g->name, val);
    else if (!strcmp(key, "GPU UUID"))
        copy_str(g->uuid, sizeof g->uuid, val);
    else if (!strcmp(key, "Device Minor"))
        g->minor = (unsigned int)strtoul(val, NULL, 10);
    else if (!strcmp(key, "Bus Location"))
        sscanf(val, "%x:%x:%x", &g->domain, &g->bus, &g->dev);
}

static void sim_kv(void *arg, const char *key, char *val)
{
    sim_gpu *g = arg;
    if (!strcmp(key, "Brand"))
        g->brand = (unsigned int)strtoul(val, NULL, 10);
    else if (!strcmp(key, "Architecture"))
        g->arch = (unsigned int)strtoul(val, NULL, 10);
    else if (!strcmp(key, "ComputeCapability"))
        sscanf(val, "%d.%d", &g->cc_major, &g->cc_minor);
    else if (!strcmp(key, "MemoryMiB"))
        g->memory = strtoull(val, NULL, 10) << 20;
    else if (!strcmp(key, "PciDeviceId"))
        g->pci_device_id = (unsigned int)strtoul(val, NULL, 0);
    else if (!strcmp(key, "PciSubSystemId"))
        g->pci_subsystem_id = (unsigned int)strtoul(val, NULL, 0);
    else if (!strcmp(key, "MigCapable"))
        g->mig_capable = atoi(val);
    else if (!strcmp(key, "MigMode"))
        g->mig_mode = atoi(val);
    else if (!strcmp(key, "MigDevice") && g->n_mig < MAX_MIG) {
        /* MigDevice: <gi> <ci> <memory MiB> <profile> <uuid> */
        sim_mig *m = &g->mig[g->n_mig];
        unsigned long long mib = 0;
        memset(m, 0, sizeof *m);
        if (sscanf(val, "%u %u %llu %31s %95s", &m->gi, &m->ci, &mib, m->profile, m->uuid) == 5) {
            m->memory = mib << 20;
            g->n_mig++;
        }
    }
}

static int cap_minor(const char *rel)
{
    char path[PATH_MAX], line[256];
    int minor = -1;
    root_path(path, sizeof path, rel);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "DeviceFileMinor: %d", &minor) == 1)
            break;
    fclose(f);
    return minor;
}

static int cap_node_present(int minor)
{
    char rel[64], path[PATH_MAX];
    if (minor < 0)
        return 0;
    snprintf(rel, sizeof rel, "dev/nvidia-caps/nvidia-cap%d", minor);
    root_path(path, sizeof path, rel);
    return is_chardev(path);
}

/* Keep only the MIG devices whose gi and ci access nodes are present (dense indexes). */
static void filter_mig(sim_gpu *g)
{
    unsigned int kept = 0;
    for (unsigned int i = 0; i < g->n_mig; i++) {
        sim_mig *m = &g->mig[i];
        char rel[160];
        snprintf(rel, sizeof rel, "proc/driver/nvidia/capabilities/gpu%u/mig/gi%u/access", g->minor, m->gi);
        int gi_ok = cap_node_present(cap_minor(rel));
        snprintf(rel, sizeof rel, "proc/driver/nvidia/capabilities/gpu%u/mig/gi%u/ci%u/access", g->minor, m->gi, m->ci);
        int ci_ok = cap_node_present(cap_minor(rel));
        if (gi_ok && ci_ok)
            g->mig[kept++] = *m;
    }
    g->n_mig = kept;
}

static int cmp_gpu(const void *a, const void *b)
{
    const sim_gpu *x = a, *y = b;
    if (x->domain != y->domain)
        return x->domain < y->domain ? -1 : 1;
    if (x->bus != y->bus)
        return x->bus < y->bus ? -1 : 1;
    return x->dev < y->dev ? -1 : x->dev > y->dev;
}

static nvmlReturn_t load_state(void)
{
    char path[PATH_MAX], line[512];
    FILE *f;

    /* proc/driver/nvidia/version: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.163.01  <date>" */
    root_path(path, sizeof path, "proc/driver/nvidia/version");
    if (!(f = fopen(path, "re")))
        return NVML_ERROR_DRIVER_NOT_LOADED;
    driver_version[0] = 0;
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, "Kernel Module");
        if (!strncmp(line, "NVRM version:", 13) && p) {
            p += strlen("Kernel Module");
            if (!strncmp(p, " for ", 5))   /* open module: "... Kernel Module for x86_64  550..." */
                p = strchr(p + 5, ' ') ? strchr(p + 5, ' ') : p;
            sscanf(p, " %63s", driver_version);
        }
    }
    fclose(f);
    if (!driver_version[0])
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (strcmp(driver_version, SIM_DRIVER_VERSION))
        return NVML_ERROR_LIB_RM_VERSION_MISMATCH;

    sim_n_gpus = 0;
    root_path(path, sizeof path, "proc/driver/nvidia/gpus");
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) && sim_n_gpus < MAX_GPUS) {
            char p[PATH_MAX], node[PATH_MAX], rel[64];
            sim_gpu *g = &sim_gpus[sim_n_gpus];
            if (e->d_name[0] == '.')
                continue;
            memset(g, 0, sizeof *g);
            g->h.magic = SIM_MAGIC_GPU;
            g->arch = NVML_DEVICE_ARCH_UNKNOWN;
            snprintf(p, sizeof p, "%s/%s/information", path, e->d_name);
            if (read_kv(p, info_kv, g) < 0 || !g->uuid[0])
                continue;
            snprintf(rel, sizeof rel, "dev/nvidia%u", g->minor);
            root_path(node, sizeof node, rel);
            if (!is_chardev(node))
                continue;
            snprintf(p, sizeof p, "%s/%s/nvhook-sim", path, e->d_name);
            read_kv(p, sim_kv, g);
            filter_mig(g);
            sim_n_gpus++;
        }
        closedir(d);
    }
    qsort(sim_gpus, sim_n_gpus, sizeof *sim_gpus, cmp_gpu);
    /* parent pointers after sorting moved the structs */
    for (unsigned int i = 0; i < sim_n_gpus; i++)
        for (unsigned int j = 0; j < sim_gpus[i].n_mig; j++) {
            sim_gpus[i].mig[j].h.magic = SIM_MAGIC_MIG;
            sim_gpus[i].mig[j].parent = &sim_gpus[i];
        }
    for (unsigned int i = 0; i < sim_n_gpus; i++)
        sim_mig_layout(&sim_gpus[i]);
    return NVML_SUCCESS;
}

/* ---------- handles ---------- */

static sim_gpu *as_gpu(nvmlDevice_t h)
{
    for (unsigned int i = 0; i < sim_n_gpus; i++)
        if (h == &sim_gpus[i].h)
            return &sim_gpus[i];
    return NULL;
}

static sim_mig *as_mig(nvmlDevice_t h)
{
    for (unsigned int i = 0; i < sim_n_gpus; i++)
        for (unsigned int j = 0; j < sim_gpus[i].n_mig; j++)
            if (h == &sim_gpus[i].mig[j].h)
                return &sim_gpus[i].mig[j];
    return NULL;
}

/* Resolve a handle: the GPU (for a MIG handle, its parent) and the MIG device if any. */
nvmlReturn_t sim_resolve(nvmlDevice_t h, sim_gpu **g, sim_mig **m)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    *m = NULL;
    if ((*g = as_gpu(h)))
        return NVML_SUCCESS;
    if ((*m = as_mig(h))) {
        *g = (*m)->parent;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t sim_initialized(void)
{
    return refcount ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

nvmlReturn_t sim_put_str(char *buf, unsigned int length, const char *s)
{
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

/* ---------- init / shutdown ---------- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    struct knobs k;
    nvmlReturn_t rc = NVML_SUCCESS;
    (void)flags;
    pthread_mutex_lock(&lock);
    if (refcount) {
        refcount++;
        goto out;
    }
    find_root();
    read_knobs(&k);
    if (k.delay_ms > 0) {
        struct timespec ts = {k.delay_ms / 1000, (k.delay_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0)
            ;
    }
    if (k.error != NVML_SUCCESS) {
        rc = k.error;
        goto out;
    }
    rc = load_state();
    if (rc == NVML_SUCCESS)
        refcount = 1;
out:
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (!refcount)
        rc = NVML_ERROR_UNINITIALIZED;
    else
        refcount--;
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].code == result)
            return errors[i].text;
    return "Unknown Error";
}

/* ---------- system ---------- */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    return sim_put_str(version, length, driver_version);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    char buf[80];
    /* The real one is "<cuda major>.<driver version>", e.g. "12.550.163.01". */
    snprintf(buf, sizeof buf, "%d.%s", SIM_CUDA_VERSION / 1000, SIM_DRIVER_VERSION);
    return sim_put_str(version, length, buf);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    if (!v)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = SIM_CUDA_VERSION;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v)
{
    return nvmlSystemGetCudaDriverVersion(v);
}

/* ---------- device enumeration ---------- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = sim_n_gpus;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= sim_n_gpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &sim_gpus[index].h;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < sim_n_gpus; i++) {
        if (!strcmp(sim_gpus[i].uuid, uuid)) {
            *device = &sim_gpus[i].h;
            return NVML_SUCCESS;
        }
        for (unsigned int j = 0; j < sim_gpus[i].n_mig; j++)
            if (!strcmp(sim_gpus[i].mig[j].uuid, uuid)) {
                *device = &sim_gpus[i].mig[j].h;
                return NVML_SUCCESS;
            }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *busId, nvmlDevice_t *device)
{
    unsigned int dom = 0, bus = 0, dev = 0;
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!busId || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (sscanf(busId, "%x:%x:%x", &dom, &bus, &dev) != 3) {
        dom = 0;
        if (sscanf(busId, "%x:%x", &bus, &dev) != 2)
            return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (unsigned int i = 0; i < sim_n_gpus; i++)
        if (sim_gpus[i].domain == dom && sim_gpus[i].bus == bus && sim_gpus[i].dev == dev) {
            *device = &sim_gpus[i].h;
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *busId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(busId, device);
}

/* ---------- device attributes ---------- */

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    RESOLVE(device);
    if (m) {
        char buf[NVML_DEVICE_NAME_V2_BUFFER_SIZE + 40];
        snprintf(buf, sizeof buf, "%s MIG %s", g->name, m->profile);
        return sim_put_str(name, length, buf);
    }
    return sim_put_str(name, length, g->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    RESOLVE(device);
    return sim_put_str(uuid, length, m ? m->uuid : g->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor)
{
    RESOLVE(device);
    if (!minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m)
        return NVML_ERROR_NOT_SUPPORTED;   /* a MIG device has no /dev/nvidiaN of its own */
    *minor = g->minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type)
{
    RESOLVE(device);
    if (!type)
        return NVML_ERROR_INVALID_ARGUMENT;
    *type = (nvmlBrandType_t)g->brand;
    return NVML_SUCCESS;
}

static void fill_legacy_busid(char *out, const sim_gpu *g)
{
    snprintf(out, NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT,
             g->domain, g->bus, g->dev);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    RESOLVE(device);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    fill_legacy_busid(pci->busIdLegacy, g);
    snprintf(pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_FMT, g->domain, g->bus, g->dev);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->dev;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
    return NVML_SUCCESS;
}

static nvmlReturn_t pci_info_legacy(nvmlDevice_t device, nvmlPciInfo_v2_t *pci)
{
    RESOLVE(device);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    fill_legacy_busid(pci->busId, g);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->dev;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_v2_t *pci)
{
    return pci_info_legacy(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_v2_t *pci)
{
    return pci_info_legacy(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    RESOLVE(device);
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    RESOLVE(device);
    if (!arch)
        return NVML_ERROR_INVALID_ARGUMENT;
    *arch = g->arch;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    RESOLVE(device);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = m ? m->memory : g->memory;
    memory->used = 0;
    memory->free = memory->total;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    RESOLVE(device);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = m ? m->memory : g->memory;
    memory->reserved = 0;
    memory->used = 0;
    memory->free = memory->total;
    return NVML_SUCCESS;
}

/* ---------- MIG ---------- */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    RESOLVE(device);
    if (m || !current || !pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = g->mig_mode ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    RESOLVE(device);
    if (m || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* "zero if MIG is not supported or enabled"; 7 is the A100/H100 maximum */
    *count = (g->mig_capable && g->mig_mode) ? (g->n_mig > 7 ? g->n_mig : 7) : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig)
{
    unsigned int max = 0;
    RESOLVE(device);
    if (m || !mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_capable || !g->mig_mode)
        return NVML_ERROR_NOT_SUPPORTED;
    nvmlDeviceGetMaxMigDeviceCount(device, &max);
    if (index >= max)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= g->n_mig)
        return NVML_ERROR_NOT_FOUND;
    *mig = &g->mig[index].h;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMig)
{
    RESOLVE(device);
    if (!isMig)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isMig = m != NULL;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    RESOLVE(device);
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!m)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = m->gi;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    RESOLVE(device);
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!m)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = m->ci;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    RESOLVE(migDevice);
    if (!m || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g->h;
    return NVML_SUCCESS;
}
