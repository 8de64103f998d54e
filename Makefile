# make demo: install what is missing, then run the main job on a simulated a100x8 host.
# make test: same install, then the whole suite.
# The venv's interpreter: the distribution's python3 where it is 3.11 or newer (Debian
# builds it with PGO and LTO: an exec'd hook starts and runs ~10% faster than on a plain
# source build, such as a pyenv one found first on PATH), else the python3 on PATH (which
# says so if it is too old: pyproject.toml asks for 3.11).
PYTHON ?= $(shell for p in /usr/bin/python3 python3; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { echo $$p; exit 0; }; \
	done; echo python3)
VENV := .venv
PY := $(VENV)/bin/python
NATIVE_SRC := csrc/native.c csrc/native.h csrc/build_native.py setup.py pyproject.toml

.PHONY: all deps build-deps cross-deps venv demo test bench wheel deb rpm repo bundle image clean
all: venv

# deps: the whole toolchain the tests and demos use (scripts/install-deps lists it).
# build-deps: only what building nvhook and its packages needs.
BUILD_DEPS := gcc libc6-dev gcc-multilib libcap-dev python3-venv python3-dev patchelf binutils git
deps:
	@sh scripts/install-deps

build-deps:
	@sh scripts/install-deps $(BUILD_DEPS)

$(VENV)/.installed: $(NATIVE_SRC) | build-deps
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# The hook's compiled front (csrc/hookfront.c): static (libc.a, from libc6-dev), so no
# dynamic loader (nor LD_PRELOAD) runs in it; it execs this venv's python for GPU
# containers. No dynamic fallback: a front that honoured LD_PRELOAD would be a hole.
# Python starts with -S and this import path (the package's dir and site-packages).
PYPATH = $(shell $(PY) -c 'import sysconfig; print("$(abspath .):" + sysconfig.get_paths()["purelib"])' 2>/dev/null)
FRONT_DEFS = -DNVHOOK_PYTHON='"$(abspath $(PY))"' -DNVHOOK_PYPATH='"$(PYPATH)"'
$(VENV)/bin/nvhook-hook: csrc/hookfront.c csrc/pyexec.h csrc/gpuscan.h csrc/serveclient.h $(VENV)/.installed
	$(CC) -O2 -Wall -static $(FRONT_DEFS) -o $@ csrc/hookfront.c

# The runtime shim's compiled front (csrc/shimfront.c): execs the low-level runtime for
# every command but `create` without starting Python (engines call it many times a container).
$(VENV)/bin/nvhook-runtime: csrc/shimfront.c csrc/pyexec.h csrc/gpuscan.h csrc/serveclient.h $(VENV)/.installed
	$(CC) -O2 -Wall -static $(FRONT_DEFS) -o $@ csrc/shimfront.c

venv: deps $(VENV)/.installed $(VENV)/bin/nvhook-hook $(VENV)/bin/nvhook-runtime

demo: venv
	sh scripts/demo

test: venv
	$(PY) -m pytest -q tests

bench: venv
	$(PY) bench/run.py

# The wheel a node installs (setup.py compiles the static fronts into its scripts).
wheel: venv
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w dist .

# The packages (packaging/build_deb.py, build_rpm.py: the bundle under
# /usr/lib/nvhook/<version>, nothing of the node's needed): dist/nvhook_<version>_amd64.deb
# and dist/nvhook-<version>-1.x86_64.rpm (the .deb's payload); ARCH=arm64: the arm64 ones,
# cross-built from Debian 12's arm64 packages (packaging/arch.py: clang for aarch64, as
# gcc-aarch64-linux-gnu cannot be installed beside gcc-multilib); `make repo`: signed apt and
# rpm repositories of them in dist/repo (packaging/build_repo.py; the key in
# dist/repo.key, made on first use, or GNUPGHOME=DIR). Each installs only what it needs.
VERSION = $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' libinject/__init__.py)
ARCH ?= amd64
RPM_ARCH := $(if $(filter arm64,$(ARCH)),aarch64,x86_64)
DEB := dist/nvhook_$(VERSION)_$(ARCH).deb
RPM := dist/nvhook-$(VERSION)-1.$(RPM_ARCH).rpm
CROSS_DEPS := clang binutils-aarch64-linux-gnu libc6-dev-arm64-cross libgcc-12-dev-arm64-cross mmdebstrap
cross-deps:
	@$(if $(filter amd64,$(ARCH)),true,sh scripts/install-deps $(CROSS_DEPS))

deb: build-deps cross-deps $(VENV)/.installed
	$(PY) packaging/build_deb.py dist --arch $(ARCH)

rpm: deb
	@sh scripts/install-deps rpm
	$(PY) packaging/build_rpm.py dist --from-deb $(DEB)

repo: deb rpm
	@sh scripts/install-deps gpg gpgv createrepo-c rpm
	$(PY) packaging/build_repo.py dist/repo $(DEB) $(RPM) $(if $(GNUPGHOME),--gnupghome $(GNUPGHOME)) \
		$(if $(REPO_URL),--url $(REPO_URL))

# nvhook with its own Python and libraries for any node (packaging/build_bundle.py), and
# the Kubernetes image that carries it (packaging/build_image.py).
bundle: build-deps cross-deps $(VENV)/.installed
	$(PY) packaging/build_bundle.py dist --arch $(ARCH)

image: venv
	$(PY) packaging/build_image.py dist

clean:
	rm -rf $(VENV) build dist *.egg-info libinject/linux/_native*.so libinject/linux/_native.c
