"""A real runc container for tests, on cgroup v1 or on cgroup v2.

Modes (RUNTIMES.md):
- "v1": plain runc on this hybrid host; runc uses the v1 `devices` controller.
- "v2": runc in a private mount namespace with cgroup2 mounted on /sys/fs/cgroup, so
  runc sees a pure-v2 host and guards devices with its own eBPF program. Every runc
  command of the container runs in that namespace (`nsenter -t <ns_pid> -m`), and so do
  commands wrapped with `host_cmd()`; nothing is mounted in the test's own namespace.

The bundle is `runc spec`'s config with process.terminal=false, a busybox+glibc rootfs
(libinject.sim.rootfs.build_rootfs), linux.resources as runc's default (deny all, runc
adds its default allow-list) and linux.devices extended with the nodes you ask for
(*not* allowed in resources, so opening them gives EPERM until something allows them).
The root is writable by default (readonly_root=True for runc's default).

Example (import as `from support.runc import RuncContainer, open_result`; pytest puts
tests/ on sys.path):

    def test_gpu_node(tmp_path):
        with RuncContainer(tmp_path, mode="v2",
                           devices=[("/dev/nvidia0", 195, 0), ("/dev/nvidia1", 195, 1)]) as c:
            c.create()            # runs runc create (prestart/createRuntime hooks run here)
            c.start()             # the process (default `sleep 1000`) now runs
            assert c.open_result("/dev/nvidia1") == "EPERM"
            r = run(c.host_cmd([NVHOOK, "configure", "--pid", str(c.pid), ...]))
            out = c.exec("sh", "-c", "ls /dev")     # CompletedProcess, text
        # leaving the block: runc delete -f, namespace helper killed, bundle removed

Hooks: `RuncContainer(..., hooks={"prestart": [{"path": "/x", "args": ["x", "prestart"],
"env": ["A=1"], "timeout": 10}]})` (OCI config `hooks` verbatim), or edit `c.config`
(the config.json dict) before create(). runc runs a hook with exactly its args and env:
for a Python hook give the interpreter's full path as args[0] too (`"args":
[sys.executable, "-I", script, ...]`) -- Python finds its prefix/venv from argv[0], and
a bare "python3" there (with PATH in env) can pick another Python's stdlib
("No module named '_posixsubprocess'").
Prestart hooks run in the runtime's namespaces (v2: the private one, where cgroup2 is
/sys/fs/cgroup) with the host pid in the state; the container's cgroup (v1 devices or
runc's eBPF program) is already in place then. A foreground one-shot: `c.run()` with `args`
that exit (returns CompletedProcess with the container's stdout/stderr).
"""
from __future__ import annotations

import ctypes
import itertools
import json
import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

RUNC = shutil.which("runc") or "/usr/sbin/runc"
NS_HELPER_TIMEOUT = 30      # s for the v2 namespace helper to mount cgroup2 and say so
_ids = itertools.count()

# busybox error texts -> errno names, for open_result()
_ERRORS = {
    "Operation not permitted": "EPERM",
    "No such device or address": "ENXIO",
    "No such file or directory": "ENOENT",
    "Permission denied": "EACCES",
    "No such device": "ENODEV",
}


class RuncError(RuntimeError):
    pass


def _die_with_parent() -> None:
    # The namespace helper must not outlive a crashed test run.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def open_result(stderr: str, rc: int) -> str:
    """Map the outcome of busybox `dd if=PATH ...` to "OK", "EPERM", "ENXIO", ..."""
    if rc == 0:
        return "OK"
    for text, name in _ERRORS.items():
        if text in stderr:
            return name
    return f"rc={rc}: {stderr.strip()}"


