#!/usr/bin/env python3
"""Checks stoker's kernels (the cast kernels, cast.cu, and the resize kernel, resize.cu) without a
GPU, in two ways:

1. Each source compiled as host C++ (`emulate_cast.cpp`, `emulate_resize.cpp`, with
   AddressSanitizer and UBSan) runs its kernels thread by thread over several grids, and every
   output element is checked against the kernel's contract: the source does what the library
   relies on.
2. cast.ptx and resize.ptx, the PTX the library embeds, are assembled for today's GPU
   architectures with nvJitLink, as a driver does when it loads them: valid PTX, of an ISA
   version the toolchain accepts, defining the entry points the library launches.

nvJitLink comes with torch's CUDA wheels (`nvidia-nvjitlink`, or the `nvidia/cu13` tree); the
path of `libnvJitLink.so.*` may also be given as the first argument; `CXX` names the compiler.
Exits 0 when both pass for every kernel, 1 with the failures otherwise, 2 when no nvJitLink is
found.
"""

import ctypes
import os
import pathlib
import subprocess
import sys
import sysconfig
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ARCHS = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90"]
# Each kernel source (<name>.cu, run by emulate_<name>.cpp, compiled to <name>.ptx) and the entry
# points the library launches from it.
KERNELS = {
    "cast": ["stoker_cast_u8_b32", "stoker_cast_u8_b16"],
    "resize": ["stoker_resize_u8"],
}
NVJITLINK_INPUT_PTX = 2


def find_nvjitlink() -> pathlib.Path | None:
    if len(sys.argv) > 1:
        return pathlib.Path(sys.argv[1])
    site = pathlib.Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    found = sorted(site.glob("**/libnvJitLink.so.*"))
    return found[-1] if found else None


def assemble(lib: ctypes.CDLL, ptx: bytes, name: str, arch: str) -> str | None:
    """None when `ptx` (`<name>.ptx`) assembles for `arch`, else nvJitLink's log."""
    handle = ctypes.c_void_p()
    options = (ctypes.c_char_p * 1)(f"-arch={arch}".encode())
    if lib.nvJitLinkCreate(ctypes.byref(handle), 1, options) != 0:
        return f"nvJitLinkCreate refused -arch={arch}"
    try:
        status = lib.nvJitLinkAddData(handle, NVJITLINK_INPUT_PTX, ptx, len(ptx),
                                       f"{name}.ptx".encode())
        if status == 0:
            status = lib.nvJitLinkComplete(handle)
        if status == 0:
            return None
        size = ctypes.c_size_t()
        lib.nvJitLinkGetErrorLogSize(handle, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value + 1)
        lib.nvJitLinkGetErrorLog(handle, log)
        return f"status {status}: {log.value.decode(errors='replace')}"
    finally:
        lib.nvJitLinkDestroy(ctypes.byref(handle))


def emulate(name: str) -> bool:
    """Builds and runs emulate_<name>.cpp; True when every element is as promised."""
    with tempfile.TemporaryDirectory() as tmp:
        exe = pathlib.Path(tmp) / f"emulate_{name}"
        compiler = os.environ.get("CXX", "c++")
        build = [compiler, "-std=c++14", "-O1", "-Wall", "-Wextra", "-Werror",
                 "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                 "-o", str(exe), str(HERE / f"emulate_{name}.cpp")]
        built = subprocess.run(build, capture_output=True, text=True)
        if built.returncode != 0:
            print(f"check_kernels.py: {' '.join(build)} failed:\n{built.stderr}", file=sys.stderr)
            return False
        ran = subprocess.run([str(exe)], capture_output=True, text=True)
        print(ran.stdout.strip() + ran.stderr.strip())
        return ran.returncode == 0


def main() -> int:
    emulated = [emulate(name) for name in KERNELS]
    if not all(emulated):
        return 1
    path = find_nvjitlink()
    if path is None:
        print("check_kernels.py: no libnvJitLink found (install torch's CUDA wheels)", file=sys.stderr)
        return 2
    lib = ctypes.CDLL(str(path))
    failed = False
    for name, entry_points in KERNELS.items():
        ptx = (HERE / f"{name}.ptx").read_bytes()
        text = ptx.decode()
        missing = [e for e in entry_points if f".entry {e}(" not in text]
        if missing:
            print(f"check_kernels.py: {name}.ptx lacks the entry points {missing}", file=sys.stderr)
            failed = True
            continue
        for arch in ARCHS:
            error = assemble(lib, ptx + b"\0", name, arch)
            print(f"{name}.ptx for {arch}: {'ok' if error is None else error}")
            failed |= error is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
