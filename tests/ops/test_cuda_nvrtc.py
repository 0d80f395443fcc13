"""Every CUDA kernel source compiles with NVRTC, NVIDIA's runtime compiler (the one CuPy uses on
a device), to machine code for sm_90 (H100/H200) and sm_89 (L4), without a device.

ptxas's report is checked where it decides whether a launch can work: the rule kernels use no
static shared memory (their wrappers size the dynamic shared memory, `*_shared_bytes`, and that
must be all of it) and declare `__launch_bounds__(NT)` (so registers per thread fit a block of NT
threads); the additive float32 intra_norm keeps its registers (no spills).  Compiled sources
are cached by hash (tests/helpers/nvrtc.py): the first run compiles for a minute, later ones
read the logs.
"""

from __future__ import annotations

import pytest
from helpers.nvrtc import ARCHS, compile_cuda, nvrtc_unavailable_reason
from linstream.ops.additive import cupy_kernels as ck
from linstream.ops.decay import cupy_kernels as decay_k
from linstream.ops.decay import vector_cupy_kernels as vector_k
from linstream.ops.delta import cupy_kernels as delta_k
from linstream.ops.dplr import cupy_kernels as dplr_k
from linstream.ops.ssd import cupy_kernels as ssd_k

pytestmark = pytest.mark.skipif(
    nvrtc_unavailable_reason() is not None, reason=str(nvrtc_unavailable_reason())
)

# (input kind, compute dtype, state dtype): bfloat16 and float32 inputs with either state,
# float64 throughout
RULE_VARIANTS = [
    ("bfloat16", "float32", "float64"),
    ("float32", "float32", "float32"),
    ("float64", "float64", "float64"),
]
RULE_SOURCES = {
    "decay_chunks": decay_k.decay_source,
    "vector_gated_chunks": vector_k.vector_source,
    "delta_chunks": delta_k.delta_source,
    "dplr_chunks": dplr_k.dplr_source,
    "ssd_chunks": ssd_k.ssd_source,  # with ssd_bad_rows in the same source
}


@pytest.mark.parametrize("variant", RULE_VARIANTS, ids=lambda v: "-".join(v))
@pytest.mark.parametrize("name", sorted(RULE_SOURCES))
def test_rule_kernels_compile_for_sm90(name, variant):
    source = RULE_SOURCES[name](*variant)
    assert f"__launch_bounds__(NT)\n{name}(" in source
    res = compile_cuda(source, name, "sm_90")
    assert res.static_shared == 0, res.log
    print(f"{name} {variant}: {res.registers} registers, {res.spill_bytes} bytes spilled")


@pytest.mark.parametrize("name", sorted(RULE_SOURCES))
@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "sm_90"])
def test_rule_kernels_compile_for_other_devices(name, arch):
    res = compile_cuda(RULE_SOURCES[name](*RULE_VARIANTS[0]), name, arch)
    assert res.static_shared == 0, res.log


def test_additive_kernels_compile_for_sm90():
    preps = [(fmap, "float32", "float32") for fmap in ck.FUSED_MAPS]
    preps += [("elu+1", "bfloat16", "float32"), ("elu+1", "float64", "float64")]
    for fmap, in_dtype, real in preps:
        compile_cuda(ck.prep_source(fmap, in_dtype, real), f"prep-{fmap}-{in_dtype}-{real}")
    for real in ("float32", "float64"):
        compile_cuda(ck.scan_source(real), f"scan-{real}")
    intras = [(1, 1), (16, 5), (16, 16), (64, 64), (128, 128)]
    for c, dv, real in [(c, dv, "float32") for c, dv in intras] + [(64, 64, "float64")]:
        res = compile_cuda(ck.intra_source(c, dv, real), f"intra-{c}-{dv}-{real}")
        if real == "float32":
            assert res.spill_bytes == 0 and "0 bytes spill stores" in res.log, res.log
