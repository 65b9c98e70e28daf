"""Builds the stoker wheel and sdist: the ctypes package plus two Rust artifacts.

Why setuptools-rust: the package is pure Python (ctypes) over the C library, and the wheel ships
two native files from two crates of the Cargo workspace: ``libstoker.so`` (crates/stoker-capi, a
cdylib with no Python binding) and the ``stoker`` command (crates/stoker-cli).
setuptools-rust builds both in one wheel, a ``RustExtension`` with ``Binding.NoBinding`` and a
``RustBin`` installed as a console command; maturin builds one crate with one kind of binding per
wheel, so it could ship the library or the CLI but not both. The manylinux tag comes from
``auditwheel repair`` afterwards (bindings/python/build_wheel.sh), as for any wheel built outside
a manylinux container.

What this file adds to setuptools-rust:
* the Cargo workspace is found two levels up (a repository checkout) or in ``rust/`` (an sdist,
  which carries a copy of the three crates it needs, see ``sdist_with_workspace``);
* the version is the workspace ``Cargo.toml``'s, the one place it is defined;
* the library keeps the plain name ctypes loads (``stoker/_lib/libstoker.so``: no interpreter
  imports it, so it carries no CPython ABI tag) and the wheel is tagged ``py3-none-<platform>``:
  it works with any CPython 3 on that platform;
* shipped binaries are stripped and their debug info is split into ``NAME.debug`` files (written
  to ``$STOKER_DEBUG_DIR``, default ``build/debug``) that a ``.gnu_debuglink`` and the GNU build
  ID point to, so crash reports stay symbolizable.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.sdist import sdist
from setuptools_rust import Binding, RustBin, RustExtension, Strip
from setuptools_rust.build import build_rust

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1 kept it in the wheel package
    from wheel.bdist_wheel import bdist_wheel

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
# The crates the package is built from; the sdist carries exactly these.
CRATES = ("stoker-core", "stoker-capi", "stoker-cli")
LIBRARY = "stoker._lib.libstoker"


def workspace_root() -> Path:
    """The Cargo workspace: ``rust/`` inside an unpacked sdist, else the repository checkout."""
    for root in (HERE / "rust", HERE.parent.parent):
        if (root / "Cargo.toml").is_file() and (root / "crates" / "stoker-capi").is_dir():
            return root
    raise SystemExit(
        f"stoker's Cargo workspace was not found (looked in {HERE / 'rust'} and "
        f"{HERE.parent.parent}): build from the repository or from the stoker sdist"
    )


def pep440(version: str) -> str:
    """The Cargo (SemVer) version in Python's spelling: ``0.2.0-rc.1`` -> ``0.2.0rc1``."""
    m = re.fullmatch(r"(\d+\.\d+\.\d+)(?:-(alpha|beta|rc)\.?(\d+))?", version)
    if not m:
        raise SystemExit(f"workspace version {version!r} has no PEP 440 spelling here")
    release, pre, n = m.groups()
    if pre is None:
        return release
    return release + {"alpha": "a", "beta": "b", "rc": "rc"}[pre] + n


def workspace_version(root: Path) -> str:
    with open(root / "Cargo.toml", "rb") as f:
        return tomllib.load(f)["workspace"]["package"]["version"]


def split_debug_info(path: Path, shared_library: bool) -> None:
    """Moves the debug info of ``path`` into ``$STOKER_DEBUG_DIR/<name>.debug`` and strips the
    symbol table, as distributions' ``dh_strip`` does. Without binutils (objcopy), the file is
    left as built, with a warning: it works, only larger."""
    objcopy = os.environ.get("OBJCOPY") or shutil.which("objcopy")
    if not objcopy:
        print(f"warning: objcopy not found, {path.name} is not stripped", file=sys.stderr)
        return
    debug_dir = Path(os.environ.get("STOKER_DEBUG_DIR") or HERE / "build" / "debug").resolve()
    debug_dir.mkdir(parents=True, exist_ok=True)
    debug = debug_dir / f"{path.name}.debug"
    run = lambda *args: subprocess.run([objcopy, *args], check=True)  # noqa: E731
    run("--only-keep-debug", "--compress-debug-sections=zlib", str(path), str(debug))
    # A shared library keeps the dynamic symbols it exports; a program needs none.
    run("--strip-unneeded" if shared_library else "--strip-all", str(path))
    run(f"--add-gnu-debuglink={debug}", str(path))
    print(f"split debug info: {path.name} -> {debug}", file=sys.stderr)


