"""The hook's and the service's log file stays bounded (libinject.log): past MAX_BYTES it
becomes FILE.1 and a new one starts, whoever writes it; a line is never split across them."""
from __future__ import annotations

import os
import subprocess
import sys

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
    for f in (path, tmp_path / "hook.log.1"):
        text = f.read_text()
        assert len(text) <= 4000 + 4 * 100
        assert all(" INFO w" in ln and ln.endswith("y" * 30) for ln in text.splitlines())
