/* The simulated NVML's MIG instance API: GPU instances (GIs), compute instances (CIs),
 * their profiles and placements, and a MIG device's attributes, answered from the MIG
 * devices of the GPU's nvhook-sim data ("MigDevice: <gi> <ci> <MiB> <profile> <uuid>").
 *
 * The model is the A100/H100 one NVML describes: 7 compute slices and 8 memory slices per
 * GPU; a GI profile takes `slices` compute slices and `size` memory slices, placed at a
 * multiple of `size`. Profile ids are the ones the driver reports for those GPUs
 * (nvidia-smi mig -lgip), so go-nvlib's MIG profile names ("3g.40gb") come out of
 * GetAttributes / GetGpuInstanceProfileInfo / GetComputeInstanceProfileInfo as nvidia-smi
 * prints them. A device's profile comes from its name: "[<c>c.]<g>g.<N>gb[+me]".
 *
 * The simulated host is a picture of a configured machine: creating or destroying
 * instances is NVML_ERROR_NOT_SUPPORTED (nvml_stubs.c). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "nvml_sim.h"

typedef struct {
    unsigned int index;       /* NVML_GPU_INSTANCE_PROFILE_* */
    unsigned int id;          /* what GetGpuInstanceProfileInfo reports as id */
    unsigned int slices;      /* compute slices */
    unsigned int size;        /* memory slices (of 8): placement size and step */
    int me;                   /* "+me": all media engines, one instance per GPU */
    unsigned int decoders, jpeg_ofa;
} gi_profile;

static const gi_profile GI_PROFILES[] = {
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 1, 0, 0, 0},
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, 1, 1, 1},
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 2, 0, 1, 0},
    {NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 2, 0, 1, 0},
    {NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 4, 0, 2, 0},
    {NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 4, 0, 2, 0},
    {NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 8, 0, 5, 1},
};
#define N_GI_PROFILES (sizeof GI_PROFILES / sizeof *GI_PROFILES)
#define COMPUTE_SLICES 7
#define MEMORY_SLICES 8

/* Compute-instance profile index -> compute slices (0: not offered). */
static const unsigned int CI_SLICES[NVML_COMPUTE_INSTANCE_PROFILE_COUNT] = {1, 2, 3, 4, 7, 0, 0, 0, 0};

static const gi_profile *gi_profile_by_index(unsigned int index)
{
    for (size_t i = 0; i < N_GI_PROFILES; i++)
        if (GI_PROFILES[i].index == index)
            return &GI_PROFILES[i];
    return NULL;
}

static const gi_profile *gi_profile_by_id(unsigned int id)
{
    for (size_t i = 0; i < N_GI_PROFILES; i++)
        if (GI_PROFILES[i].id == id)
            return &GI_PROFILES[i];
    return NULL;
}

static unsigned int sm_per_slice(const sim_gpu *g)
{
    return g->cc_major >= 9 ? 16 : 14;    /* H100: 16 SMs a slice; A100: 14 */
}

/* Placements of a profile: starts at multiples of its memory size that leave room for
 * its compute slices (7) and memory slices (8). */
static unsigned int placements(const gi_profile *p, nvmlGpuInstancePlacement_t *out, unsigned int max)
{
    unsigned int n = 0;
    for (unsigned int start = 0; start + p->slices <= COMPUTE_SLICES && start + p->size <= MEMORY_SLICES;
         start += p->size) {
        if (out && n < max) {
            out[n].start = start;
            out[n].size = p->size;
        }
        n++;
    }
    return n;
}

static unsigned int instance_count(const gi_profile *p)
{
    return p->me ? 1 : placements(p, NULL, 0);
}

/* Memory a profile gives: that of an existing instance of it, else its share of the GPU
 * rounded down to 256 MiB (what the driver keeps back per slice varies by board). */
static unsigned long long profile_memory_mib(const sim_gpu *g, const gi_profile *p)
{
    for (unsigned int i = 0; i < g->n_gi; i++)
        if (g->gis[i].profile == p->index)
            return g->gis[i].memory >> 20;
    unsigned long long mib = (g->memory >> 20) * p->size / MEMORY_SLICES;
    return mib / 256 * 256;
}

/* "MIG 3g.40gb" as go-nvlib names it: memory as a share of the board, in eighths. */
static void profile_name(const sim_gpu *g, const gi_profile *p, unsigned int ci_slices, char *out, size_t n)
{
    unsigned long long total_gb = (g->memory + (1ULL << 30) - 1) >> 30;
    unsigned long long gb = (unsigned long long)llround((double)p->size / MEMORY_SLICES * (double)total_gb);
    char c[16] = "";
    if (ci_slices && ci_slices != p->slices)
        snprintf(c, sizeof c, "%uc.", ci_slices);
    snprintf(out, n, "MIG %s%ug.%llugb%s", c, p->slices, gb, p->me ? "+me" : "");
}

