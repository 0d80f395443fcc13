"""The bfloat16 compute mode and the mapped weights, as a user meets them: `load_model(folder,
compute_dtype="bfloat16")` on a bfloat16 checkpoint, its outputs, its memory, its fingerprint.

The bfloat16 mode has two engines (`linstream.ops.model.fla.bf16`); both are tested on this
machine whatever its CPU (LINSTREAM_BF16_PRODUCTS forces one):

- "mkl" (the CPU's bfloat16 instructions where it has them; MKL widens itself where not, which
  is slow but the same arithmetic): every product's input rounded to bfloat16, float32
  accumulation.  Oracle: fla's own forward in float64 with the input of every matrix product
  rounded to bfloat16 (`run_fla(..., linear_inputs=torch.bfloat16)`), R.  Against fla's plain
  float64 forward F, the rounding alone moves the hidden states by rms(R − F); linstream's error
  rms(L − F) must be that error within a factor [0.75, 1.25].  Derivation: L and R round the same
  inputs the same way and differ only by float32 arithmetic (e32 ≪ the rounding's effect) and
  by the few inputs that float32 noise moves across a bfloat16 rounding boundary (each moves by
  one bfloat16 ulp, the size of a rounding error itself), so rms(L − R) is a small fraction of
  rms(R − F) and adds in quadrature (measured here: rms(L − F) / rms(R − F) in 0.997-1.005 over
  13 configs × 7 seeds, rms(L − R) / rms(R − F) ≤ 0.15).  The lower bound fails when the inputs
  are not rounded (the widening engine's error is float32's, ~1e-6 of the rounding's); the
  upper when more is rounded (outputs too) or the weights or the arithmetic are wrong.
- "widen" (CPUs without the instructions): the float32 mode's products on the same bfloat16
  weights, so its outputs and states must be the float32 mode's, bit for bit, where that mode
  keeps its weights unpacked (LINSTREAM_F32_PRODUCTS=mkl-mapped, or NumPy's BLAS: a packed
  float32 product may block its sum otherwise).

Memory and files: a bfloat16 folder in the bfloat16 mode (and a float32 folder in the float32
mode), with an engine that does not pack, keeps the products' weights and the embedding as
mapped pages of the file (the load report says how much, a second process's high-water mark
shows no copy); packed, the products' weights take their bytes of anonymous memory and no more,
and the embedding stays mapped; the fingerprint is the same in
every mode and from a URL, and it is the SHA-256 of the bytes the safetensors library reads.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers.fla_folders import TINY_CONFIGS, write_folder
from helpers.mkl_engines import can_pack, intel_cpu, mapping_engine
from helpers.streaming import stream_hidden_states
from linstream.ops.model.fla import ModelFolderError, load_model
from linstream.ops.model.fla.f32 import F32_ENV

pytestmark = pytest.mark.e2e  # subprocesses and fla's models: `make check` leaves it out

SEED = 20261204
T = 100
ENV = "LINSTREAM_BF16_PRODUCTS"


def rms(a, b) -> float:
    d = np.concatenate([(np.asarray(x, np.float64) - y).ravel() for x, y in zip(a, b, strict=True)])
    return float(np.sqrt(np.mean(d * d)))


# -- the arithmetic ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fla_bf16_zoo(tmp_path_factory):
    torch = pytest.importorskip("torch")
    pytest.importorskip("fla", reason="flash-linear-attention is a test extra")
    from helpers.fla_oracle import build_and_save, run_fla, tiny_configs

    root = tmp_path_factory.mktemp("fla_bf16")
    ids = np.random.default_rng(SEED).integers(0, 128, T)
    print(f"token seed={SEED}")
    cache: dict = {}

    def get(name):
        if name not in cache:
            folder = build_and_save(name, tiny_configs()[name], root, dtype=torch.bfloat16)
            plain = run_fla(folder, ids, torch.float64)
            rounded = run_fla(folder, ids, torch.float64, linear_inputs=torch.bfloat16)
            cache[name] = (folder, ids, plain, rounded)
        return cache[name]

    return get


try:  # fla's tiny models by name (without torch and fla: none, the fixture skips)
    from helpers.fla_oracle import tiny_configs

    FLA_MODELS = list(tiny_configs())
except ImportError:
    FLA_MODELS = []


@pytest.mark.parametrize("name", FLA_MODELS)
def test_bfloat16_products_are_fla_with_each_product_input_rounded(fla_bf16_zoo, name, monkeypatch):
    folder, ids, plain, rounded = fla_bf16_zoo(name)
    monkeypatch.setenv(ENV, "mkl")
    model = load_model(folder, compute_dtype="bfloat16")
    assert model.load_report.products.startswith("bfloat16 products by MKL")
    hs, _ = stream_hidden_states(model, ids, [0, 37, 38, T])
    assert all(h.dtype == np.float32 for h in hs)
    own, err = rms(rounded, plain), rms(hs, plain)
    scale = rms(plain, [np.zeros_like(p) for p in plain])
    print(
        f"{name}: bfloat16 mode's rms error against fla float64 {err:.3g} ({err / scale:.2%} of "
        f"the hidden states' rms); fla's own with its product inputs rounded {own:.3g}; "
        f"linstream against that oracle {rms(hs, rounded):.3g}"
    )
    assert 0.75 * own <= err <= 1.25 * own


@pytest.mark.parametrize("family", list(TINY_CONFIGS))
def test_widened_bfloat16_is_the_float32_mode_bit_for_bit(tmp_path, family, monkeypatch):
    """300 tokens: a chunk of two row ranges (the products' ranges), split as a stream."""
    folder = write_folder(tmp_path / family, TINY_CONFIGS[family], dtype="BF16", seed=5)
    ids = np.random.default_rng(SEED).integers(0, 50, 400)
    monkeypatch.setenv(F32_ENV, mapping_engine("float32"))  # float32 products unpacked
    f32 = load_model(folder)
    monkeypatch.setenv(ENV, "widen")
    b16 = load_model(folder, compute_dtype="bfloat16")
    assert b16.compute_mode == "bfloat16" and b16.compute_dtype == np.float32
    bounds = [0, 1, 300, 400]
    want, want_st = stream_hidden_states(f32, ids, bounds)
    got, got_st = stream_hidden_states(b16, ids, bounds)
    for a, b in zip(want, got, strict=True):
        assert np.array_equal(a, b)
    for a, b in zip(want_st, got_st, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    monkeypatch.setenv(ENV, "mkl")  # and the rounding engine really differs
    mkl, _ = stream_hidden_states(load_model(folder, compute_dtype="bfloat16"), ids, bounds)
    assert not np.array_equal(mkl[-1], want[-1])


@pytest.mark.parametrize("engine", ["avx512bf16", "mkl", "mkl-mapped"])
def test_bfloat16_products_do_not_depend_on_the_thread_count(tmp_path, monkeypatch, engine):
    """The bfloat16 products run in the runtime's ranges, MKL at one thread: the same bits
    on 1, 2 or 3 threads (a 100-token chunk: its products' columns in ranges, or a fused
    group's parts each whole; then a 4,400-token chunk: four row ranges), with the weights
    packed (the AVX512-BF16 kernel, Intel's MKL package) or mapped."""
    from linstream.ops.model import blas
    from linstream.ops.model.fla import avx512

    why = avx512.reason_unavailable() if engine == "avx512bf16" else None
    if why is not None:
        pytest.skip(f"the AVX512-BF16 kernel: {why}")

    cfg = {**TINY_CONFIGS["gla"], "hidden_size": 384, "num_heads": 2}  # 384: two column ranges
    folder = write_folder(tmp_path / "m", cfg, dtype="BF16")
    monkeypatch.setenv(ENV, engine)
    model = load_model(folder, compute_dtype="bfloat16")
    ids = np.random.default_rng(3).integers(0, 50, 4500)
    runs = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(blas._single_threaded_blas, "_threads", threads)
        short, st = model.embed_chunk(ids[:100], None)
        emb, st = model.embed_chunk(ids[100:], st)
        runs.append((np.concatenate([short, emb]), st))
    for emb, st in runs[1:]:
        assert np.array_equal(emb, runs[0][0])
        assert all(
            np.array_equal(a[k], b[k]) for a, b in zip(st, runs[0][1], strict=True) for k in a
        )


# -- memory ----------------------------------------------------------------------------------
_MEMORY_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import ml_dtypes
    import numpy as np
    for setting in sys.argv[3:]:  # VARIABLE=engine
        name, _, value = setting.partition("=")
        os.environ[name] = value
    from linstream.ops.model.fla import load_model, mkl
    import linstream.ops.model.fla.gla  # the modules a load imports (Numba: ~100 MiB) first

    try:  # MKL's library (Intel's package or PyTorch's), loaded before the measure (not weights)
        mkl.library()
        w = np.ones((64, 64), ml_dtypes.bfloat16)  # and the code its products and packing load
        mkl.bf16_rows(w, w, np.empty((64, 64), np.float32))
        if mkl.can_pack():
            mkl.Packed(w, [slice(0, 64)]).rows(w, 0, np.empty((64, 64), np.float32))
        w = np.ones((64, 64), np.float32)
        if mkl.can_pack(np.float32):
            mkl.Packed(w, [slice(0, 64)]).rows(w, 0, np.empty((64, 64), np.float32))
    except mkl.MKLUnavailable:
        pass
    from linstream.ops.model.fla import avx512
    for kind in ("bfloat16", "float32"):  # LLVM's library, which tells the CPU's features
        avx512.reason_unavailable(kind)

    def status(key):  # /proc/self/status's line, in bytes
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    before = {k: status(k) for k in ("VmHWM", "RssAnon", "RssFile")}
    model = load_model(sys.argv[1], compute_dtype=sys.argv[2])
    r = model.load_report
    grew = {k: status(k) - v for k, v in before.items()}
    print(json.dumps({**grew, "held": r.held_bytes,
                      "mapped": r.mapped_bytes, "transient": r.transient_bytes,
                      "disk": r.disk_bytes, "line": str(r)}))
    """
)


def _memory_of_a_load(tmp_path: Path, stored: str, mode: str, engine: str = "") -> dict:
    """A 45M-parameter GLA folder (12 layers, hidden 512, vocabulary 8,000) loaded in a fresh
    process: how its memory grew, and the load's report; engine: "VARIABLE=engine" (the
    bfloat16 or the float32 products' variable), or none."""
    cfg = {"model_type": "gla", "hidden_size": 512, "num_hidden_layers": 12, "num_heads": 4,
           "vocab_size": 8000, "use_short_conv": True}  # fmt: skip
    folder = write_folder(tmp_path / "m", cfg, dtype=stored, shards=2)
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_SCRIPT, str(folder), mode, *([engine] if engine else [])],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(r["line"], "| grew by", {k: r[k] for k in ("VmHWM", "RssAnon", "RssFile")})
    return r


_VARIABLE = {"bfloat16": ENV, "float32": F32_ENV}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/self/status")
@pytest.mark.parametrize(("stored", "mode"), [("BF16", "bfloat16"), ("F32", "float32")])
def test_weights_stored_as_held_are_mapped_not_copied(tmp_path, stored, mode):
    """A 45M-parameter folder loaded in a fresh process (its modules imported first) in the mode
    that holds its stored dtype, with an engine that does not pack
    (`helpers.mkl_engines.mapping_engine`): the products' weights and the embedding stay the file's
    mapped pages (the load converts nothing), so the process's anonymous memory (what a copy would
    take; the file's pages are shared and can be dropped and re-read) grows by less than half a
    layer, its file-backed memory by the weights it touched (all of them: hashed and checked as
    read), and its high-water mark by the held weights and less than half a layer more (no moment
    holds a second copy). Bound: the smallest copy a wrong load could make is one layer's products
    ((held − embedding) / 12 layers: 6.5 MiB in bfloat16, 13 in float32) or the embedding (7.8 /
    15.6 MiB), so a slack of half a layer catches any copy and leaves room for what the load
    allocates besides (the small tensors as float32 arrays, Python objects: measured here ~1.2 MB in
    both modes). The peak is within 1.1x the weights as held."""
    r = _memory_of_a_load(tmp_path, stored, mode, f"{_VARIABLE[mode]}={mapping_engine(mode)}")
    # the small tensors (norms, biases, short convs: 0.3% of the bytes) are new float32 arrays
    assert r["held"] <= r["disk"] * 1.01 and r["held"] - r["mapped"] < r["held"] // 100
    assert r["transient"] == 0
    half_layer = (r["held"] - 8000 * 512 * (4 if mode == "float32" else 2)) // 12 // 2
    assert r["RssAnon"] <= half_layer, (half_layer, r)
    assert r["mapped"] * 0.99 <= r["RssFile"] <= r["held"] + half_layer, (half_layer, r)
    assert r["VmHWM"] <= r["held"] + half_layer, (half_layer, r)
    assert r["VmHWM"] <= 1.1 * r["held"]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/self/status")
@pytest.mark.parametrize(
    ("stored", "mode", "engine"),
    [("BF16", "bfloat16", "avx512bf16"), ("BF16", "bfloat16", "mkl"), ("F32", "float32", "mkl")],
)
def test_packed_weights_take_their_bytes_and_release_the_mapping(tmp_path, stored, mode, engine):
    """The same folder in the mode that holds its stored dtype, its weights packed (bfloat16:
    by the AVX512-BF16 kernel, or MKL from Intel's package; float32: MKL, either library): the
    products' weights are the packed copies, which take the weights' bytes of anonymous memory
    and no more (MKL asks for buffers of 1.6-8x the weight, untouched beyond it: a buffer taken
    whole would show as 0.6x the products' bytes or more; the huge pages asked for lie within
    the bytes MKL writes; the kernel's panels pad each column range to 48 columns), the
    embedding alone stays mapped, the
    file's pages of a layer's products are let go once it is packed (the file-backed memory
    grows by the embedding and less than a layer more), and the peak holds one layer's mapped
    pages beside the packed weights at most, as the load reports (here 1.12x the weights as
    held: a layer is 1/12 of them; the benchmark's 1.3B model has 24).

    MKL's packing is measured on Intel CPUs only, where the runtime picks it: on a Zen 4 EPYC
    MKL wrote 1.75x (float32) and 3.2x (bfloat16) the weights' bytes into its buffers, and
    the runtime's default there is NumPy's BLAS (float32) and the kernel (bfloat16)."""
    if engine == "avx512bf16":
        from linstream.ops.model.fla import avx512

        if avx512.reason_unavailable() is not None:
            pytest.skip(f"the AVX512-BF16 kernel: {avx512.reason_unavailable()}")
    elif not can_pack(mode):
        pytest.skip(f"MKL cannot pack {mode} weights here (Intel's mkl package is not installed)")
    elif not intel_cpu():
        pytest.skip("MKL packs its weights in their own bytes on Intel CPUs; this one is not")
    r = _memory_of_a_load(tmp_path, stored, mode, f"{_VARIABLE[mode]}={engine}")
    embed = 8000 * 512 * (2 if mode == "bfloat16" else 4)
    small = r["held"] - r["disk"]  # none: the small tensors are float32 copies of bfloat16 ones
    products = r["held"] - embed
    layer = products // 12
    assert "packed once at load" in r["line"]
    assert r["mapped"] == embed
    assert abs(small) < r["held"] // 100
    assert 0 < r["transient"] <= layer * 1.01  # one layer's packed weights beside its tensors
    assert 0.98 * products <= r["RssAnon"] <= products + layer, (layer, r)
    assert r["RssFile"] <= embed + layer, (layer, r)
    # the peak: what the load leaves (the packed weights, the mapped embedding, MKL's and
    # Python's own ~3.5 MiB) and one layer's mapped pages beside it, within 1 MiB
    end = r["RssAnon"] + r["RssFile"]
    assert r["VmHWM"] <= end + r["transient"] + (1 << 20), (layer, r)


@pytest.mark.parametrize("packed", [False, True])
def test_the_bfloat16_mode_holds_half_the_float32_modes_bytes(tmp_path, monkeypatch, packed):
    """Mapped or packed (Intel's MKL package), the bfloat16 mode holds half the bytes of the
    float32 mode on the weights as loaded (a packing kernel's panels add their padding)."""
    if packed and not can_pack():
        pytest.skip("MKL cannot pack bfloat16 weights here (Intel's mkl package is not installed)")
    folder = write_folder(tmp_path / "m", TINY_CONFIGS["delta_net"], dtype="BF16")
    monkeypatch.setenv(ENV, "mkl" if packed else mapping_engine())
    monkeypatch.setenv(F32_ENV, mapping_engine("float32"))
    f32, b16 = load_model(folder), load_model(folder, compute_dtype="bfloat16")
    assert ("packed once at load" in b16.load_report.products) == packed
    small = sum(  # the small tensors (norms, biases, convolutions; not packed bytes)
        a.nbytes
        for a in f32.held_arrays()
        if a.dtype.kind == "f" and (a.ndim < 2 or a.shape[-1] < 8)
    )
    assert b16.load_report.held_bytes == (f32.load_report.held_bytes - small) // 2 + small
    assert f32.load_report.mapped_bytes == 0  # widened at load: held, not mapped
    embed = b16._embed.nbytes
    mapped = embed if packed else b16.load_report.held_bytes - small
    assert b16.load_report.mapped_bytes == mapped


# -- the fingerprint and where the folder lies -----------------------------------------------
def test_the_fingerprint_hashes_the_stored_bytes_in_every_mode_and_from_a_url(tmp_path):
    """The fingerprint is sha256 over the architecture and each used tensor's name, stored
    dtype, shape and stored bytes (as the safetensors library reads them, here through torch),
    whatever the mode and wherever the folder lies; a URL's folder is read, not mapped, and
    gives the same outputs."""
    import fsspec

    torch = pytest.importorskip("torch")
    from linstream.ops.model.fla.config import parse_config
    from linstream.ops.model.fla.folder import expected_tensors
    from safetensors import safe_open

    cfg = TINY_CONFIGS["gated_deltanet"]
    folder = write_folder(tmp_path / "m", cfg, dtype="BF16", shards=2)
    h = hashlib.sha256(b"linstream-fla-fingerprint-v1")
    config = parse_config(cfg, source="<test>")
    h.update(json.dumps(config.describe(), sort_keys=True, separators=(",", ":")).encode())
    tensors = {}
    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            tensors.update({k: st.get_tensor(k) for k in st.keys()})  # noqa: SIM118
    for name in sorted(n.removeprefix("model.") for n in expected_tensors(config, "model.")):
        t = tensors[f"model.{name}"]
        raw = t.view(torch.int16).numpy().tobytes()
        h.update(f"\n{name}:BF16:{list(t.shape)}:{hashlib.sha256(raw).hexdigest()}".encode())
    want = h.hexdigest()
    models = {m: load_model(folder, compute_dtype=m) for m in ("float32", "float64", "bfloat16")}
    assert {m.fingerprint for m in models.values()} == {want}
    fs = fsspec.filesystem("memory")
    for f in folder.iterdir():
        fs.pipe(f"/linstream-bf16/m/{f.name}", f.read_bytes())
    try:
        remote = load_model("memory://linstream-bf16/m", compute_dtype="bfloat16")
        assert remote.fingerprint == want and remote.load_report.mapped_bytes == 0
        ids = np.arange(40) % 50
        np.testing.assert_array_equal(
            remote.embed(ids, chunk_size=9), models["bfloat16"].embed(ids, chunk_size=9)
        )
    finally:
        fs.rm("/linstream-bf16", recursive=True)


def test_mapped_weights_cannot_be_written(tmp_path, monkeypatch):
    """The mapping is read-only: a write raises, the file stays as it was."""
    from linstream.ops.model.fla.tensor_files import is_mapped

    folder = write_folder(tmp_path / "m", TINY_CONFIGS["gla"], dtype="BF16")
    before = (folder / "model.safetensors").read_bytes()
    monkeypatch.setenv(ENV, mapping_engine())  # the products' weights mapped too
    model = load_model(folder, compute_dtype="bfloat16")
    mapped = [a for a in model.held_arrays() if is_mapped(a)]
    assert len(mapped) >= 1 + 2 * 8  # the embedding, each layer's products
    for a in mapped:
        assert not a.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            a.reshape(-1)[0] = 0
    assert (folder / "model.safetensors").read_bytes() == before


# -- refusals ------------------------------------------------------------------------------------
def test_an_unknown_mode_or_engine_is_one_line(tmp_path, monkeypatch):
    folder = write_folder(tmp_path / "m", TINY_CONFIGS["gla"])
    with pytest.raises(TypeError, match="must be one of float32, float64, bfloat16, got 'float16'"):
        load_model(folder, compute_dtype="float16")
    monkeypatch.setenv(ENV, "fast")
    with pytest.raises(ModelFolderError) as info:
        load_model(folder, compute_dtype="bfloat16")
    msg = str(info.value)
    print(msg)
    engines = "auto, avx512bf16, mkl, mkl-mapped, widen"
    assert "\n" not in msg and f"{ENV}='fast': expected one of {engines}" in msg
    assert load_model(folder).compute_mode == "float32"  # the other modes do not ask


def test_native_bf16_reads_the_cpu_flags(tmp_path):
    from linstream.ops.model.fla.bf16 import native_bf16

    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : fpu avx2 avx512f avx512_bf16\n")
    assert native_bf16(str(info)) == "avx512_bf16"
    info.write_text("flags : fpu avx2 amx_tile amx_bf16 avx512_bf16\n")
    assert native_bf16(str(info)) == "amx_bf16"
    info.write_text("flags : fpu avx2 fma\n")
    assert native_bf16(str(info)) is None
    assert native_bf16(str(tmp_path / "absent")) is None
