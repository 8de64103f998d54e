"""setup(): the cffi native module (csrc/build_native.py: cffi_modules is a setup()
keyword) and the two static fronts, csrc/hookfront.c and csrc/shimfront.c, installed as
the environment's `nvhook-hook` and `nvhook-runtime`. A wheel is installed wherever pip
puts it, so these fronts are built to find the Python beside them and that environment's
site-packages (NVHOOK_RELATIVE, csrc/pyexec.h): an environment moved or copied whole runs
its own code. `make venv` builds its own over them, bound to the checkout (editable)."""
import os
import shlex
import subprocess

from setuptools import Distribution, setup

build_scripts = Distribution().get_command_class("build_scripts")     # (distutils')

FRONTS = {"csrc/hookfront.c": "nvhook-hook", "csrc/shimfront.c": "nvhook-runtime"}


class build_fronts(build_scripts):
    """Compiles the fronts (the `scripts` are their sources) into the scripts build dir,
    which install_scripts copies to the environment's bin. Static, as `make venv` builds
    them: no dynamic loader runs in a hook (nor an LD_PRELOAD)."""

    def run(self) -> None:
        os.makedirs(self.build_dir, exist_ok=True)
        cc = shlex.split(os.environ.get("CC", "cc"))     # as distutils splits it ("clang --target=...")
        for src, name in FRONTS.items():
            out = os.path.join(self.build_dir, name)
            try:
                r = subprocess.run([*cc, "-O2", "-Wall", "-static", "-DNVHOOK_RELATIVE", "-o", out, src],
                                   capture_output=True, text=True)
            except FileNotFoundError:
                raise SystemExit(f"nvhook: building {name} needs a C compiler ({cc[0]}): "
                                 "apt-get install gcc libc6-dev") from None
            if r.returncode != 0:
                lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
                raise SystemExit(f"nvhook: building {name} from {src} failed (it needs gcc and "
                                 f"libc6-dev's static libc.a): {lines[-1] if lines else r.returncode}")
            os.chmod(out, 0o755)


setup(cffi_modules=["csrc/build_native.py:ffibuilder"], scripts=list(FRONTS),
      cmdclass={"build_scripts": build_fronts})
