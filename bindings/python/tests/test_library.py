"""How the package finds libstoker.so and what it says when it cannot use one."""

import os
import shutil
import subprocess
import sys

import pytest

import stoker


def import_stoker(library):
    """`import stoker` in a fresh interpreter with STOKER_LIBRARY=library."""
    env = dict(os.environ, STOKER_LIBRARY=str(library))
    code = "import stoker; print(stoker.LIBRARY_PATH)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_stoker_library_overrides_every_other_copy(tmp_path):
    copy = tmp_path / "elsewhere" / "libstoker.so"
    copy.parent.mkdir()
    shutil.copyfile(stoker.LIBRARY_PATH, copy)
    result = import_stoker(copy)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(copy)


def test_missing_library_is_a_clear_import_error(tmp_path):
    result = import_stoker(tmp_path / "no_such_libstoker.so")
    assert result.returncode != 0
    assert "LibraryNotFoundError" in result.stderr
    assert "no_such_libstoker.so" in result.stderr


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler for a fake library")
def test_other_abi_version_is_refused(tmp_path):
    source = tmp_path / "fake.c"
    source.write_text("unsigned int stoker_abi_version(void) { return 2; }\n")
    library = tmp_path / "libstoker.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", library, source], check=True)
    result = import_stoker(library)
    assert result.returncode != 0
    assert "C ABI version 2, but this package needs 1" in result.stderr


def test_installed_package_uses_its_bundled_copy():
    if os.environ.get("STOKER_LIBRARY"):
        pytest.skip("STOKER_LIBRARY is set: it takes precedence over the bundled copy")
    bundled = os.path.join(os.path.dirname(stoker.__file__), "_lib", "libstoker.so")
    if not os.path.isfile(bundled):
        if os.environ.get("STOKER_TEST_INSTALLED") == "1":
            pytest.fail(f"the installed package has no bundled library at {bundled}")
        pytest.skip("running from a source tree without a bundled library")
    assert stoker.LIBRARY_PATH == bundled
