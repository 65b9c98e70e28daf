"""The package's ctypes declarations (`stoker._ffi`) and error codes (`stoker.errors`) are the C
header's, read from `include/stoker.h` itself: every struct's fields in order with their sizes,
every enum value the package names, and the parameter count of every function it calls. A field
appended to `stoker_stats` in the core without its ctypes twin fails here, not in a user's
process as garbage statistics."""

import ctypes
import re
from pathlib import Path

import pytest

from stoker import _ffi, errors

HEADER = Path(__file__).resolve().parents[3] / "include" / "stoker.h"

# C type -> size in bytes, for the types the header uses in structs.
C_SIZES = {
    "uint8_t": 1,
    "uint16_t": 2,
    "int32_t": 4,
    "uint32_t": 4,
    "int64_t": 8,
    "uint64_t": 8,
    "double": 8,
    "size_t": ctypes.sizeof(ctypes.c_size_t),
}
POINTER = ctypes.sizeof(ctypes.c_void_p)
ENUM = ctypes.sizeof(ctypes.c_int)

# ctypes class -> the header struct it declares.
STRUCTS = {
    _ffi.Stats: "stoker_stats",
    _ffi.Tensor: "stoker_tensor",
    _ffi.LaunchInfo: "stoker_launch",
    _ffi.StreamInfo: "stoker_stream_info",
    _ffi.SourceCallbacks: "stoker_source_callbacks",
    _ffi.IterableCallbacks: "stoker_iterable_callbacks",
    _ffi.DLPackVersion: "DLPackVersion",
    _ffi.DLDevice: "DLDevice",
    _ffi.DLDataType: "DLDataType",
    _ffi.DLTensor: "DLTensor",
    _ffi.DLManagedTensorVersioned: "DLManagedTensorVersioned",
}


def without_comments(text):
    return re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)


@pytest.fixture(scope="module")
def header():
    if not HEADER.is_file():
        pytest.fail(f"{HEADER} is missing: the schema tests read the repository's header")
    return without_comments(HEADER.read_text())


def struct_fields(header, name):
    """[(field name, size in bytes)] of `typedef struct NAME { ... } NAME;`."""
    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), header, re.S)
    assert body, f"no struct {name} in {HEADER}"
    sizes = {f"struct {n}": ctypes.sizeof(cls) for cls, n in STRUCTS.items()}
    fields = []
    for decl in filter(None, (d.strip() for d in body.group(1).split(";"))):
        decl = " ".join(decl.split())
        if fn := re.fullmatch(r".*\(\*(\w+)\)\(.*\)", decl):  # a function pointer
            fields.append((fn.group(1), POINTER))
            continue
        m = re.fullmatch(r"(.+?)\s*(\*?)\s*(\w+)(?:\[(\w+)\])?", decl)
        assert m, f"{name}: cannot read the declaration `{decl}`"
        ctype, star, field, count = m.groups()
        ctype = ctype.replace("const ", "")
        if star or ctype.endswith("*"):
            size = POINTER
        elif ctype.startswith("enum "):
            size = ENUM
        else:
            size = C_SIZES.get(ctype) or sizes.get(ctype)
            assert size, f"{name}.{field}: unknown C type `{ctype}`"
        if count:
            size *= _ffi.MAX_DIMS if count == "STOKER_MAX_DIMS" else int(count)
        fields.append((field, size))
    return fields


def enum_values(header, name):
    """{constant: value} of `typedef enum NAME { ... } NAME;`."""
    body = re.search(r"typedef enum %s \{(.*?)\} %s;" % (name, name), header, re.S)
    assert body, f"no enum {name} in {HEADER}"
    values, next_value = {}, 0
    for item in filter(None, (i.strip() for i in body.group(1).split(","))):
        constant, _, value = (part.strip() for part in item.partition("="))
        next_value = int(value) if value else next_value
        values[constant] = next_value
        next_value += 1
    return values


@pytest.mark.parametrize("cls", list(STRUCTS), ids=lambda cls: STRUCTS[cls])
def test_every_struct_has_the_header_fields_in_order(header, cls):
    declared = [(name, ctypes.sizeof(ctype)) for name, ctype, *_ in cls._fields_]
    assert declared == struct_fields(header, STRUCTS[cls])


