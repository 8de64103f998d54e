"""The parsed-config cache (libinject.config): in memory only, keyed by the BLAKE2b of
the file's bytes, so the hook service parses a node's config once and never serves a
stale one; nothing on disk is ever read in place of the file (a root process that can
write the host's /run, e.g. a container given it as a volume, must not be able to hand
exec'd hooks a config of its own)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from libinject import config

REPO = Path(__file__).resolve().parent.parent
CONFIG = '[nvidia-container-cli]\nroot = "/driver"\n[nvhook]\nnvml-timeout = 7\n'


def _config(tmp_path: Path, text: str = CONFIG) -> Path:
    d = tmp_path / "etc"
    d.mkdir(mode=0o755, exist_ok=True)
    os.chmod(tmp_path, 0o755)
    p = d / "config.toml"
    p.write_text(text)
    p.chmod(0o644)
    return p


def test_second_load_parses_no_toml(tmp_path, monkeypatch):
    cfg = _config(tmp_path)
    first = config.load(str(cfg), {}, trusted=True)
    import tomllib

    def refuse(*a, **k):
        raise AssertionError("parsed again")

    monkeypatch.setattr(tomllib, "loads", refuse)
    again = config.load(str(cfg), {}, trusted=True)
    assert (again.cli.root, again.nvhook.nvml_timeout) == (first.cli.root, first.nvhook.nvml_timeout) \
        == ("/driver", 7.0)


def test_changed_file_is_read_again(tmp_path):
    cfg = _config(tmp_path)
    assert config.load(str(cfg), {}, trusted=True).cli.root == "/driver"
    cfg.write_text(CONFIG.replace("/driver", "/other"))
    assert config.load(str(cfg), {}, trusted=True).cli.root == "/other"


def test_bad_config_is_refused_every_time(tmp_path):
    import pytest

    from libinject.errors import NvhookError

    cfg = _config(tmp_path, '[nvhook]\nnvml-timeout = "x"\n')
    for _ in range(2):
        with pytest.raises(NvhookError, match="nvml-timeout: expected a number"):
            config.load(str(cfg), {}, trusted=True)


def test_a_table_planted_in_run_is_never_read(tmp_path):
    """The attack on an on-disk cache: a root-owned, root-only entry under /run/nvhook
    named after the config's digest, saying root = /evil. A fresh hook process (as the
    exec'd hook) reads the file, not the plant, and writes nothing under /run/nvhook."""
    import marshal

    cfg = _config(tmp_path)
    try:
        from _blake2 import blake2b
    except ImportError:  # pragma: no cover
        from hashlib import blake2b
    name = blake2b(cfg.read_bytes(), digest_size=20).hexdigest()
    plant_dir = Path("/run/nvhook/config")
    made = not plant_dir.exists()
    plant_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    plant = plant_dir / name
    plant.write_bytes(marshal.dumps({"nvidia-container-cli": {"root": "/evil"}}))
    plant.chmod(0o600)
    before = sorted(os.listdir(plant_dir))
    try:
        code = ("import sys; sys.path.insert(0, sys.argv[1]); from libinject import config; "
                "print(config.load(sys.argv[2], {}, trusted=True).cli.root)")
        out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(REPO), str(cfg)],
                             capture_output=True, text=True, check=True).stdout
        assert out.strip() == "/driver"
        assert sorted(os.listdir(plant_dir)) == before
    finally:
        plant.unlink()
        if made:
            plant_dir.rmdir()


def test_built_config_is_kept_per_path(tmp_path):
    """The same bytes at the same path give the very Config built before (frozen); the
    same bytes elsewhere, their own (relative paths in it are the file's dir's)."""
    cfg = _config(tmp_path, CONFIG + 'log-file = "hook.log"\n')
    first = config.load(str(cfg), {}, trusted=True)
    assert config.load(str(cfg), {}, trusted=True) is first
    assert first.nvhook.log_file == str(tmp_path / "etc/hook.log")
    other = tmp_path / "other"
    other.mkdir(mode=0o755)
    (other / "config.toml").write_bytes(cfg.read_bytes())
    (other / "config.toml").chmod(0o644)
    second = config.load(str(other / "config.toml"), {}, trusted=True)
    assert second is not first and second.nvhook.log_file == str(other / "hook.log")
    assert second.source == str(other / "config.toml")
    cfg.write_text(CONFIG)
    assert config.load(str(cfg), {}, trusted=True).nvhook.log_file == ""


def test_a_served_requests_second_load_reads_nothing(tmp_path, monkeypatch):
    """Only where a hook service worker asks (config._request_loads, for its one
    request): the hook's load after the worker's own early one is that Config; every
    other load reads and checks the file."""
    from libinject.linux import files

    cfg = _config(tmp_path)
    monkeypatch.setattr(config, "_request_loads", {})
    first = config.load(str(cfg), {}, trusted=True)

    def refuse(*a, **k):
        raise AssertionError("read again")

    monkeypatch.setattr(files, "read_bounded", refuse)
    assert config.load(str(cfg), {}, trusted=True) is first
    monkeypatch.setattr(config, "_request_loads", None)
    import pytest
    with pytest.raises(AssertionError, match="read again"):
        config.load(str(cfg), {}, trusted=True)
