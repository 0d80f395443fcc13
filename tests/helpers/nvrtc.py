"""NVRTC, NVIDIA's runtime compiler, loaded without a device: the CUDA sources compiled to sm_90
(H100/H200) and sm_89 (L4) machine code here, as CuPy compiles them on a device.

CuPy finds libnvrtc through cuda-pathfinder, which searches the running interpreter's own
site-packages; a virtual environment that reaches its packages through a .pth file (the
worktrees' .venv) is not searched there, so the library is loaded here from the first
`nvidia/*/lib/libnvrtc.so.*` on sys.path before CuPy asks for it (CuPy then finds it loaded).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import os
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["ARCHS", "CompileResult", "compile_cuda", "nvrtc_unavailable_reason"]

ARCHS = ("sm_90", "sm_89")  # H100/H200, L4


@functools.cache
def _nvrtc() -> Any:
    from cupy_backends.cuda.libs import nvrtc

    try:
        nvrtc.getVersion()
    except Exception:
        for entry in sys.path:
            found = sorted(glob.glob(os.path.join(entry, "nvidia", "*", "lib", "libnvrtc.so.*")))
            found = [f for f in found if re.search(r"libnvrtc\.so\.\d+$", f)]
            if found:
                ctypes.CDLL(found[-1], mode=os.RTLD_GLOBAL)  # the newest: cu13 sorts after cu12
                break
        nvrtc.getVersion()
    return nvrtc


@functools.cache
def nvrtc_unavailable_reason() -> str | None:
    """None when NVRTC compiles here, else why not (for a skip)."""
    try:
        _nvrtc()
    except Exception as ex:  # library absent: this check needs nvidia-cuda-nvrtc
        return f"NVRTC is not loadable here ({type(ex).__name__}: {ex})"
    return None


class CompileResult:
    """What ptxas said about one kernel: registers, spills, static shared memory."""

    def __init__(self, name: str, arch: str, log: str) -> None:
        self.name, self.arch, self.log = name, arch, log
        regs = re.findall(r"Used (\d+) registers", log)
        self.registers = max((int(r) for r in regs), default=0)
        spills = re.findall(r"(\d+) bytes spill stores", log)
        self.spill_bytes = sum(int(s) for s in spills)
        smem = re.findall(r"(\d+) bytes smem", log)
        self.static_shared = max((int(s) for s in smem), default=0)


def compile_cuda(source: str, name: str, arch: str = "sm_90") -> CompileResult:
    """Compile `source` for `arch` (machine code, so that ptxas reports); AssertionError with
    NVRTC's log when it does not compile.  A source that compiled before (same text, options
    and NVRTC version) is not compiled again: its log is kept in `$LINSTREAM_NVRTC_CACHE`
    (default `~/.cache/linstream/nvrtc/`; a few seconds per source otherwise)."""
    nvrtc = _nvrtc()
    options = [f"-arch={arch}", "--ptxas-options=-v"]
    version = ".".join(str(x) for x in nvrtc.getVersion())
    key = hashlib.sha256("\0".join([source, *options, version]).encode()).hexdigest()[:24]
    default = Path.home() / ".cache" / "linstream" / "nvrtc"
    cached = Path(os.environ.get("LINSTREAM_NVRTC_CACHE", default)) / f"{key}.log"
    if cached.exists():
        return CompileResult(name, arch, cached.read_text())
    prog = nvrtc.createProgram(source, f"{name}.cu", [], [])
    try:
        nvrtc.compileProgram(prog, options)
    except Exception as ex:
        log = nvrtc.getProgramLog(prog)
        raise AssertionError(f"{name} ({arch}) failed to compile:\n{log}") from ex
    log = str(nvrtc.getProgramLog(prog))
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(log)
    os.replace(tmp, cached)
    return CompileResult(name, arch, log)
