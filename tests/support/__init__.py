"""Test support code shared by several test modules; test modules import helpers from
here (or use conftest fixtures), never from each other.

  runc        RuncContainer: a real runc container on cgroup v1 or v2
  hookenv     the compiled hook front, its config, a GPU container with it, crun, containerd
  podman      podman with private config and state (OCI hooks dir or CDI specs)
  shimenv     the runtime shim and `nvhook prestart`: paths, config.toml, a GPU request env
  driverview  what a container sees of the driver (SNAPSHOT) and its open() verdicts
  simhost     a simulated host's profile, extra libraries in it, its ld.so.cache
  applyenv    private mount namespaces, mountinfo, tree snapshots, a hand-made driver root
  canary      canaries for container input reaching the host's hook
  serve_client  a Python client of `nvhook serve`
  cli         the real `nvhook` CLI with a config of its own; a refusal's one clear line
  vkprobe     a Vulkan loader client (vkprobe.c) listing the GPUs a Vulkan driver offers
"""
