"""The pipeline: request (libinject.request) -> discover (libinject.discover) -> plan
(libinject.plan: ContainerEdits) -> apply (the live applier, libinject.apply.live).

Every path that changes a container walks these stages through here: the prestart hook
and `nvhook configure` (configure(): the driver discovered, the request planned), and
the CDI spec's hook (cdi_hook_edits(): the container's devices and library mounts from
its config, the host's /proc/driver/nvidia, planned into the same edits), each applied by
apply(), the one call of the live applier. (The runtime shim's request is planned into
a CDI spec or a hook entry that it writes into the OCI config: libinject.apply.spec.)
"""
from __future__ import annotations

import os

from libinject.plan.edits import ContainerEdits
from libinject.request.model import Request

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Iterable

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
    say = log or (lambda msg: None)
    if load_kmods and not dry_run:
        from libinject.linux import devnodes

        for made in devnodes.prepare(options.dev_root or options.root, say):
            say(f"load-kmods: created {made}")
    driver = options.discover(discover_fn, log=say)
    say(f"driver {driver.info.driver_version} (cuda {driver.info.cuda_version}) under {driver.root}: "
        f"{len(driver.info.gpus)} GPUs, libraries from {driver.library_source}")
    edits = plan(request, driver, rootfs, plan_fn=plan_fn, log=say)
    if dry_run:
        return edits
    apply(edits, rootfs, pid=pid, ldconfig=request.ldconfig, no_cgroups=request.no_cgroups,
          worker=not in_process, owner=owner, log=say)
    return edits


def plan(request: Request, driver: Driver, rootfs: str, *,
         plan_fn: Callable[..., ContainerEdits] | None = None,
         log: Callable[[str], None] | None = None) -> ContainerEdits:
    """The plan stage for a request and the driver discovered: ContainerEdits for the
    image at rootfs (its library dirs)."""
    from libinject.discover.libraries import container_lib_dirs
    from libinject.plan.planner import plan as planner

    say = log or (lambda msg: None)
    lib_dir, lib32_dir = container_lib_dirs(rootfs)
    edits = (plan_fn or planner)(request, driver, lib_dir=lib_dir, lib32_dir=lib32_dir)
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
    return edits


def cdi_hook_edits(spec: dict, *, procfs_dir: str = "", mig_minors: str = "",
                   links: Iterable[str] = (), folders: Iterable[str] = (),
                   libraries: Iterable[str] = (), cuda_compat_major: str = "") -> ContainerEdits:
    """The CDI spec's hook (libinject.runtime.cdi_hooks), request to plan: the devices
    and library mounts the container's OCI config `spec` says it was given (request),
    the host's /proc/driver/nvidia under procfs_dir, if asked (discover), and the
    edits the entry's flags ask for of them (plan). libraries: --library
    HOST::CONTAINER of older specs; without them, the runtime's mounts into `folders`."""
    from libinject.discover import procfs as host_procfs
    from libinject.plan import cdi_hook as plan_hook
    from libinject.request import cdi_hook as request_hook

    symlinks = plan_hook.links(links)
    folders = tuple(dict.fromkeys(folders))
    libraries = tuple(libraries)
    mounts = ((plan_hook.libraries(libraries) if libraries
               else plan_hook.runtime_library_mounts(request_hook.runtime_libraries(spec, folders)))
              if folders else ())
    mask = host = None
    if procfs_dir and os.path.isdir(procfs_dir):
        gpus, caps = request_hook.given_devices(spec)
        host, keys = host_procfs.for_container(procfs_dir, caps, mig_minors)
        mask = plan_hook.procfs_mask(procfs_dir, host, keys, gpus)
    compat = None
    if folders and cuda_compat_major:
        models = (host_procfs.gpu_models(procfs_dir, request_hook.gpu_nodes(spec), host)
                  if procfs_dir else ())
        compat = plan_hook.cuda_compat(cuda_compat_major, models)
    return ContainerEdits(procfs=mask, symlinks=symlinks, ldconfig_folders=folders, mounts=mounts,
                          cuda_compat=compat)


def apply(edits: ContainerEdits, rootfs: str, *, pid: int | None, ldconfig: str = "@/sbin/ldconfig",
          no_cgroups: bool = False, worker: bool = True, owner: str | None = None,
          log: Callable[[str], None] | None = None) -> None:
    """The apply stage: the live applier (libinject.apply.live) on the container at
    rootfs (pid's namespaces, None: ours), what it notes logged."""
    from libinject.apply import live

    say = log or (lambda msg: None)
    try:
        live.apply(edits, rootfs, pid=pid, ldconfig=ldconfig, no_cgroups=no_cgroups,
                   worker=worker, owner=owner)
    finally:
        for note in live.notes:
            say(note)
    say(f"applied to rootfs {rootfs} (pid {pid})")
