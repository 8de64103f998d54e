"""Names and numbers the whole package agrees on (one copy each).

Kernel constants (flags, syscall numbers) are not here: they come from the C headers
through cffi (libinject.linux.native).
"""

# The PATH every child we start gets (hooks, ldconfig, NVML): never the caller's.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Driver capabilities (NVIDIA_DRIVER_CAPABILITIES), in NVIDIA's documented order.
ALL_CAPABILITIES = ("compat32", "compute", "display", "graphics", "ngx", "utility", "video")
DEFAULT_CAPABILITIES = frozenset({"utility", "compute"})

# OCI hook stages: every one the runtime spec names, the ones nvhook's hook is called
# at, and the ones that configure a container (the others do nothing).
OCI_HOOK_STAGES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart",
                   "poststop")
HOOK_STAGES = ("prestart", "createContainer", "poststart", "poststop")
CONFIGURE_STAGES = ("prestart", "createContainer")

# Character device majors.
NVIDIA_MAJOR = 195              # /dev/nvidia*, nvidiactl, nvidia-modeset
# Where the driver's capability nodes (MIG access, IMEX channels) are, in /dev.
CAPS_DIR = "/dev/nvidia-caps"

# IPC sockets, as containers see them (the host's are under the driver root's run/).
PERSISTENCED_SOCKET = "/run/nvidia-persistenced/socket"
FABRICMANAGER_SOCKET = "/run/nvidia-fabricmanager/socket"

# `nvhook serve`'s socket ([nvhook] socket; csrc/hookfront.c has the same default).
SERVE_SOCKET = "/run/nvhook/hook.sock"

# Where discovery snapshots live unless [nvhook] snapshot-dir says otherwise.
SNAPSHOT_DIR = "/run/nvhook/snapshots"
# ... and the key that seals them: not under /run, which a root process outside the
# runtime's namespaces may be able to write (a container given the host's /run).
SNAPSHOT_KEY_DIR = "/var/lib/nvhook"
# The X server's GLX module; the driver ships libglxserver_nvidia.so.<version>, X loads this name.
GLXSERVER = "libglxserver_nvidia.so"