static int parse_name(const char *name, unsigned int *c, unsigned int *g, int *me)
{
    unsigned int a, b, gb;
    char rest[32] = "";
    if (sscanf(name, "%uc.%ug.%ugb%31s", &a, &b, &gb, rest) >= 3) {
        *c = a;
        *g = b;
    } else if (sscanf(name, "%ug.%ugb%31s", &b, &gb, rest) >= 2) {
        *c = *g = b;
    } else {
        return -1;
    }
    *me = !strcmp(rest, "+me");
    return 0;
}

/* The GI profile of a MIG device: its compute slices and "+me" from its name, its memory
 * share (in eighths, rounded up) choosing between 1g profiles (1g.10gb or 1g.20gb). */
static unsigned int device_gi_profile(const sim_gpu *g, const sim_mig *m, unsigned int *ci_slices)
{
    unsigned int c, slices;
    int me;
    if (parse_name(m->profile, &c, &slices, &me) < 0 || !g->memory)
        return SIM_NO_PROFILE;
    unsigned int eighths = (unsigned int)((m->memory * MEMORY_SLICES + g->memory - 1) / g->memory);
    const gi_profile *best = NULL;
    for (size_t i = 0; i < N_GI_PROFILES; i++) {
        const gi_profile *p = &GI_PROFILES[i];
        if (p->slices != slices || p->me != me)
            continue;
        if (!best || (best->size < eighths && p->size > best->size) ||
            (p->size >= eighths && p->size < best->size))
            best = p;
    }
    *ci_slices = c;
    return best ? best->index : SIM_NO_PROFILE;
}

static unsigned int ci_profile_for(unsigned int slices)
{
    for (unsigned int j = 0; j < NVML_COMPUTE_INSTANCE_PROFILE_COUNT; j++)
        if (CI_SLICES[j] == slices)
            return j;
    return SIM_NO_PROFILE;
}

/* A GI of `gi_slices` offers CIs of 1, 2, 3, 4 or 7 slices that fit, except 3 in a 4-slice GI. */
static int ci_offered(unsigned int gi_slices, unsigned int profile)
{
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT || !CI_SLICES[profile])
        return 0;
    unsigned int c = CI_SLICES[profile];
    return c <= gi_slices && !(gi_slices == 4 && c == 3);
}

void sim_mig_layout(sim_gpu *g)
{
    unsigned int used = 0;   /* memory slices taken, a bit each */
    g->n_gi = 0;
    if (!g->mig_mode)
        return;
    /* GPU instances in gi id order; each takes its profile's first free placement. */
    for (unsigned int id = 0; id < MAX_GI; id++) {
        sim_gi *gi = NULL;
        for (unsigned int j = 0; j < g->n_mig; j++) {
            sim_mig *m = &g->mig[j];
            unsigned int ci_slices = 0;
            if (m->gi != id)
                continue;
            if (!gi) {
                gi = &g->gis[g->n_gi++];
                memset(gi, 0, sizeof *gi);
                gi->parent = g;
                gi->id = id;
                gi->profile = device_gi_profile(g, m, &ci_slices);
                gi->memory = m->memory;
                const gi_profile *p = gi_profile_by_index(gi->profile);
                nvmlGpuInstancePlacement_t pl[MEMORY_SLICES];
                unsigned int n = p ? placements(p, pl, MEMORY_SLICES) : 0;
                for (unsigned int k = 0; k < n; k++) {
                    unsigned int mask = ((1u << pl[k].size) - 1) << pl[k].start;
                    if (!(used & mask)) {
                        gi->start = pl[k].start;
                        used |= mask;
                        break;
                    }
                }
            } else {
                device_gi_profile(g, m, &ci_slices);
            }
            m->gpu_instance = gi;
            m->ci_slices = ci_slices;
            m->ci_profile = ci_profile_for(ci_slices);
        }
    }
    /* Compute instances inside each GI in ci id order, packed from slice 0. */
    for (unsigned int i = 0; i < g->n_gi; i++) {
        unsigned int next = 0;
        for (unsigned int ci = 0; ci < 8; ci++)
            for (unsigned int j = 0; j < g->n_mig; j++)
                if (g->mig[j].gpu_instance == &g->gis[i] && g->mig[j].ci == ci) {
                    g->mig[j].ci_start = next;
                    next += g->mig[j].ci_slices;
                }
    }
}

