"""What discovery needs to know, in one value: built once from config.toml and the
command line (libinject.config.Config.discover_options), used by every command.
"""
from __future__ import annotations

from libinject.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable


@record(frozen=True)
class DiscoverOptions:
    root: str = "/"                         # driver root
    ldcache: str | None = None              # ld.so.cache, relative to root (None = default)
    dev_root: str | None = None             # where dev/ and proc/ are read (None = root)
    nvml_timeout: float = 10.0              # seconds; a hung driver fails the caller
    user: tuple[int, int] | None = None     # NVML child's uid/gid (None = nobody)
    snapshot: bool = True                   # reuse/write discovery snapshots
    snapshot_dir: str | None = None         # None = libinject.constants.SNAPSHOT_DIR

    def discover(self, fn: Callable | None = None, log: Callable[[str], None] | None = None):
        """The Driver under these options; fn stands in for discover.driver.discover
        (the hook service's cache has its signature). log: gets a line when a bad
        snapshot is discarded."""
        if fn is None:
            from libinject.discover.driver import discover as fn
        return fn(self.root, ldcache=self.ldcache, dev_root=self.dev_root,
                  nvml_timeout=self.nvml_timeout, user=self.user, snapshot=self.snapshot,
                  snapshot_dir=self.snapshot_dir, log=log)
