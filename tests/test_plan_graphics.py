"""The planner's graphics and display edits (ICD/vendor files, X modules, DRM nodes and
their links) against a hand-built discovery result, by capability."""
from __future__ import annotations

import pytest

from libinject.discover.model import DeviceNode, DrmNode, HostFile, Library
from libinject.plan.planner import plan
from libinject.record import replace
from libinject.request.model import Request
from test_plan import LIB, VER, make_driver

XORG = "/usr/lib/xorg/modules"
FILES = (  # (container path, capability)
    ("/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "graphics"),
    ("/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json", "graphics"),
    ("/etc/vulkan/icd.d/nvidia_icd.json", "graphics"),
    ("/usr/share/vulkan/implicit_layer.d/nvidia_layers.json", "graphics"),
    (f"/usr/share/nvidia/nvidia-application-profiles-{VER}-rc", "graphics"),
    ("/etc/OpenCL/vendors/nvidia.icd", "compute"),
    ("/usr/share/X11/xorg.conf.d/10-nvidia.conf", "display"),
    (f"{XORG}/drivers/nvidia_drv.so", "display"),
    (f"{XORG}/extensions/libglxserver_nvidia.so.{VER}", "display"),
)


@pytest.fixture
def gdriver(tmp_path):
    d = make_driver(tmp_path / "host", ngpus=3)
    root = d.root
    extra = [Library(f"{root}{LIB}/libnvidia-allocator.so.{VER}", "libnvidia-allocator.so.1", "compute"),
             Library(f"{root}{LIB}/libnvidia-vulkan-producer.so.{VER}", f"libnvidia-vulkan-producer.so.{VER}",
                     "graphics", extra=True),
             Library(f"{root}{LIB}/libnvidia-egl-gbm.so.1.1.1", "libnvidia-egl-gbm.so.1", "graphics")]
    drm = []
    for i, g in enumerate(d.info.gpus):
        bus = g.procfs_name
        for name, minor, kind in ((f"card{i}", i, "card"), (f"renderD{128 + i}", 128 + i, "render")):
            node = DeviceNode(f"{root}/dev/dri/{name}", f"/dev/dri/{name}", 226, minor, "graphics")
            # GPU 2's nodes were found through sysfs: no by-path link on the host
            drm.append(DrmNode(g.bus_id, node, f"/dev/dri/by-path/pci-{bus}-{kind}" if i < 2 else ""))
    return replace(d, libraries=d.libraries + tuple(extra), drm_devices=tuple(drm),
                   graphics_files=tuple(HostFile(f"{root}{p}", p, cap, "graphics") for p, cap in FILES))


def edits(driver, caps: str, devices: str = "1"):
    return plan(Request(devices=devices, capabilities=frozenset(caps.split(","))), driver)


def files(e) -> list[str]:
    return [m.container_path for m in e.mounts if m.kind == "graphics"]


def test_files_follow_capabilities(gdriver):
    assert files(edits(gdriver, "utility")) == []
    assert files(edits(gdriver, "compute")) == ["/etc/OpenCL/vendors/nvidia.icd"]
    assert files(edits(gdriver, "graphics")) == [p for p, c in FILES if c == "graphics"]
    assert files(edits(gdriver, "display")) == [p for p, c in FILES if c in ("graphics", "display")]
    assert files(edits(gdriver, "all")) == [p for p, _ in FILES]
    e = edits(gdriver, "graphics")
    assert all(m.options == ("ro", "nosuid", "nodev", "bind") for m in e.mounts if m.kind == "graphics")
    assert {m.host_path for m in e.mounts if m.kind == "graphics"} == {f"{gdriver.root}{p}" for p in files(e)}


def test_drm_nodes_of_the_selected_gpus_only(gdriver):
    e = edits(gdriver, "graphics", "1")
    drm = [(d.path, d.major, d.minor, d.kind) for d in e.device_nodes if d.kind == "drm"]
    assert drm == [("/dev/dri/card1", 226, 1, "drm"), ("/dev/dri/renderD129", 226, 129, "drm")]
    assert {(r.major, r.minor) for r in e.cgroup_rules} >= {(226, 1), (226, 129)}
    assert not {(r.major, r.minor) for r in e.cgroup_rules} & {(226, 0), (226, 128), (226, 2), (226, 130)}
    links = {s.link: s.target for s in e.symlinks if s.link.startswith("/dev/")}
    bus = gdriver.info.gpus[1].procfs_name
    assert links == {f"/dev/dri/by-path/pci-{bus}-card": "../card1",
                     f"/dev/dri/by-path/pci-{bus}-render": "../renderD129"}
    # a GPU whose nodes the host has no by-path link for: the nodes, no link
    e2 = edits(gdriver, "display", "2")
    assert [d.path for d in e2.device_nodes if d.kind == "drm"] == ["/dev/dri/card2", "/dev/dri/renderD130"]
    assert not [s for s in e2.symlinks if s.link.startswith("/dev/")]
    # no graphics capability: no DRM node, no link, no rule for major 226
    for caps in ("utility,compute", "video", "ngx,compat32"):
        e3 = edits(gdriver, caps, "all")
        assert not [d for d in e3.device_nodes if d.kind == "drm"]
        assert not [r for r in e3.cgroup_rules if r.major == 226]
        assert not [s for s in e3.symlinks if s.link.startswith("/dev/")]


def test_device_order_and_modeset(gdriver):
    e = edits(gdriver, "display", "0,1")
    assert [d.kind for d in e.device_nodes] == ["control", "control", "gpu", "gpu", "drm", "drm", "drm", "drm"]
    assert [d.path for d in e.device_nodes[:2]] == ["/dev/nvidiactl", "/dev/nvidia-modeset"]


def test_graphics_links(gdriver):
    e = edits(gdriver, "graphics,display")
    links = {s.link: s.target for s in e.symlinks}
    assert links[f"{LIB}/gbm/nvidia-drm_gbm.so"] == "../libnvidia-allocator.so.1"
    assert links[f"{LIB}/libnvidia-vulkan-producer.so"] == f"libnvidia-vulkan-producer.so.{VER}"
    assert links[f"{XORG}/extensions/libglxserver_nvidia.so"] == f"libglxserver_nvidia.so.{VER}"
    libs = {m.container_path.rsplit("/", 1)[1] for m in e.mounts if m.kind == "library"}
    # gbm's backend comes with graphics even without compute
    assert {f"libnvidia-allocator.so.{VER}", "libnvidia-egl-gbm.so.1.1.1"} <= libs
    assert links[f"{LIB}/libnvidia-egl-gbm.so.1"] == "libnvidia-egl-gbm.so.1.1.1"
    # graphics without display: no X module, so no link to one
    g = {s.link for s in edits(gdriver, "graphics").symlinks}
    assert f"{XORG}/extensions/libglxserver_nvidia.so" not in g
    assert f"{LIB}/gbm/nvidia-drm_gbm.so" in g
    c = {s.link for s in edits(gdriver, "compute").symlinks}
    assert f"{LIB}/gbm/nvidia-drm_gbm.so" not in c and f"{LIB}/libnvidia-vulkan-producer.so" not in c


def test_mig_devices_get_no_drm_nodes(tmp_path):
    d = make_driver(tmp_path / "mig", ngpus=2, mig=True)
    g = d.info.gpus[0]
    node = DeviceNode(f"{d.root}/dev/dri/card0", "/dev/dri/card0", 226, 0, "graphics")
    d = replace(d, drm_devices=(DrmNode(g.bus_id, node, ""),))
    assert not [x for x in edits(d, "graphics", "0:0").device_nodes if x.kind == "drm"]
    assert [x.path for x in edits(d, "graphics", "0").device_nodes if x.kind == "drm"] == ["/dev/dri/card0"]
