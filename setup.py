# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#
# The build of the _larder extension for `pip install .` (pyproject.toml): CMake builds the
# target larder_python in LARDER_BUILD_DIR (default: build-python, configured as a Release build
# without tests when it is new), and the extension (which holds Larder's code, linked statically)
# goes into the package.
import glob
import os
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(ROOT, "VERSION")) as f:
        return f.readline().strip()


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("LARDER_BUILD_DIR") or os.path.join(ROOT, "build-python")
        build_dir = os.path.abspath(build_dir)
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            subprocess.check_call(
                ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                 "-DLARDER_BUILD_TESTS=OFF"])
        jobs = os.environ.get("LARDER_BUILD_JOBS", "2")
        subprocess.check_call(
            ["cmake", "--build", build_dir, "--target", "larder_python", "-j", jobs])
        built = glob.glob(os.path.join(build_dir, "python", "larder", "_larder*.so"))
        if len(built) != 1:
            raise RuntimeError(f"expected one _larder extension in {build_dir}/python/larder")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built[0], target)


setup(
    version=version(),
    ext_modules=[Extension("larder._larder", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
