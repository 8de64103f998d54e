"""Telling systemd a scope's devices (libinject.apply.sdunit, libinject.linux.sdbus) where
systemd cannot be reached or is not who answers: nothing is sent to an impostor, and the
container keeps what its cgroup was given, with one line saying why systemd was not told.
(With systemd itself: tests/test_daemon_reload.py.)"""
from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from libinject.apply import sdunit
from libinject.apply.cgroups import allow_devices
from libinject.errors import NvhookError
from libinject.linux import sdbus
from libinject.plan.edits import CgroupRule
from support.runc import RuncContainer


def test_a_socket_not_of_pid1_gets_nothing(tmp_path):
    # Anyone who can put a socket at the path (here: this test, not PID 1) is refused
    # before a byte goes to it.
    path = str(tmp_path / "private")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    got = bytearray()

    def serve() -> None:
        conn, _ = srv.accept()
        conn.settimeout(2)
        try:
            while chunk := conn.recv(4096):
                got.extend(chunk)
        except OSError:
            pass
        conn.close()

    t = threading.Thread(target=serve)
    t.start()
    with pytest.raises(NvhookError, match=rf"{path}: its peer is pid {os.getpid()} uid 0 here, not PID 1"):
        sdbus.Systemd(time.monotonic() + 2, path)
    t.join(5)
    srv.close()
    assert bytes(got) == b""


def test_without_systemd_the_container_keeps_its_cgroup_grant(tmp_path):
    with RuncContainer(tmp_path, mode="v1", devices=[("/dev/nvidia1", 195, 1)]) as c:
        c.config["linux"]["cgroupsPath"] = f"/runc-{c.id}.scope"      # (runc removes it)
        c.create()
        c.start()
        rules = [CgroupRule(195, 1)]
        undo = allow_devices(c.pid, rules)
        note = sdunit.keep_across_reload(c.pid, rules, undo, socket_path=str(tmp_path / "none"))
        assert note == (f"systemd: the devices may not outlast a daemon-reload: cannot connect to "
                        f"{tmp_path / 'none'}: No such file or directory")
        assert c.open_result("/dev/nvidia1") == "ENXIO"
        # a cgroup that is no scope: systemd is not asked, nothing to say
        assert sdunit.scope_of(f"0::/nvhook-test-{c.id}/ctr\n") is None