def test_the_stats_dataclass_has_every_stats_field_in_order(header):
    """`stoker.Stats` is filled by name from the ctypes struct: a field the header gains must
    appear in it too (else `Loader.stats()` would drop it silently)."""
    import dataclasses

    import stoker

    names = [f.name for f in dataclasses.fields(stoker.Stats)]
    c = [name for name, _ in struct_fields(header, "stoker_stats")]
    assert names == c[1:] + ["worker_busy_ns"], "stoker.Stats against stoker_stats (less `size`)"


def test_error_classes_carry_the_header_status_codes(header):
    codes = enum_values(header, "stoker_status")
    assert (codes["STOKER_OK"], codes["STOKER_END_OF_EPOCH"]) == (_ffi.OK, _ffi.END_OF_EPOCH)
    failures = {value for value in codes.values() if value < 0}
    assert set(errors._BY_STATUS) == failures, "an error status without its Python class"
    for status, cls in errors._BY_STATUS.items():
        # STOKER_ERR_IO -> StokerIOError, STOKER_ERR_OUT_OF_MEMORY -> OutOfMemoryError, ...
        constant = next(c for c, v in codes.items() if v == status)
        words = constant.removeprefix("STOKER_ERR_").replace("_", "").lower()
        assert words in cls.__name__.lower(), (constant, cls.__name__)


def test_dtype_and_launcher_codes_are_the_header_values(header):
    dtypes = enum_values(header, "stoker_dtype")
    for name, value in dtypes.items():
        assert getattr(_ffi, name.removeprefix("STOKER_")) == value, name
    assert len(_ffi.DTYPE_NAMES) == len(dtypes)
    launchers = enum_values(header, "stoker_launcher")
    assert {v: c.removeprefix("STOKER_LAUNCHER_").lower() for c, v in launchers.items()} == _ffi.LAUNCHERS


def test_every_function_the_package_calls_has_the_header_parameter_count(header):
    for name, (_, params) in _ffi._SIGNATURES.items():
        proto = re.search(r"\b%s\((.*?)\);" % name, header, re.S)
        assert proto, f"{name} is not in the header"
        args = proto.group(1).strip()
        count = 0 if args in ("", "void") else len(args.split(","))
        assert count == len(params), f"{name}: the header has {count} parameters"


def test_the_library_is_the_header_abi_version(header):
    version = re.search(r"#define STOKER_ABI_VERSION (\d+)", header)
    assert version and int(version.group(1)) == _ffi.ABI_VERSION
    assert _ffi.lib.stoker_abi_version() == _ffi.ABI_VERSION


def documented_options():
    """(key, example) of every row of the header's option table (the core's key table)."""
    rows = re.findall(r"^ \* \| `(\w+)` \|.*?\| `((?:[^`\\]|\\.)*)` \| [^|]", HEADER.read_text(), re.M)
    return [(key, example.replace("\\|", "|")) for key, example in rows]


def test_every_documented_option_reaches_the_library_as_a_keyword(npy_data, tmp_path, monkeypatch):
    """`stoker.Loader(**options)` passes every key of the table through to the library: each
    key with its documented example either makes a loader holding that value, or fails for a
    reason of its own (no CUDA device, a resume state of another job), never as an unknown key."""
    import stoker

    monkeypatch.chdir(tmp_path)  # the examples of `trace` and `cache_dir` are relative paths
    data_path, _, _, _ = npy_data
    options = documented_options()
    assert len(options) >= 39 and ("batch_size", "64") in options, options[:3]
    outcomes = {}
    for key, example in options:
        if key == "source":  # the positional argument
            continue
        try:
            with stoker.Loader(f"npy:{data_path}", **{key: example}) as loader:
                assert loader.options[key] == example
            outcomes[key] = "made"
        except stoker.StokerError as e:
            assert "unknown option" not in str(e), (key, str(e))
            outcomes[key] = type(e).__name__
    # Most keys make a loader over an npy array; the rest are refused for what they are.
    assert sum(o == "made" for o in outcomes.values()) >= 25, outcomes
