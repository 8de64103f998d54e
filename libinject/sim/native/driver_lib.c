/* A simulated NVIDIA driver library: a real ELF shared object whose SONAME and
 * file name match the real one (set at link time), carrying its identity.
 * -DSIM_LIB="libcuda" -DSIM_DRIVER_VERSION="550.163.01" -DSIM_CUDA_VERSION=12040;
 * -DSIM_LIBCUDA adds the two CUDA driver API calls tools probe first;
 * -DSIM_LIBGLX (libGLX_nvidia) a Vulkan ICD. */
#ifdef SIM_LIBGLX
#define _GNU_SOURCE     /* secure_getenv */
#endif
#define EXPORT __attribute__((visibility("default")))

EXPORT const char nvhook_sim_library[] = SIM_LIB;
EXPORT const char nvhook_sim_driver_version[] = SIM_DRIVER_VERSION;

#ifdef SIM_LIBCUDA
typedef int CUresult;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NO_DEVICE 100

/* No GPU can really run anything here: cuInit reports no device. */
EXPORT CUresult cuInit(unsigned int flags)
{
    (void)flags;
    return CUDA_ERROR_NO_DEVICE;
}

EXPORT CUresult cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = SIM_CUDA_VERSION;
    return CUDA_SUCCESS;
}
#endif

#ifdef SIM_LIBGLX
/* A minimal Vulkan ICD, so that a real Vulkan loader reading nvidia_icd.json finds,
 * loads and uses this library (loader-ICD interface version 5). Its physical devices
 * are the GPUs listed under /proc/driver/nvidia/gpus when vkEnumeratePhysicalDevices is
 * first called on an instance: inside a container that is the injected GPUs only, as
 * nvhook masks the rest. NVHOOK_SIM_PROCFS names another dir in place of
 * /proc/driver/nvidia (for tests on a host without the driver). It has every command
 * the loader requires of a driver (Vulkan 1.0's instance-level ones) and
 * VK_EXT_pci_bus_info, but nothing can run: no queue families, no formats, and
 * vkCreateDevice fails. Declared here without
 * Vulkan's headers. -DSIM_VK_DRIVER_VERSION: the driver version in NVIDIA's encoding. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int32_t VkResult;
#define VK_SUCCESS 0
#define VK_INCOMPLETE 5
#define VK_ERROR_OUT_OF_HOST_MEMORY (-1)
#define VK_ERROR_INITIALIZATION_FAILED (-3)
#define VK_ERROR_LAYER_NOT_PRESENT (-6)
#define VK_ERROR_FORMAT_NOT_SUPPORTED (-11)
#define VK_MEMORY_HEAP_DEVICE_LOCAL_BIT 1
#define VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT 1
#define VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU 2
#define VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PCI_BUS_INFO_PROPERTIES_EXT 1000212000
#define SIM_VK_API_VERSION ((1u << 22) | (3u << 12) | 277u)     /* 1.3.277 */
#define SIM_VK_VENDOR_ID 0x10DE
/* The loader checks that dispatchable objects an ICD makes start with this, then
 * stores its dispatch table pointer there. */
#define ICD_LOADER_MAGIC 0x01CDC0DE
#define SIM_VK_MAX_GPUS 64
#define SIM_VK_NAME_SIZE 256                                    /* VK_MAX_PHYSICAL_DEVICE_NAME_SIZE */

typedef void (*PFN_vkVoidFunction)(void);
typedef uint64_t VkDeviceSize;

typedef struct {
    char extensionName[256];
    uint32_t specVersion;
} VkExtensionProperties;

/* VkPhysicalDeviceLimits: Vulkan's 106 members as the runs of 4-byte ones (uint32_t,
 * int32_t, float, VkBool32, VkSampleCountFlags: one alignment) between the 8-byte ones,
 * which gives the header's layout on every ABI. */
