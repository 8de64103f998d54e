"""The pipeline, as one function for the hook and `nvhook configure`:
Request (libinject.request) -> Driver (libinject.discover) -> ContainerEdits
(libinject.plan) -> the live applier (libinject.apply.live).
"""
from __future__ import annotations

from libinject.plan.edits import ContainerEdits
from libinject.request.model import Request

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

    from libinject.discover.model import Driver
    from libinject.discover.options import DiscoverOptions


def configure(request: Request, rootfs: str, *, pid: int | None, options: DiscoverOptions,
              dry_run: bool = False,
              log: Callable[[str], None] | None = None,
              discover_fn: Callable[..., Driver] | None = None,
              plan_fn: Callable[..., ContainerEdits] | None = None,
              in_process: bool = False, owner: str | None = None,
              load_kmods: bool = False) -> ContainerEdits:
    """Discover the driver (options), plan request for rootfs and (unless dry_run) apply
    it to the live container (pid's mount namespace and cgroup; None = ours).
    All-or-nothing: raises NvhookError and leaves the container as it was.
    discover_fn: stands in for libinject.discover.driver.discover (same signature), e.g. the
    hook service's in-memory cache (libinject.runtime.serve.driver_cache); plan_fn likewise for
    libinject.plan.planner.plan (the service's plans, made once per request and driver).
    in_process: apply in this process instead of a forked worker (one fork less on the
    hook's path); only for one-shot processes, since it limits this process's
    capabilities for good. owner: the container's id, where known (what a killed
    apply's journal is bound to, with the rootfs's identity). load_kmods: first load
    NVIDIA's modules and create the driver's missing device nodes (libinject.linux.devnodes)."""
    from libinject.discover.libraries import container_lib_dirs
    from libinject.plan.planner import plan

    plan = plan_fn or plan
    say = log or (lambda msg: None)
    if load_kmods and not dry_run:
        from libinject.linux import devnodes

        for made in devnodes.prepare(options.dev_root or options.root, say):
            say(f"load-kmods: created {made}")
    driver = options.discover(discover_fn, log=say)
    say(f"driver {driver.info.driver_version} (cuda {driver.info.cuda_version}) under {driver.root}: "
        f"{len(driver.info.gpus)} GPUs, libraries from {driver.library_source}")
    lib_dir, lib32_dir = container_lib_dirs(rootfs)
    edits = plan(request, driver, lib_dir=lib_dir, lib32_dir=lib32_dir)
    say(f"plan: {len(edits.device_nodes)} devices ({', '.join(d.path for d in edits.device_nodes)}), "
        f"{len(edits.mounts)} mounts, {len(edits.symlinks)} symlinks, "
        f"{len(edits.cgroup_rules)} cgroup rules, lib dir {lib_dir}")
    if edits.cuda_compat is None and request.cuda_compat_mode not in ("disabled", ""):
        from libinject.plan.compat import consumer

        nodes = {d.path for d in edits.device_nodes}
        names = sorted({g.name for g in consumer(driver.info.gpus) if f"/dev/nvidia{g.minor}" in nodes})
        if names:
            say(f"CUDA forward compat not used: {', '.join(names)} does not support it "
                "(CUDA would fail with error 804)")
    if dry_run:
        return edits
    from libinject.apply import live

    try:
        live.apply(edits, rootfs, pid=pid, ldconfig=request.ldconfig, no_cgroups=request.no_cgroups,
                   worker=not in_process, owner=owner)
    finally:
        for note in live.notes:
            say(note)
    say(f"applied to rootfs {rootfs} (pid {pid})")
    return edits