class RuncContainer:
    """One runc container; use as a context manager so it is always cleaned up.

    workdir: an existing directory (e.g. pytest's tmp_path); the bundle and runc's state
      root go under it.
    mode: "v1" or "v2" (see the module docstring).
    args/env/cwd: the container process (default `sleep 1000`, so tests can exec into it
      and read /proc/PID). env defaults to runc spec's PATH/TERM.
    devices: (path, major, minor) or (path, type, major, minor) nodes for linux.devices,
      created by runc in the container's /dev but not allowed by the cgroup.
    allow: extra linux.resources.devices rules, e.g. [{"allow": True, "type": "c",
      "major": 195, "minor": 0, "access": "rw"}].
    hooks: the OCI config's "hooks" object.
    rootfs: an existing rootfs dir to use (not deleted); default: build one in the bundle.
    """

    def __init__(self, workdir: str | os.PathLike[str], *, mode: str = "v1",
                 args: Sequence[str] = ("sleep", "1000"), env: Sequence[str] | None = None,
                 cwd: str = "/", devices: Iterable[Sequence[Any]] = (),
                 allow: Iterable[Mapping[str, Any]] = (),
                 hooks: Mapping[str, Any] | None = None,
                 rootfs: str | os.PathLike[str] | None = None, lib_layout: str = "debian",
                 readonly_root: bool = False, annotations: Mapping[str, str] | None = None,
                 name: str | None = None) -> None:
        if mode not in ("v1", "v2"):
            raise ValueError(f"mode must be v1 or v2, not {mode!r}")
        self.mode = mode
        self.id = name or f"nvh{os.getpid()}-{next(_ids)}-{os.urandom(3).hex()}"
        self.workdir = Path(workdir)
        self.bundle = self.workdir / f"bundle-{self.id}"
        self.state_root = self.workdir / f"runc-{self.id}"
        self._own_rootfs = rootfs is None
        self.rootfs = Path(rootfs).resolve() if rootfs else self.bundle / "rootfs"
        self.ns_pid: int | None = None       # v2: the process holding the private mount ns
        self._ns_proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None
        self._created = False
        self._log = self.bundle / "runc.out"

        self.bundle.mkdir(parents=True)
        if self._own_rootfs:
            from libinject.sim.rootfs import build_rootfs
            build_rootfs(self.rootfs, lib_layout=lib_layout)
        subprocess.run([RUNC, "spec", "--bundle", str(self.bundle)], check=True,
                       capture_output=True, timeout=60)
        cfg = json.loads((self.bundle / "config.json").read_text())
        cfg["root"] = {"path": str(self.rootfs), "readonly": readonly_root}
        proc = cfg["process"]
        proc["terminal"] = False
        proc["args"] = list(args)
        proc["cwd"] = cwd
        if env is not None:
            proc["env"] = list(env)
        for d in devices:
            path, typ, major, minor = (d[0], "c", d[1], d[2]) if len(d) == 3 else tuple(d)
            cfg["linux"].setdefault("devices", []).append(
                {"path": path, "type": typ, "major": major, "minor": minor,
                 "fileMode": 0o666, "uid": 0, "gid": 0})
        cfg["linux"]["resources"]["devices"].extend(dict(a) for a in allow)
        if hooks:
            cfg["hooks"] = dict(hooks)
        if annotations:
            cfg["annotations"] = dict(annotations)
        self.config: dict[str, Any] = cfg    # edit freely before create()/run()

    # -- namespaces -------------------------------------------------------------------
    def _ensure_ns(self) -> None:
        if self.mode != "v2" or self._ns_proc is not None:
            return
        self._ns_proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             "mount -t cgroup2 none /sys/fs/cgroup && echo ready && exec sleep 100000"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent)
        assert self._ns_proc.stdout is not None and self._ns_proc.stderr is not None
        ready, _, _ = select.select([self._ns_proc.stdout], [], [], NS_HELPER_TIMEOUT)
        line = self._ns_proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self._ns_proc.kill()
            self._ns_proc.wait(30)
            err = self._ns_proc.stderr.read()
            self._ns_proc = None
            why = err.decode().strip() if ready else f"no answer within {NS_HELPER_TIMEOUT} s"
            raise RuncError(f"cgroup2 namespace helper failed: {why}")
        self.ns_pid = self._ns_proc.pid

    def host_cmd(self, argv: Sequence[str]) -> list[str]:
        """argv wrapped to run where the runtime runs (its mount namespace in v2 mode),
        i.e. where a hook or `nvhook configure --pid` would run."""
        self._ensure_ns()
        if self.mode == "v2":
            return ["nsenter", "-t", str(self.ns_pid), "-m", "--", *argv]
        return list(argv)

    def runc(self, *args: str, check: bool = True, timeout: float = 60,
             **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run `runc --root STATE ARGS...` (in the v2 namespace when mode is v2)."""
        kw.setdefault("capture_output", True)
        if "input" not in kw:
            kw.setdefault("stdin", subprocess.DEVNULL)
        r = subprocess.run(self.host_cmd([RUNC, "--root", str(self.state_root), *args]),
                           text=True, timeout=timeout, **kw)
        if check and r.returncode != 0:
            raise RuncError(f"runc {' '.join(args)} failed ({r.returncode}): "
                            f"{(r.stderr or '').strip()}")
        return r

    def write_config(self) -> None:
        (self.bundle / "config.json").write_text(json.dumps(self.config, indent=1))

    # -- lifecycle ----------------------------------------------------------------------
    def create(self, timeout: float = 60) -> int:
        """`runc create`: namespaces and cgroup made, create-stage hooks run, the process
        waits for start(). Returns the container's host pid. Raises RuncError (with runc's
        message, which includes a failing hook's stderr) on failure."""
        self.write_config()
        # The container inherits runc's stdio: give it a file so nothing waits on a pipe.
        with open(self._log, "wb") as out:
            r = subprocess.run(self.host_cmd([RUNC, "--root", str(self.state_root), "create",
                                              "--bundle", str(self.bundle), self.id]),
                               stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                               timeout=timeout)
        self._created = True   # even on failure runc may have left state behind
        if r.returncode != 0:
            raise RuncError(f"runc create failed ({r.returncode}): {self.output().strip()}")
        return self.pid

    def start(self, wait: float = 5.0) -> None:
        """`runc start`, then wait (up to `wait` s) until the process has exec'd its args:
        runc start returns before that, and /proc/PID would still show `runc init`.
        Raises RuncError if it has not by then."""
        self.runc("start", self.id)
        want = b"".join(a.encode() + b"\0" for a in self.config["process"]["args"])
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{self.pid}/cmdline", "rb") as f:
                    if f.read() == want:
                        return
            except (FileNotFoundError, ProcessLookupError):
                return   # exited already (a short-lived process)
            time.sleep(0.002)
        raise RuncError(f"container {self.id}: process {self.pid} did not exec "
                        f"{self.config['process']['args']} within {wait} s of runc start")

    def run(self, timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess[str]:
        """`runc run` in the foreground (set args to something that exits): returns the
        container's exit status and output. The container is gone afterwards."""
        self.write_config()
        self._created = True
        return self.runc("run", "--bundle", str(self.bundle), self.id, check=check,
                         timeout=timeout)

    def exec(self, *cmd: str, env: Sequence[str] = (), check: bool = False,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run cmd in the container (runc exec); returns CompletedProcess (text)."""
        envargs = [a for e in env for a in ("--env", e)]
        return self.runc("exec", *envargs, self.id, *cmd, check=check, timeout=timeout)

    def state(self) -> dict[str, Any]:
        return json.loads(self.runc("state", self.id).stdout)

    @property
    def pid(self) -> int:
        """The container's init process, as a host pid (for /proc/PID, --pid)."""
        if self._pid is None:
            self._pid = int(self.state()["pid"])
        return self._pid

    def output(self) -> str:
        """What runc create and the container process wrote to stdout/stderr so far."""
        try:
            return self._log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def open_result(self, path: str) -> str:
        """Open `path` for reading inside the container: "OK", "EPERM" (cgroup denies),
        "ENXIO" (cgroup allows; no driver behind major 195 here), "ENOENT", ..."""
        r = self.exec("dd", f"if={path}", "of=/dev/null", "bs=1", "count=0")
        return open_result(r.stderr, r.returncode)

    def cgroup_dir(self, controller: str = "") -> Path:
        """The container's cgroup dir as seen from the test's namespace: v1 controller
        ("devices") or "" for the unified (cgroup2) hierarchy."""
        for line in Path(f"/proc/{self.pid}/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            if (controller == "" and ctrls == "") or controller in ctrls.split(","):
                base = "/sys/fs/cgroup/" + (controller or "unified")
                return Path(base + path)
        raise LookupError(controller)

    def delete(self) -> None:
        """runc delete -f, kill the namespace helper, remove the bundle. Idempotent."""
        if self._created:
            try:
                self.runc("delete", "-f", self.id, check=False, timeout=30)
            finally:
                self._created = False
        if self._ns_proc is not None:
            self._ns_proc.kill()
            self._ns_proc.wait(30)
            for f in (self._ns_proc.stdout, self._ns_proc.stderr):
                if f:
                    f.close()
            self._ns_proc = None
            self.ns_pid = None
        shutil.rmtree(self.state_root, ignore_errors=True)
        if self._own_rootfs:
            shutil.rmtree(self.bundle, ignore_errors=True)
        else:
            for f in ("config.json", "runc.out"):
                (self.bundle / f).unlink(missing_ok=True)
            try:
                self.bundle.rmdir()
            except OSError:
                pass
        self._pid = None

    def __enter__(self) -> "RuncContainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()