typedef struct {
    uint32_t a[11];                 /* maxImageDimension1D .. maxSamplerAllocationCount */
    VkDeviceSize b[2];              /* bufferImageGranularity, sparseAddressSpaceSize */
    uint32_t c[59];                 /* maxBoundDescriptorSets .. viewportSubPixelBits */
    size_t minMemoryMapAlignment;
    VkDeviceSize d[3];              /* min{Texel,Uniform,Storage}BufferOffsetAlignment */
    uint32_t e[35];                 /* minTexelOffset .. standardSampleLocations */
    VkDeviceSize f[3];              /* optimalBufferCopy*Alignment, nonCoherentAtomSize */
} VkPhysicalDeviceLimits;

typedef struct {
    uint32_t apiVersion;
    uint32_t driverVersion;
    uint32_t vendorID;
    uint32_t deviceID;
    int32_t deviceType;
    char deviceName[SIM_VK_NAME_SIZE];
    uint8_t pipelineCacheUUID[16];
    VkPhysicalDeviceLimits limits;
    uint32_t sparseProperties[5];   /* VkPhysicalDeviceSparseProperties: 5 VkBool32 */
} VkPhysicalDeviceProperties;

typedef struct {
    int32_t sType;
    void *pNext;
    VkPhysicalDeviceProperties properties;
} VkPhysicalDeviceProperties2;

typedef struct VkBaseOutStructure {
    int32_t sType;
    struct VkBaseOutStructure *pNext;
} VkBaseOutStructure;

typedef struct {
    int32_t sType;
    void *pNext;
    uint32_t pci[4];                /* pciDomain, pciBus, pciDevice, pciFunction */
} VkPhysicalDevicePCIBusInfoPropertiesEXT;

typedef struct {
    uint32_t memoryTypeCount;
    struct { uint32_t propertyFlags, heapIndex; } memoryTypes[32];
    uint32_t memoryHeapCount;
    struct { VkDeviceSize size; uint32_t flags; } memoryHeaps[16];
} VkPhysicalDeviceMemoryProperties;

typedef struct { uint32_t features[55]; } VkPhysicalDeviceFeatures;    /* 55 VkBool32 */
typedef struct { uint32_t linear, optimal, buffer; } VkFormatProperties;

#ifdef __x86_64__
_Static_assert(sizeof(VkPhysicalDeviceLimits) == 504, "VkPhysicalDeviceLimits layout");
_Static_assert(sizeof(VkPhysicalDeviceProperties) == 824, "VkPhysicalDeviceProperties layout");
_Static_assert(sizeof(VkPhysicalDeviceMemoryProperties) == 520, "VkPhysicalDeviceMemoryProperties layout");
#endif

typedef struct {
    uintptr_t loader_magic;         /* first: the loader's dispatch slot */
    char name[SIM_VK_NAME_SIZE];
    uint32_t device_id;
    uint64_t memory_mib;
    uint32_t pci[4];                /* domain, bus, device, function */
} SimPhysicalDevice;

typedef struct {
    uintptr_t loader_magic;
    int scanned;
    uint32_t count;
    SimPhysicalDevice gpus[SIM_VK_MAX_GPUS];
} SimInstance;

typedef SimInstance *VkInstance;
typedef SimPhysicalDevice *VkPhysicalDevice;

static pthread_mutex_t scan_lock = PTHREAD_MUTEX_INITIALIZER;

