"""The hook's parsed-config cache (libinject.config): a trusted load as root keeps the
TOML table it parsed in a root-only directory, keyed by the file's bytes, so the next
hook process builds its Config without tomllib; nothing in a directory or file that
another user could have written is believed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from libinject import config

REPO = Path(__file__).resolve().parent.parent
CONFIG = '[nvidia-container-cli]\nroot = "/driver"\n[nvhook]\nnvml-timeout = 7\n'

# A hook's load in a fresh process (as the exec'd hook): prints root, nvml-timeout and
# whether tomllib was imported.
LOAD = """
import sys
sys.path.insert(0, sys.argv[1])
from libinject import config
config.CONFIG_CACHE_DIR = sys.argv[2]
cfg = config.load(sys.argv[3], {}, trusted=True)
print(cfg.cli.root, cfg.nvhook.nvml_timeout, "tomllib" in sys.modules)
"""


def _load(cache: Path, cfg: Path) -> str:
    return subprocess.run([sys.executable, "-I", "-S", "-c", LOAD, str(REPO), str(cache), str(cfg)],
                          capture_output=True, text=True, check=True).stdout.strip()


def _config(tmp_path: Path, text: str = CONFIG) -> Path:
    d = tmp_path / "etc"
    d.mkdir(mode=0o755, exist_ok=True)
    os.chmod(tmp_path, 0o755)
    p = d / "config.toml"
    p.write_text(text)
    p.chmod(0o644)
    return p


def test_second_hook_process_parses_no_toml(tmp_path):
    cfg, cache = _config(tmp_path), tmp_path / "run/nvhook/config"
    assert _load(cache, cfg) == "/driver 7.0 True"
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    assert len(list(cache.iterdir())) == 1
    assert _load(cache, cfg) == "/driver 7.0 False"


def test_changed_file_is_read_again(tmp_path):
    cfg, cache = _config(tmp_path), tmp_path / "cache"
    _load(cache, cfg)
    cfg.write_text(CONFIG.replace("/driver", "/other"))
    assert _load(cache, cfg) == "/other 7.0 True"
    assert _load(cache, cfg) == "/other 7.0 False"


def _plant(cache: Path, cfg: Path) -> Path:
    """The cache entry for cfg's bytes, rewritten to say root = /evil."""
    _load(cache, cfg)
    [entry] = [p for p in cache.iterdir() if not p.name.startswith(".")]
    import marshal

    table = marshal.loads(entry.read_bytes())
    table["nvidia-container-cli"]["root"] = "/evil"
    entry.write_bytes(marshal.dumps(table))
    return entry


def test_entry_another_user_owns_is_not_believed(tmp_path):
    cfg, cache = _config(tmp_path), tmp_path / "cache"
    entry = _plant(cache, cfg)
    os.chown(entry, 65534, 65534)
    assert _load(cache, cfg) == "/driver 7.0 True"


def test_directory_others_can_write_is_not_believed(tmp_path):
    cfg, cache = _config(tmp_path), tmp_path / "cache"
    _plant(cache, cfg)
    cache.chmod(0o777)
    assert _load(cache, cfg) == "/driver 7.0 True"
    cache.chmod(0o700)
    assert _load(cache, cfg) == "/evil 7.0 False"     # the control: the same entry, believed


def test_symlinked_directory_is_not_followed(tmp_path):
    cfg, real = _config(tmp_path), tmp_path / "real"
    _plant(real, cfg)
    link = tmp_path / "cache"
    link.symlink_to(real)
    assert _load(link, cfg) == "/driver 7.0 True"


def test_untrusted_loads_use_no_directory(tmp_path, monkeypatch):
    cfg, cache = _config(tmp_path), tmp_path / "cache"
    monkeypatch.setattr(config, "CONFIG_CACHE_DIR", str(cache))
    assert config.load(str(cfg), {}).cli.root == "/driver"
    assert not cache.exists()


def test_dates_are_parsed_every_time(tmp_path):
    cfg, cache = _config(tmp_path, CONFIG + "[other]\nwhen = 2026-11-22T10:00:00Z\n"), tmp_path / "cache"
    assert _load(cache, cfg) == "/driver 7.0 True"
    assert not cache.exists()
    assert _load(cache, cfg) == "/driver 7.0 True"


def test_bad_config_is_refused_every_time(tmp_path):
    cfg, cache = _config(tmp_path, '[nvhook]\nnvml-timeout = "x"\n'), tmp_path / "cache"
    for _ in range(2):
        r = subprocess.run([sys.executable, "-I", "-S", "-c", LOAD, str(REPO), str(cache), str(cfg)],
                           capture_output=True, text=True)
        assert r.returncode == 1 and "nvml-timeout: expected a number" in r.stderr