class build_rust_for_ctypes(build_rust):
    """setuptools-rust's build, with the library under its plain name and debug info split."""

    def get_dylib_ext_path(self, ext: RustExtension, target_fname: str) -> str:
        default = Path(super().get_dylib_ext_path(ext, target_fname))
        suffix = sysconfig.get_config_var("SHLIB_SUFFIX") or ".so"
        return str(default.with_name(target_fname.rsplit(".", 1)[-1] + suffix))

    def run_for_extension(self, ext: RustExtension) -> None:
        super().run_for_extension(ext)
        if self.inplace or self._is_debug_build(ext):
            return  # a development build keeps its debug info in place
        if isinstance(ext, RustBin):
            scripts = self.get_finalized_command("install_scripts")
            for name in ext.target.values():
                exe = name + (sysconfig.get_config_var("EXE") or "")
                split_debug_info(Path(scripts.build_dir) / exe, shared_library=False)
        else:
            split_debug_info(Path(self.get_dylib_ext_path(ext, ext.name)), shared_library=True)


class bdist_wheel_any_python(bdist_wheel):
    """``py3-none-<platform>``: the native parts are not Python extensions, so any CPython 3
    can use the wheel; only the platform matters."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform


class sdist_with_workspace(sdist):
    """Adds ``rust/``: the workspace manifest (members reduced to the crates built here), its
    lock file pruned to match (so the sdist builds with ``--locked``), the crates' sources and
    the header and licenses. The repository's layout keeps the Python package two levels below
    the workspace, and an sdist can only hold files under its own root."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        src, dest = workspace_root(), Path(base_dir) / "rust"
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir()
        manifest = (src / "Cargo.toml").read_text()
        members = ", ".join(f'"crates/{c}"' for c in CRATES)
        manifest, n = re.subn(r"(?m)^members = \[.*\]$", f"members = [{members}]", manifest)
        if n != 1:
            raise SystemExit("could not find the workspace's `members = [...]` line")
        (dest / "Cargo.toml").write_text(manifest)
        shutil.copy2(src / "Cargo.lock", dest / "Cargo.lock")
        for name in ("LICENSE-MIT", "LICENSE-APACHE", "README.md"):
            shutil.copy2(src / name, dest / name)
        shutil.copytree(src / "include", dest / "include")
        for crate in CRATES:
            crate_src, crate_dest = src / "crates" / crate, dest / "crates" / crate
            crate_dest.mkdir(parents=True)
            for f in ("Cargo.toml", "build.rs"):
                if (crate_src / f).is_file():
                    shutil.copy2(crate_src / f, crate_dest / f)
            # Sources only: tests, examples and fixtures stay in the repository. `kernels` holds
            # the PTX the library embeds (stoker-core's `gpu_normalize`).
            shutil.copytree(crate_src / "src", crate_dest / "src")
            if (crate_src / "kernels").is_dir():
                shutil.copytree(crate_src / "kernels", crate_dest / "kernels")
        # Dropping a member leaves its packages in Cargo.lock; `cargo metadata` prunes them
        # without changing any other version.
        cargo = os.environ.get("CARGO", "cargo")
        subprocess.run(
            [cargo, "metadata", "--format-version", "1", "--manifest-path", str(dest / "Cargo.toml")],
            check=True,
            stdout=subprocess.DEVNULL,
        )


ROOT = workspace_root()
setup(
    version=pep440(workspace_version(ROOT)),
    rust_extensions=[
        RustExtension(
            LIBRARY,
            path=str(ROOT / "crates" / "stoker-capi" / "Cargo.toml"),
            binding=Binding.NoBinding,
            cargo_manifest_args=["--locked"],
            strip=Strip.No,  # split_debug_info strips, keeping the debug info apart
            py_limited_api=False,
        ),
        RustBin(
            "stoker",
            path=str(ROOT / "crates" / "stoker-cli" / "Cargo.toml"),
            cargo_manifest_args=["--locked"],
            strip=Strip.No,
        ),
    ],
    cmdclass={
        "build_rust": build_rust_for_ctypes,
        "bdist_wheel": bdist_wheel_any_python,
        "sdist": sdist_with_workspace,
    },
    zip_safe=False,
)
