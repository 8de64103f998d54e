"""Which lib dirs an image gets its driver libraries in (container_lib_dirs), where the
kernel (or an emulator: qemu-user before 9.1, which runs the arm64 package's tests) has no
openat2: the image is still looked at only inside its rootfs, a link counting as absent."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from libinject.discover import libraries


@pytest.fixture
def no_openat2(monkeypatch):
    def enosys(*args, **kw):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr("libinject.apply.rootfs.openat2", enosys)


def test_a_debian_image_is_found_without_openat2(tmp_path, no_openat2):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/debian_version").write_text("12.0\n")
    assert libraries.container_lib_dirs(str(tmp_path)) == libraries.DEBIAN_LIB_DIRS


def test_without_openat2_no_link_of_the_image_is_followed(tmp_path, no_openat2):
    """/etc -> the host's /etc (which has debian_version: this machine is Debian) and
    usr/lib/x86_64-linux-gnu -> /usr/lib/x86_64-linux-gnu: neither is looked through."""
    assert Path("/etc/debian_version").is_file() and Path(libraries.DEBIAN_LIB_DIRS[0]).is_dir()
    (tmp_path / "etc").symlink_to("/etc")
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "usr/lib/x86_64-linux-gnu").symlink_to(libraries.DEBIAN_LIB_DIRS[0])
    assert libraries.container_lib_dirs(str(tmp_path)) == libraries.RPM_LIB_DIRS
    (tmp_path / "etc").unlink()
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/debian_version").symlink_to("../../../../../../etc/debian_version")
    assert libraries.container_lib_dirs(str(tmp_path)) == libraries.RPM_LIB_DIRS
