/* vkprobe: lists the Vulkan physical devices the system's loader finds.
 * dlopen()s libvulkan.so.1 (no Vulkan headers or -lvulkan needed to build it), creates
 * an instance (apiVersion 1.1: the loader then sorts devices, calling more of each
 * driver), and prints one line per device:
 *     VK <deviceName> vendor=0x<vendorID> type=<VkPhysicalDeviceType number>
 * with -v also " device=0x<deviceID> driver=0x<driverVersion> api=<major>.<minor>.<patch>";
 * "VK none" when there is none. Exit 0; 1 on a failure ("VK error: ..." with the VkResult). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int32_t VkResult;
#define VK_ERROR_INITIALIZATION_FAILED (-3)
typedef void *VkInstance;
typedef void *VkPhysicalDevice;
typedef void (*PFN_vkVoidFunction)(void);

typedef struct {
    int32_t sType;                  /* VK_STRUCTURE_TYPE_APPLICATION_INFO = 0 */
    const void *pNext;
    const char *pApplicationName;
    uint32_t applicationVersion;
    const char *pEngineName;
    uint32_t engineVersion;
    uint32_t apiVersion;
} VkApplicationInfo;

typedef struct {
    int32_t sType;                  /* VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO = 1 */
    const void *pNext;
    uint32_t flags;
    const VkApplicationInfo *pApplicationInfo;
    uint32_t enabledLayerCount;
    const char *const *ppEnabledLayerNames;
    uint32_t enabledExtensionCount;
    const char *const *ppEnabledExtensionNames;
} VkInstanceCreateInfo;

/* VkPhysicalDeviceProperties' leading members; `rest` is room for the others the
 * driver fills (limits, sparse properties: 532 bytes on x86-64). */
typedef struct {
    uint32_t apiVersion;
    uint32_t driverVersion;
    uint32_t vendorID;
    uint32_t deviceID;
    int32_t deviceType;
    char deviceName[256];
    uint8_t pipelineCacheUUID[16];
    uint8_t rest[1024];
} VkPhysicalDeviceProperties;

typedef PFN_vkVoidFunction (*PFN_vkGetInstanceProcAddr)(VkInstance, const char *);
typedef VkResult (*PFN_vkCreateInstance)(const VkInstanceCreateInfo *, const void *, VkInstance *);
typedef void (*PFN_vkDestroyInstance)(VkInstance, const void *);
typedef VkResult (*PFN_vkEnumeratePhysicalDevices)(VkInstance, uint32_t *, VkPhysicalDevice *);
typedef void (*PFN_vkGetPhysicalDeviceProperties)(VkPhysicalDevice, VkPhysicalDeviceProperties *);

#define API(major, minor, patch) ((uint32_t)(major) << 22 | (uint32_t)(minor) << 12 | (uint32_t)(patch))

int main(int argc, char **argv)
{
    int verbose = argc > 1 && !strcmp(argv[1], "-v");
    void *vk = dlopen("libvulkan.so.1", RTLD_NOW);
    if (!vk) {
        printf("VK error: no loader: %s\n", dlerror());
        return 1;
    }
    PFN_vkGetInstanceProcAddr gipa = (PFN_vkGetInstanceProcAddr)dlsym(vk, "vkGetInstanceProcAddr");
    if (!gipa) {
        printf("VK error: no vkGetInstanceProcAddr in libvulkan.so.1\n");
        return 1;
    }
    PFN_vkCreateInstance create = (PFN_vkCreateInstance)gipa(NULL, "vkCreateInstance");
    VkApplicationInfo app = {0, NULL, "vkprobe", 1, NULL, 0, API(1, 1, 0)};
    VkInstanceCreateInfo info = {1, NULL, 0, &app, 0, NULL, 0, NULL};
    VkInstance inst;
    VkResult r = create(&info, NULL, &inst);
    if (r != 0) {
        printf("VK error: vkCreateInstance: VkResult %d\n", r);
        return 1;
    }
    PFN_vkEnumeratePhysicalDevices enumerate = (PFN_vkEnumeratePhysicalDevices)gipa(inst, "vkEnumeratePhysicalDevices");
    PFN_vkGetPhysicalDeviceProperties props_of = (PFN_vkGetPhysicalDeviceProperties)gipa(inst, "vkGetPhysicalDeviceProperties");
    PFN_vkDestroyInstance destroy = (PFN_vkDestroyInstance)gipa(inst, "vkDestroyInstance");
    uint32_t count = 0;
    r = enumerate(inst, &count, NULL);
    /* The loader reports "no GPU" as VK_ERROR_INITIALIZATION_FAILED (its log says
     * "Failed to detect any valid GPUs in the current config"). */
    if (r == VK_ERROR_INITIALIZATION_FAILED)
        r = 0, count = 0;
    VkPhysicalDevice *devs = calloc(count ? count : 1, sizeof *devs);
    if (r == 0 && count)
        r = enumerate(inst, &count, devs);
    if (r != 0) {
        printf("VK error: vkEnumeratePhysicalDevices: VkResult %d\n", r);
        return 1;
    }
    if (!count)
        printf("VK none\n");
    for (uint32_t i = 0; i < count; i++) {
        VkPhysicalDeviceProperties p;
        memset(&p, 0, sizeof p);
        props_of(devs[i], &p);
        printf("VK %.*s vendor=0x%x type=%d", (int)sizeof p.deviceName, p.deviceName, p.vendorID, p.deviceType);
        if (verbose)
            printf(" device=0x%x driver=0x%x api=%u.%u.%u", p.deviceID, p.driverVersion,
                   p.apiVersion >> 22 & 0x7F, p.apiVersion >> 12 & 0x3FF, p.apiVersion & 0xFFF);
        printf("\n");
    }
    free(devs);
    destroy(inst, NULL);
    return 0;
}
