/* Internal to the simulated NVML (nvml_mock.c, nvml_mig.c, nvml_stubs.c): the state the
 * mock keeps and the helpers its parts share. Built with -fvisibility=hidden, so none of
 * this is exported; only EXPORT functions are the library's ABI. */
#ifndef NVHOOK_SIM_NVML_SIM_H
#define NVHOOK_SIM_NVML_SIM_H

#include "nvml.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_GPUS 64
#define MAX_MIG 64
#define MAX_GI 15                /* GPU instance ids are 0..14 */
#define SIM_MAGIC_GPU 0x6e677075u
#define SIM_MAGIC_MIG 0x6e6d6967u
#define SIM_NO_PROFILE 0xffffffffu

struct nvmlDevice_st {
    unsigned int magic;          /* SIM_MAGIC_GPU or SIM_MAGIC_MIG */
};
/* Opaque to callers; the address is the handle. */
struct nvmlGpuInstance_st {
    unsigned int unused;
};
struct nvmlComputeInstance_st {
    unsigned int unused;
};

typedef struct sim_gpu sim_gpu;
typedef struct sim_gi sim_gi;

/* A MIG device: one compute instance inside one GPU instance. */
typedef struct {
    struct nvmlDevice_st h;
    struct nvmlComputeInstance_st ci_h;  /* its compute instance's handle */
    sim_gpu *parent;
    sim_gi *gpu_instance;
    unsigned int gi, ci;
    char profile[32];            /* "3g.40gb", "1c.3g.40gb", "1g.10gb+me" */
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    unsigned long long memory;   /* bytes */
    unsigned int ci_profile;     /* NVML_COMPUTE_INSTANCE_PROFILE_* or SIM_NO_PROFILE */
    unsigned int ci_slices, ci_start;
} sim_mig;

/* A GPU instance: what the MIG devices that share a gi id live in. */
struct sim_gi {
    struct nvmlGpuInstance_st h;
    sim_gpu *parent;
    unsigned int id;
    unsigned int profile;        /* NVML_GPU_INSTANCE_PROFILE_* or SIM_NO_PROFILE */
    unsigned int start;          /* placement: first memory slice */
    unsigned long long memory;   /* bytes */
};

struct sim_gpu {
    struct nvmlDevice_st h;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    unsigned int domain, bus, dev, minor;
    unsigned int pci_device_id, pci_subsystem_id;
    unsigned int brand, arch;
    int cc_major, cc_minor;
    unsigned long long memory;
    int mig_capable, mig_mode;
    unsigned int n_mig;
    sim_mig mig[MAX_MIG];
    unsigned int n_gi;
    sim_gi gis[MAX_GI];
};

extern sim_gpu sim_gpus[MAX_GPUS];
extern unsigned int sim_n_gpus;

/* NVML_SUCCESS when nvmlInit has succeeded (and not been shut down), else UNINITIALIZED. */
nvmlReturn_t sim_initialized(void);
/* The GPU (for a MIG handle, its parent) and the MIG device, if any, of a handle. */
nvmlReturn_t sim_resolve(nvmlDevice_t h, sim_gpu **g, sim_mig **m);
nvmlReturn_t sim_put_str(char *buf, unsigned int length, const char *s);
/* After the GPUs are loaded and sorted: group MIG devices into GPU instances and give
 * each instance its profile and placement (nvml_mig.c). */
void sim_mig_layout(sim_gpu *g);

#define RESOLVE(h)                                  \
    sim_gpu *g;                                     \
    sim_mig *m;                                     \
    nvmlReturn_t rc_ = sim_resolve((h), &g, &m);    \
    if (rc_ != NVML_SUCCESS)                        \
        return rc_;                                 \
    (void)m

#endif
