"""The hook's and the service's log file stays bounded (libinject.log): past MAX_BYTES it
becomes FILE.1 and a new one starts, whoever writes it; a line is never split across them.
And where it may be written (the attacks: tests/test_trust_log.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from libinject import log


def test_a_log_past_its_bound_moves_to_dot_1_and_starts_again(tmp_path, monkeypatch):
    monkeypatch.setattr(log, "MAX_BYTES", 1000)
    path = tmp_path / "hook.log"
    lg = log.Log(str(path))
    for i in range(100):
        lg.info(f"line {i:03d} " + "x" * 40)
    old, new = (tmp_path / "hook.log.1").read_text(), path.read_text()
    assert len(old) <= 1000 + 100 and len(new) <= 1000 + 100
    every = [ln.split(" INFO ")[1][:8] for ln in (old + new).splitlines()]
    assert every == sorted(every) and every[-1] == "line 099"       # the newest lines, in order, whole
    assert sorted(os.listdir(tmp_path)) == ["hook.log", "hook.log.1"]


def test_writers_in_many_processes_keep_it_bounded(tmp_path):
    path = tmp_path / "hook.log"
    code = ("import sys; from libinject import log; log.MAX_BYTES = 4000; lg = log.Log(sys.argv[1]); "
            "[lg.info('w%s %04d ' % (sys.argv[2], i) + 'y' * 30) for i in range(400)]")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(n)]) for n in range(4)]
    assert [p.wait(120) for p in procs] == [0] * 4
    assert (tmp_path / "hook.log.1").exists()
    for f in (path, tmp_path / "hook.log.1"):
        # (no hook.log when the very last line was the one that rotated it: ~1 run in 50)
        text = f.read_text() if f.exists() else ""
        assert len(text) <= 4000 + 4 * 100
        assert all(" INFO w" in ln and ln.endswith("y" * 30) for ln in text.splitlines())


def test_two_writers_past_the_bound_never_drop_the_file_before(tmp_path, monkeypatch):
    """B and A both find the log past its bound and both check it is still the file they
    wrote: B is stopped between its check and its rename, A renames it to FILE.1, C's
    next line starts a new file; B's rename then moved C's new file over FILE.1, so the
    full one was dropped a rotation early. (Threads: flock() locks are per open file, so
    they exclude each other as processes' would.)"""
    import threading

    monkeypatch.setattr(log, "MAX_BYTES", 1000)
    path = tmp_path / "hook.log"
    path.write_text("old line\n" * 120)                 # past the bound: the next line rotates
    paused, go = threading.Event(), threading.Event()
    rename = os.rename

    def stopping_rename(*args, **kw):
        if threading.current_thread().name == "B":
            paused.set()
            assert go.wait(60)
        return rename(*args, **kw)

    monkeypatch.setattr(os, "rename", stopping_rename)
    b = threading.Thread(target=log.Log(str(path)).info, args=("from B",), name="B")
    b.start()
    assert paused.wait(60)
    log.Log(str(path)).info("from A")
    log.Log(str(path)).info("from C")
    go.set()
    b.join(60)
    assert not b.is_alive()
    old = (tmp_path / "hook.log.1").read_text()
    new = path.read_text() if path.exists() else ""
    assert old.startswith("old line\n" * 120)           # the full file is FILE.1, not dropped
    assert sorted(ln.split(" INFO ")[1] for ln in (old + new).splitlines()[120:]) == ["from A", "from B", "from C"]


def test_root_s_own_links_on_the_way_are_followed(tmp_path, capfd):
    """As /var/run -> /run: a link of root's in a directory only root writes is taken."""
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to("real")
    fds = sorted(os.listdir("/proc/self/fd"))
    lg = log.Log(str(tmp_path / "alias/hook.log"))
    lg.info("through a link of root's")
    lg.close()
    assert (tmp_path / "real/hook.log").read_text().endswith(" INFO through a link of root's\n")
    assert capfd.readouterr().err == ""
    assert sorted(os.listdir("/proc/self/fd")) == fds          # nothing left open on the way


@pytest.mark.parametrize("mode, who", [(0o1777, "everyone"), (0o775, "group root (gid 0)")])
def test_a_directory_others_can_write_holds_no_log(tmp_path, capfd, mode, who):
    """Sticky or not: whoever can add entries there can make the name a FIFO, a hard
    link or their own file before root's first line."""
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(mode)
    lg = log.Log(str(d / "hook.log"))
    lg.info("one")
    lg.info("two")
    assert not (d / "hook.log").exists()
    assert capfd.readouterr().err == (f"nvhook: log file {d}/hook.log: directory {d} is writable by {who}; "
                                      "not logging there\n")       # once, not once per line
