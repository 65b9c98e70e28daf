"""One version on every face: the workspace Cargo.toml's, in the library, the package metadata
and the installed ``stoker`` command."""

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import stoker

REPO = Path(__file__).resolve().parents[3]
# run_tests.sh sets this: the suite then runs against an installed wheel, whose metadata and
# console command must be there.
INSTALLED = os.environ.get("STOKER_TEST_INSTALLED") == "1"


def workspace_version() -> str:
    text = (REPO / "Cargo.toml").read_text()
    table = text.split("[workspace.package]", 1)[1]
    return re.search(r'^version = "([^"]+)"', table, re.M).group(1)


def pep440(version: str) -> str:
    """Python's spelling of a SemVer version: ``0.2.0-rc.1`` -> ``0.2.0rc1``."""
    release, pre, n = re.fullmatch(r"(\d+\.\d+\.\d+)(?:-(alpha|beta|rc)\.?(\d+))?", version).groups()
    return release if pre is None else release + {"alpha": "a", "beta": "b", "rc": "rc"}[pre] + n


def test_version_is_the_workspace_version():
    assert stoker.__version__ == workspace_version()
    assert stoker.__version__ == stoker._lib.stoker_version().decode()


def test_package_metadata_has_the_workspace_version():
    try:
        metadata_version = importlib.metadata.version("stoker")
    except importlib.metadata.PackageNotFoundError:
        if INSTALLED:
            raise
        pytest.skip("the stoker package is not installed (run from a source tree)")
    assert metadata_version == pep440(workspace_version())


def test_installed_command_has_the_workspace_version():
    command = Path(sys.executable).parent / "stoker"
    if not command.exists():
        if INSTALLED:
            pytest.fail(f"the wheel did not install the stoker command as {command}")
        pytest.skip("the stoker command is not installed next to this interpreter")
    out = subprocess.run([command, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"stoker {workspace_version()}"


def test_suite_runs_against_the_installed_package():
    if not INSTALLED:
        pytest.skip("STOKER_TEST_INSTALLED is not set")
    package = Path(stoker.__file__).resolve().parent
    assert Path(sys.prefix).resolve() in package.parents, package
    assert (package / "py.typed").is_file()