/* ---------- handles ---------- */

static sim_gi *as_gi(nvmlGpuInstance_t h)
{
    for (unsigned int i = 0; i < sim_n_gpus; i++)
        for (unsigned int j = 0; j < sim_gpus[i].n_gi; j++)
            if (h == &sim_gpus[i].gis[j].h)
                return &sim_gpus[i].gis[j];
    return NULL;
}

static sim_mig *as_ci(nvmlComputeInstance_t h)
{
    for (unsigned int i = 0; i < sim_n_gpus; i++)
        for (unsigned int j = 0; j < sim_gpus[i].n_mig; j++)
            if (h == &sim_gpus[i].mig[j].ci_h)
                return &sim_gpus[i].mig[j];
    return NULL;
}

#define RESOLVE_GI(h)                                   \
    sim_gi *gi;                                         \
    if (sim_initialized() != NVML_SUCCESS)              \
        return NVML_ERROR_UNINITIALIZED;                \
    if (!(gi = as_gi(h)))                               \
        return NVML_ERROR_INVALID_ARGUMENT

/* A whole GPU in MIG mode, as the instance calls want it. */
static nvmlReturn_t mig_gpu(nvmlDevice_t device, sim_gpu **out)
{
    RESOLVE(device);
    if (m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    *out = g;
    return NVML_SUCCESS;
}

/* ---------- device ---------- */

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    RESOLVE(device);
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m)
        return NVML_ERROR_NOT_SUPPORTED;   /* MIG devices have no index of their own */
    *index = (unsigned int)(g - sim_gpus);
    return NVML_SUCCESS;
}

static nvmlReturn_t attributes(nvmlDevice_t device, nvmlDeviceAttributes_t *a)
{
    RESOLVE(device);
    if (!a)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!m)
        return NVML_ERROR_NOT_SUPPORTED;   /* NVML answers this for MIG device handles only */
    const gi_profile *p = gi_profile_by_index(m->gpu_instance ? m->gpu_instance->profile : SIM_NO_PROFILE);
    memset(a, 0, sizeof *a);
    a->multiprocessorCount = m->ci_slices * sm_per_slice(g);
    if (p) {
        a->sharedCopyEngineCount = p->slices;
        a->sharedDecoderCount = p->decoders;
        a->sharedJpegCount = a->sharedOfaCount = p->jpeg_ofa;
        a->gpuInstanceSliceCount = p->slices;
    }
    a->computeInstanceSliceCount = m->ci_slices;
    a->memorySizeMB = m->memory >> 20;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *out)
{
    return attributes(device, out);
}

/* The deprecated v1: the first six fields only. */
EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributesV1_t *out)
{
    nvmlDeviceAttributes_t a;
    nvmlReturn_t rc = out ? attributes(device, &a) : attributes(device, NULL);
    if (rc == NVML_SUCCESS)
        memcpy(out, &a, sizeof *out);
    return rc;
}

