"""Stage 4, the appliers: ContainerEdits made real (live rootfs, ldconfig, cgroups/eBPF; OCI spec; CDI)."""
