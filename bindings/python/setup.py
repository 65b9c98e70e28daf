"""Build hook: put libstoker.so inside the package, so `pip install ./bindings/python` gives a
working `import stoker` on a machine that has only cargo.

The package itself is pure Python (ctypes); only the library is native. build_py copies
$STOKER_LIBRARY when it is set at build time, and otherwise runs
`cargo build --release -p stoker-capi` in the repository this directory belongs to. The wheel
is tagged py3-none-<platform>: it works with any CPython 3 but only on the library's platform.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def repository_root() -> Path:
    for d in (HERE, *HERE.parents):
        if (d / "crates" / "stoker-capi" / "Cargo.toml").is_file():
            return d
    raise SystemExit(
        f"cannot bundle libstoker.so: set STOKER_LIBRARY to a built library, or build from "
        f"the stoker repository (no crates/stoker-capi found above {HERE})"
    )


def library_to_bundle() -> Path:
    given = os.environ.get("STOKER_LIBRARY")
    if given:
        if not Path(given).is_file():
            raise SystemExit(f"STOKER_LIBRARY={given} is not a file")
        return Path(given)
    root = repository_root()
    cargo = os.environ.get("CARGO", "cargo")
    subprocess.run([cargo, "build", "--release", "-p", "stoker-capi"], cwd=root, check=True)
    metadata = subprocess.run(
        [cargo, "metadata", "--format-version", "1", "--no-deps"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(json.loads(metadata.stdout)["target_directory"]) / "release" / "libstoker.so"


class build_py_with_library(build_py):
    def run(self):
        super().run()
        dest = Path(self.build_lib) / "stoker" / "_lib"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library_to_bundle(), dest / "libstoker.so")


class bdist_wheel_platform(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(cmdclass={"build_py": build_py_with_library, "bdist_wheel": bdist_wheel_platform})
