#!/usr/bin/env python3
"""Compiles each kernel source beside it to the PTX embedded in libstoker: cast.cu to cast.ptx
(`gpu_normalize`, see cast.cu) and resize.cu to resize.ptx (GPU decoding's resize).

The PTX must load on every driver stoker supports, CUDA 12.0 and later: a driver compiles PTX
only of an ISA version it knows, and NVRTC writes its own release's (12.0 writes ISA 8.0, 12.8
writes 8.7, 13.x 9.x). So this script takes NVRTC 12.0, from the `nvidia-cuda-nvrtc-cu12` wheel:

    python3 -m venv /tmp/nvrtc && /tmp/nvrtc/bin/pip install nvidia-cuda-nvrtc-cu12==12.0.76
    /tmp/nvrtc/bin/python crates/stoker-core/kernels/make_ptx.py

and targets `compute_52` (Maxwell), the oldest architecture NVRTC 12.0 accepts, so the driver
can compile the PTX for every GPU that CUDA 12 runs on. The first line of each PTX records the
CRC-32 of the source it was made from, which a unit test of stoker-core compares with the source
(in `cast.rs` and `resize.rs`). `check_kernels.py` runs the sources on the CPU and assembles the
PTX for today's architectures.
"""

import ctypes
import pathlib
import sys
import zlib

HERE = pathlib.Path(__file__).resolve().parent
NVRTC_VERSION = (12, 0)
ARCH = "compute_52"
KERNELS = ["cast", "resize"]  # <name>.cu becomes <name>.ptx


def nvrtc_library() -> ctypes.CDLL:
    try:
        import nvidia.cuda_nvrtc  # the nvidia-cuda-nvrtc-cu12 wheel
    except ImportError:
        sys.exit("make_ptx.py: needs the nvidia-cuda-nvrtc-cu12==12.0.76 wheel (see the docstring)")
    lib_dir = pathlib.Path(list(nvidia.cuda_nvrtc.__path__)[0]) / "lib"
    candidates = sorted(lib_dir.glob("libnvrtc.so.12*"))
    if not candidates:
        sys.exit(f"make_ptx.py: no libnvrtc.so.12 in {lib_dir}")
    return ctypes.CDLL(str(candidates[0]))


def main() -> None:
    nvrtc = nvrtc_library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    if (major.value, minor.value) != NVRTC_VERSION:
        sys.exit(f"make_ptx.py: NVRTC {major.value}.{minor.value}, but the PTX must come from "
                 f"NVRTC {NVRTC_VERSION[0]}.{NVRTC_VERSION[1]} (see the docstring)")
    for name in KERNELS:
        compile_kernel(nvrtc, name, f"{major.value}.{minor.value}")


def compile_kernel(nvrtc: ctypes.CDLL, name: str, version: str) -> None:
    """Compiles `<name>.cu` to `<name>.ptx`, whose first line is the source's CRC-32."""
    source = (HERE / f"{name}.cu").read_bytes()
    program = ctypes.c_void_p()
    check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(program), source, f"{name}.cu".encode(),
                                          0, None, None))
    try:
        options = [f"--gpu-architecture={ARCH}".encode(), b"--std=c++14"]
        argv = (ctypes.c_char_p * len(options))(*options)
        status = nvrtc.nvrtcCompileProgram(program, len(options), argv)
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(program, log)
        if status != 0:
            sys.exit(f"make_ptx.py: {name}.cu does not compile:\n{log.value.decode()}")
        check(nvrtc, nvrtc.nvrtcGetPTXSize(program, ctypes.byref(size)))
        ptx = ctypes.create_string_buffer(size.value)
        check(nvrtc, nvrtc.nvrtcGetPTX(program, ptx))
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
    header = (f"// {name}.cu crc32 {zlib.crc32(source):08x}\n"
              f"// Made by make_ptx.py with NVRTC {version} for {ARCH}; do not edit.\n")
    (HERE / f"{name}.ptx").write_text(header + ptx.value.decode())
    print(f"wrote {HERE / f'{name}.ptx'} ({len(ptx.value)} bytes of PTX)")


def check(nvrtc: ctypes.CDLL, status: int) -> None:
    if status != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        sys.exit(f"make_ptx.py: NVRTC: {nvrtc.nvrtcGetErrorString(status).decode()}")


if __name__ == "__main__":
    main()