static nvmlReturn_t gi_profile_info(nvmlDevice_t device, unsigned int index, nvmlGpuInstanceProfileInfo_v2_t *info)
{
    sim_gpu *g;
    nvmlReturn_t rc = mig_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!info || index >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    const gi_profile *p = gi_profile_by_index(index);
    if (!p)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int version = info->version;
    memset(info, 0, sizeof *info);
    info->version = version;
    info->id = p->id;
    info->isP2pSupported = 0;
    info->sliceCount = p->slices;
    info->instanceCount = instance_count(p);
    info->multiprocessorCount = p->slices * sm_per_slice(g);
    info->copyEngineCount = p->slices;
    info->decoderCount = p->decoders;
    info->encoderCount = 0;
    info->jpegCount = info->ofaCount = p->jpeg_ofa;
    info->memorySizeMB = profile_memory_mib(g, p);
    profile_name(g, p, 0, info->name, sizeof info->name);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_t *info)
{
    nvmlGpuInstanceProfileInfo_v2_t v2 = {0};
    nvmlReturn_t rc = gi_profile_info(device, profile, info ? &v2 : NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    /* v1: v2's fields without the version and the name (field by field: memorySizeMB
     * sits at a different offset) */
    info->id = v2.id;
    info->isP2pSupported = v2.isP2pSupported;
    info->sliceCount = v2.sliceCount;
    info->instanceCount = v2.instanceCount;
    info->multiprocessorCount = v2.multiprocessorCount;
    info->copyEngineCount = v2.copyEngineCount;
    info->decoderCount = v2.decoderCount;
    info->encoderCount = v2.encoderCount;
    info->jpegCount = v2.jpegCount;
    info->ofaCount = v2.ofaCount;
    info->memorySizeMB = v2.memorySizeMB;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                         nvmlGpuInstanceProfileInfo_v2_t *info)
{
    if (info && info->version != nvmlGpuInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    return gi_profile_info(device, profile, info);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device, unsigned int profileId,
                                                             nvmlGpuInstanceProfileInfo_v2_t *info)
{
    const gi_profile *p = gi_profile_by_id(profileId);
    if (info && info->version != nvmlGpuInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!p) {
        sim_gpu *g;
        nvmlReturn_t rc = mig_gpu(device, &g);
        return rc != NVML_SUCCESS ? rc : NVML_ERROR_INVALID_ARGUMENT;
    }
    return gi_profile_info(device, p->index, info);
}

/* profileId: a profile's id (GetGpuInstanceProfileInfo's info.id), as NVML takes it here. */
static nvmlReturn_t gi_profile_of_id(nvmlDevice_t device, unsigned int profileId, sim_gpu **g, const gi_profile **p)
{
    nvmlReturn_t rc = mig_gpu(device, g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!(*p = gi_profile_by_id(profileId)))
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

/* placements NULL: the count only; otherwise *count is the room in placements. */
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                                  nvmlGpuInstancePlacement_t *out, unsigned int *count)
{
    sim_gpu *g;
    const gi_profile *p;
    nvmlReturn_t rc = gi_profile_of_id(device, profileId, &g, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = placements(p, NULL, 0);
    if (out) {
        if (*count < n) {
            *count = n;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        placements(p, out, n);
    }
    *count = n;
    return NVML_SUCCESS;
}

/* The deprecated first version: the caller's array must hold every placement. */
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device, unsigned int profileId,
                                                               nvmlGpuInstancePlacement_t *out, unsigned int *count)
{
    unsigned int room = MEMORY_SLICES;
    nvmlReturn_t rc = nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profileId, out, out ? &room : count);
    if (out && rc == NVML_SUCCESS && count)
        *count = room;
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profileId,
                                                              unsigned int *count)
{
    sim_gpu *g;
    const gi_profile *p;
    nvmlReturn_t rc = gi_profile_of_id(device, profileId, &g, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int used = 0, n = 0, same = 0;
    for (unsigned int i = 0; i < g->n_gi; i++) {
        const gi_profile *q = gi_profile_by_index(g->gis[i].profile);
        if (q) {
            used |= ((1u << q->size) - 1) << g->gis[i].start;
            same += q == p;
        }
    }
    nvmlGpuInstancePlacement_t pl[MEMORY_SLICES];
    unsigned int np = placements(p, pl, MEMORY_SLICES);
    for (unsigned int k = 0; k < np; k++)
        if (!(used & (((1u << pl[k].size) - 1) << pl[k].start)))
            n++;
    if (p->me && same)
        n = 0;
    *count = g->mig_mode ? n : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                              nvmlGpuInstance_t *instances, unsigned int *count)
{
    sim_gpu *g;
    const gi_profile *p;
    nvmlReturn_t rc = gi_profile_of_id(device, profileId, &g, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count || !instances)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_mode)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int n = 0;
    for (unsigned int i = 0; i < g->n_gi; i++)
        if (g->gis[i].profile == p->index)
            instances[n++] = &g->gis[i].h;
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *out)
{
    sim_gpu *g;
    nvmlReturn_t rc = mig_gpu(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_mode)
        return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned int i = 0; i < g->n_gi; i++)
        if (g->gis[i].id == id) {
            *out = &g->gis[i].h;
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

/* ---------- GPU instance ---------- */

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    RESOLVE_GI(gpuInstance);
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    const gi_profile *p = gi_profile_by_index(gi->profile);
    memset(info, 0, sizeof *info);
    info->device = &gi->parent->h;
    info->id = gi->id;
    info->profileId = p ? p->id : SIM_NO_PROFILE;
    info->placement.start = gi->start;
    info->placement.size = p ? p->size : 0;
    return NVML_SUCCESS;
}

static nvmlReturn_t ci_profile_info(nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
                                    nvmlComputeInstanceProfileInfo_v2_t *info)
{
    RESOLVE_GI(gpuInstance);
    if (!info || profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT ||
        engProfile >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    const gi_profile *p = gi_profile_by_index(gi->profile);
    if (!p || !ci_offered(p->slices, profile))
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int c = CI_SLICES[profile], version = info->version;
    memset(info, 0, sizeof *info);
    info->version = version;
    info->id = profile;   /* compute instance profile ids are their indexes */
    info->sliceCount = c;
    info->instanceCount = p->slices / c;
    info->multiprocessorCount = c * sm_per_slice(gi->parent);
    info->sharedCopyEngineCount = p->slices;
    info->sharedDecoderCount = p->decoders;
    info->sharedJpegCount = info->sharedOfaCount = p->jpeg_ofa;
    profile_name(gi->parent, p, c, info->name, sizeof info->name);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                 unsigned int engProfile,
                                                                 nvmlComputeInstanceProfileInfo_t *info)
{
    nvmlComputeInstanceProfileInfo_v2_t v2 = {0};
    nvmlReturn_t rc = ci_profile_info(gpuInstance, profile, engProfile, info ? &v2 : NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    /* v1: v2's unsigned ints after the version, without the name */
    memcpy(info, (char *)&v2 + offsetof(nvmlComputeInstanceProfileInfo_v2_t, id), sizeof *info);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                  unsigned int engProfile,
                                                                  nvmlComputeInstanceProfileInfo_v2_t *info)
{
    if (info && info->version != nvmlComputeInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    return ci_profile_info(gpuInstance, profile, engProfile, info);
}

static nvmlReturn_t ci_profile_of(nvmlGpuInstance_t gpuInstance, unsigned int profileId, sim_gi **out)
{
    RESOLVE_GI(gpuInstance);
    const gi_profile *p = gi_profile_by_index(gi->profile);
    if (profileId >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!p || !ci_offered(p->slices, profileId))
        return NVML_ERROR_NOT_SUPPORTED;
    *out = gi;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(nvmlGpuInstance_t gpuInstance,
                                                                        unsigned int profileId,
                                                                        nvmlComputeInstancePlacement_t *out,
                                                                        unsigned int *count)
{
    sim_gi *gi;
    nvmlReturn_t rc = ci_profile_of(gpuInstance, profileId, &gi);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int c = CI_SLICES[profileId], slices = gi_profile_by_index(gi->profile)->slices, n = 0;
    for (unsigned int start = 0; start + c <= slices; start += c) {
        if (out) {
            if (n >= *count)
                return NVML_ERROR_INSUFFICIENT_SIZE;
            out[n].start = start;
            out[n].size = c;
        }
        n++;
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gpuInstance,
                                                                       unsigned int profileId, unsigned int *count)
{
    sim_gi *gi;
    nvmlReturn_t rc = ci_profile_of(gpuInstance, profileId, &gi);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int used = 0, slices = gi_profile_by_index(gi->profile)->slices, c = CI_SLICES[profileId];
    const sim_gpu *g = gi->parent;
    for (unsigned int j = 0; j < g->n_mig; j++)
        if (g->mig[j].gpu_instance == gi)
            used += g->mig[j].ci_slices;
    *count = used >= slices ? 0 : (slices - used) / c;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                       nvmlComputeInstance_t *out, unsigned int *count)
{
    sim_gi *gi;
    nvmlReturn_t rc = ci_profile_of(gpuInstance, profileId, &gi);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    sim_gpu *g = gi->parent;
    unsigned int n = 0;
    for (unsigned int j = 0; j < g->n_mig; j++)
        if (g->mig[j].gpu_instance == gi && g->mig[j].ci_profile == profileId)
            out[n++] = &g->mig[j].ci_h;
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                          nvmlComputeInstance_t *out)
{
    RESOLVE_GI(gpuInstance);
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    sim_gpu *g = gi->parent;
    for (unsigned int j = 0; j < g->n_mig; j++)
        if (g->mig[j].gpu_instance == gi && g->mig[j].ci == id) {
            *out = &g->mig[j].ci_h;
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

/* ---------- compute instance ---------- */

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info)
{
    sim_mig *m;
    if (sim_initialized() != NVML_SUCCESS)
        return NVML_ERROR_UNINITIALIZED;
    if (!(m = as_ci(computeInstance)) || !info)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    info->device = &m->parent->h;
    info->gpuInstance = m->gpu_instance ? &m->gpu_instance->h : NULL;
    info->id = m->ci;
    info->profileId = m->ci_profile;
    info->placement.start = m->ci_start;
    info->placement.size = m->ci_slices;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info)
{
    return nvmlComputeInstanceGetInfo_v2(computeInstance, info);
}
