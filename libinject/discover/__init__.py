"""Stage 2, discovery: what a driver root offers (NVML, ld.so.cache, libraries, snapshots)."""
