# cffi_modules is a setup() keyword, so the out-of-line native module needs this stub.
from setuptools import setup

setup(cffi_modules=["csrc/build_native.py:ffibuilder"])