/* path's first size-1 bytes, NUL-terminated; -1 if it cannot be read. */
static ssize_t read_text(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t len = 0;
    while (len < size - 1) {
        ssize_t n = read(fd, buf + len, size - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    return (ssize_t)len;
}

/* The value of the "key" line of procfs-style text ("Model: \t\t NVIDIA ..."), blanks
 * around it dropped, into out; 0 if there is no such line. */
static int text_field(const char *text, const char *key, char *out, size_t size)
{
    size_t klen = strlen(key);
    for (const char *line = text; *line; ) {
        const char *end = strchr(line, '\n');
        if (!end)
            end = line + strlen(line);
        if (!strncmp(line, key, klen)) {
            const char *v = line + klen;
            while (v < end && (*v == ' ' || *v == '\t'))
                v++;
            const char *e = end;
            while (e > v && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
                e--;
            size_t n = (size_t)(e - v) < size - 1 ? (size_t)(e - v) : size - 1;
            memcpy(out, v, n);
            out[n] = '\0';
            return 1;
        }
        line = *end ? end + 1 : end;
    }
    return 0;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* The GPUs of <procfs>/gpus/<bus id>/, in bus id (= PCI) order. */
static void scan_gpus(SimInstance *inst)
{
    const char *procfs = secure_getenv("NVHOOK_SIM_PROCFS");
    char dir[4096], path[4096 + 512], text[4096];
    char names[SIM_VK_MAX_GPUS][64];
    uint32_t n = 0;

    snprintf(dir, sizeof dir, "%s/gpus", procfs && *procfs ? procfs : "/proc/driver/nvidia");
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *e; n < SIM_VK_MAX_GPUS && (e = readdir(d)); )
        if (e->d_name[0] != '.' && strlen(e->d_name) < sizeof names[0])
            strcpy(names[n++], e->d_name);
    closedir(d);
    qsort(names, n, sizeof names[0], compare_names);
    for (uint32_t i = 0; i < n; i++) {
        SimPhysicalDevice *g = &inst->gpus[inst->count];
        snprintf(path, sizeof path, "%s/%s/information", dir, names[i]);
        if (read_text(path, text, sizeof text) < 0 || !text_field(text, "Model:", g->name, sizeof g->name))
            continue;
        /* The simulated kernel's data beside it: PciDeviceId is device << 16 | vendor. */
        char value[32];
        snprintf(path, sizeof path, "%s/%s/nvhook-sim", dir, names[i]);
        if (read_text(path, text, sizeof text) >= 0) {
            if (text_field(text, "PciDeviceId:", value, sizeof value))
                g->device_id = (uint32_t)(strtoul(value, NULL, 16) >> 16);
            if (text_field(text, "MemoryMiB:", value, sizeof value))
                g->memory_mib = strtoull(value, NULL, 10);
        }
        unsigned dom, bus, dev, fn;
        if (sscanf(names[i], "%x:%x:%x.%x", &dom, &bus, &dev, &fn) == 4)
            g->pci[0] = dom, g->pci[1] = bus, g->pci[2] = dev, g->pci[3] = fn;
        g->loader_magic = ICD_LOADER_MAGIC;
        inst->count++;
    }
}

static VkResult sim_vkCreateInstance(const void *create_info, const void *allocator, VkInstance *instance)
{
    (void)create_info, (void)allocator;
    SimInstance *inst = calloc(1, sizeof *inst);
    if (!inst)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    inst->loader_magic = ICD_LOADER_MAGIC;
    *instance = inst;
    return VK_SUCCESS;
}

static void sim_vkDestroyInstance(VkInstance instance, const void *allocator)
{
    (void)allocator;
    free(instance);
}

static VkResult sim_vkEnumerateInstanceExtensionProperties(const char *layer, uint32_t *count,
                                                           VkExtensionProperties *props)
{
    (void)props;
    if (layer)
        return VK_ERROR_LAYER_NOT_PRESENT;
    *count = 0;
    return VK_SUCCESS;
}

static VkResult sim_vkEnumerateInstanceVersion(uint32_t *version)
{
    *version = SIM_VK_API_VERSION;
    return VK_SUCCESS;
}

static VkResult sim_vkEnumeratePhysicalDevices(VkInstance instance, uint32_t *count, VkPhysicalDevice *devices)
{
    /* Scanned once per instance: the loader keeps the handles (and writes into them). */
    pthread_mutex_lock(&scan_lock);
    if (!instance->scanned) {
        scan_gpus(instance);
        instance->scanned = 1;
    }
    pthread_mutex_unlock(&scan_lock);
    if (!devices) {
        *count = instance->count;
        return VK_SUCCESS;
    }
    uint32_t n = *count < instance->count ? *count : instance->count;
    for (uint32_t i = 0; i < n; i++)
        devices[i] = &instance->gpus[i];
    *count = n;
    return n < instance->count ? VK_INCOMPLETE : VK_SUCCESS;
}

static void sim_vkGetPhysicalDeviceProperties(VkPhysicalDevice gpu, VkPhysicalDeviceProperties *props)
{
    memset(props, 0, sizeof *props);
    props->apiVersion = SIM_VK_API_VERSION;
    props->driverVersion = SIM_VK_DRIVER_VERSION;
    props->vendorID = SIM_VK_VENDOR_ID;
    props->deviceID = gpu->device_id;
    props->deviceType = VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
    memcpy(props->deviceName, gpu->name, sizeof props->deviceName);
}

/* VK_EXT_pci_bus_info only: with it the loader sorts the devices in PCI order, as it
 * does a real driver's. */
static VkResult sim_vkEnumerateDeviceExtensionProperties(VkPhysicalDevice gpu, const char *layer, uint32_t *count,
                                                         VkExtensionProperties *props)
{
    (void)gpu;
    if (layer)
        return VK_ERROR_LAYER_NOT_PRESENT;
    if (!props) {
        *count = 1;
        return VK_SUCCESS;
    }
    if (*count < 1)
        return VK_INCOMPLETE;
    memset(&props[0], 0, sizeof props[0]);
    strcpy(props[0].extensionName, "VK_EXT_pci_bus_info");
    props[0].specVersion = 2;
    *count = 1;
    return VK_SUCCESS;
}

/* vkGetPhysicalDeviceProperties2(KHR): the properties, and the PCI address for a
 * VkPhysicalDevicePCIBusInfoPropertiesEXT in the pNext chain. */
static void sim_vkGetPhysicalDeviceProperties2(VkPhysicalDevice gpu, VkPhysicalDeviceProperties2 *props)
{
    sim_vkGetPhysicalDeviceProperties(gpu, &props->properties);
    for (VkBaseOutStructure *s = props->pNext; s; s = s->pNext)
        if (s->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PCI_BUS_INFO_PROPERTIES_EXT) {
            VkPhysicalDevicePCIBusInfoPropertiesEXT *pci = (VkPhysicalDevicePCIBusInfoPropertiesEXT *)s;
            memcpy(pci->pci, gpu->pci, sizeof pci->pci);
        }
}

static void sim_vkGetPhysicalDeviceQueueFamilyProperties(VkPhysicalDevice gpu, uint32_t *count, void *props)
{
    (void)gpu, (void)props;
    *count = 0;
}

/* The GPU's memory as one device-local heap, as the NVML mock reports it. */
static void sim_vkGetPhysicalDeviceMemoryProperties(VkPhysicalDevice gpu, VkPhysicalDeviceMemoryProperties *props)
{
    memset(props, 0, sizeof *props);
    props->memoryTypeCount = 1;
    props->memoryTypes[0].propertyFlags = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    props->memoryHeapCount = 1;
    props->memoryHeaps[0].size = gpu->memory_mib << 20;
    props->memoryHeaps[0].flags = VK_MEMORY_HEAP_DEVICE_LOCAL_BIT;
}

static void sim_vkGetPhysicalDeviceFeatures(VkPhysicalDevice gpu, VkPhysicalDeviceFeatures *features)
{
    (void)gpu;
    memset(features, 0, sizeof *features);
}

static void sim_vkGetPhysicalDeviceFormatProperties(VkPhysicalDevice gpu, int32_t format, VkFormatProperties *props)
{
    (void)gpu, (void)format;
    memset(props, 0, sizeof *props);
}

static VkResult sim_vkGetPhysicalDeviceImageFormatProperties(VkPhysicalDevice gpu, int32_t format, int32_t type,
                                                             int32_t tiling, uint32_t usage, uint32_t flags,
                                                             void *props)
{
    (void)gpu, (void)format, (void)type, (void)tiling, (void)usage, (void)flags, (void)props;
    return VK_ERROR_FORMAT_NOT_SUPPORTED;
}

static void sim_vkGetPhysicalDeviceSparseImageFormatProperties(VkPhysicalDevice gpu, int32_t format, int32_t type,
                                                               int32_t samples, uint32_t usage, int32_t tiling,
                                                               uint32_t *count, void *props)
{
    (void)gpu, (void)format, (void)type, (void)samples, (void)usage, (void)tiling, (void)props;
    *count = 0;
}

/* No GPU can really run anything here (as cuInit reports no device). */
static VkResult sim_vkCreateDevice(VkPhysicalDevice gpu, const void *create_info, const void *allocator, void **device)
{
    (void)gpu, (void)create_info, (void)allocator, (void)device;
    return VK_ERROR_INITIALIZATION_FAILED;
}

static PFN_vkVoidFunction sim_vkGetDeviceProcAddr(void *device, const char *name)
{
    (void)device, (void)name;
    return NULL;
}

EXPORT PFN_vkVoidFunction vk_icdGetInstanceProcAddr(VkInstance instance, const char *name);

#define SIM_VK_ENTRY(fn) { #fn, (PFN_vkVoidFunction)sim_##fn }
/* Commands on a VkPhysicalDevice, then the others. */
static const struct { const char *name; PFN_vkVoidFunction fn; } physical_device_functions[] = {
    SIM_VK_ENTRY(vkGetPhysicalDeviceProperties),
    SIM_VK_ENTRY(vkGetPhysicalDeviceProperties2),
    { "vkGetPhysicalDeviceProperties2KHR", (PFN_vkVoidFunction)sim_vkGetPhysicalDeviceProperties2 },
    SIM_VK_ENTRY(vkGetPhysicalDeviceFeatures),
    SIM_VK_ENTRY(vkGetPhysicalDeviceFormatProperties),
    SIM_VK_ENTRY(vkGetPhysicalDeviceImageFormatProperties),
    SIM_VK_ENTRY(vkGetPhysicalDeviceQueueFamilyProperties),
    SIM_VK_ENTRY(vkGetPhysicalDeviceMemoryProperties),
    SIM_VK_ENTRY(vkGetPhysicalDeviceSparseImageFormatProperties),
    SIM_VK_ENTRY(vkEnumerateDeviceExtensionProperties),
    SIM_VK_ENTRY(vkCreateDevice),
}, instance_functions[] = {
    SIM_VK_ENTRY(vkCreateInstance),
    SIM_VK_ENTRY(vkDestroyInstance),
    SIM_VK_ENTRY(vkEnumerateInstanceExtensionProperties),
    SIM_VK_ENTRY(vkEnumerateInstanceVersion),
    SIM_VK_ENTRY(vkEnumeratePhysicalDevices),
    SIM_VK_ENTRY(vkGetDeviceProcAddr),
    { "vkGetInstanceProcAddr", (PFN_vkVoidFunction)vk_icdGetInstanceProcAddr },
};

EXPORT VkResult vk_icdNegotiateLoaderICDInterfaceVersion(uint32_t *version)
{
    if (*version > 5)
        *version = 5;
    return VK_SUCCESS;
}

EXPORT PFN_vkVoidFunction vk_icdGetPhysicalDeviceProcAddr(VkInstance instance, const char *name)
{
    (void)instance;
    for (size_t i = 0; i < sizeof physical_device_functions / sizeof physical_device_functions[0]; i++)
        if (!strcmp(name, physical_device_functions[i].name))
            return physical_device_functions[i].fn;
    return NULL;
}

EXPORT PFN_vkVoidFunction vk_icdGetInstanceProcAddr(VkInstance instance, const char *name)
{
    for (size_t i = 0; i < sizeof instance_functions / sizeof instance_functions[0]; i++)
        if (!strcmp(name, instance_functions[i].name))
            return instance_functions[i].fn;
    return vk_icdGetPhysicalDeviceProcAddr(instance, name);
}
#endif
