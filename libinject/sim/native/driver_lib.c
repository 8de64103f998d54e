/* A simulated NVIDIA driver library: a real ELF shared object whose SONAME and
 * file name match the real one (set at link time), carrying its identity.
 * -DSIM_LIB="libcuda" -DSIM_DRIVER_VERSION="550.163.01" -DSIM_CUDA_VERSION=12040;
 * -DSIM_LIBCUDA adds the two CUDA driver API calls tools probe first. */
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
