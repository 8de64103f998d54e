"""cffi out-of-line API-mode build: native.h is the cdef, native.c the source."""
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

ffibuilder = FFI()
ffibuilder.cdef((HERE / "native.h").read_text())
ffibuilder.set_source(
    "libinject.linux._native",
    (HERE / "native.c").read_text(),
    include_dirs=[str(HERE)],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
