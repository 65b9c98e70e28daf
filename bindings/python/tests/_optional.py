"""Optional test dependencies: skipped where absent on a developer's machine, required in CI.

The test command installs torch so that every torch and DLPack test runs; there (``CI=true``,
or ``STOKER_REQUIRE_TORCH=1`` from run_tests.sh) a missing torch must fail the suite, not
quietly skip the path most Python users take.
"""

import importlib
import os

import pytest


def required() -> bool:
    return os.environ.get("CI") == "true" or os.environ.get("STOKER_REQUIRE_TORCH") == "1"


def import_torch():
    """``torch``, or a skip (a failure when ``required()``)."""
    if required():
        return importlib.import_module("torch")
    return pytest.importorskip("torch")
