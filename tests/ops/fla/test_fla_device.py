"""The fla runtime's device path (backend "cupy"), run on the CPU: the same `FlaModel` forward a
GPU runs, with the CUDA kernels compiled as C++ and run over emulated blocks and threads
(tests/helpers/cuda_emu.py) and NumPy as the device's arrays (NaN-filled `empty`, as device
memory is garbage).  `_forward_on(_CupyDevice(EmuLauncher()), ...)` is the hook: the launcher is
passed the way the built-in model's device tests pass it (test_model_device.py).

What is compared, per family (the tiny random folders of helpers/fla_folders.py):
- the device forward against the host runtime over a random chunk split (seed and split printed);
- the handoff: a sequence's first chunks on the host, then the device, then the host again;
- the bfloat16 mode (weights held on the device as their 16 bits);
- where there is no device, backend "cupy" refuses in one line, from the API and the CLI.

Tolerance, derived as tests/ops/fla/test_fla_oracle.py derives its own: the reference is the host
runtime in float64 in one piece (the model's math in float64); a float32 run over the same split
differs from it by e32.  The device's float32 run must stay within FACTOR · e32 of the reference:
the same rounding at the same unit roundoff, with a factor of 8 (3 bits) for a different
evaluation order (the kernels' chunk sizes fitted to shared memory, the pieces as array
expressions where the host runs fused Numba passes with a polynomial exp).  The states are held
to the same bound with e32 measured on the states.

e32 is the largest error of 1 + DRAWS float32 host runs: the model as stored, and copies of its
weights each moved by a seeded random factor within float32's unit roundoff (other float32
roundings of the same model, `helpers.float32_draws`).  One run's error is one draw, and the
largest element's is not always typical: where a head's attention output nearly cancels and its
norm rescales it, the error there was 4.6e-7, 1.5e-5 and 1.6e-5 in three draws, and the lucky
first one made an ordinary device error (2.3e-5) 8.5x the host's (Gated DeltaNet, seed 466, an
example below: the device's inputs to the delta kernel a rounding from the host's, the two
kernels agreeing to a rounding on the same inputs).  Against the three draws: 1.5x there, at
most 1.8x over 41 seeds (the other families: 1.1-1.5x).  The bfloat16 mode has no such
copies (it would round them back): there e32 is the host run's alone.
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import linstream, one_error_line, write_texts
from helpers.cuda_emu import EmuLauncher, compiler_missing
from helpers.fla_folders import TINY_CONFIGS, write_folder
from helpers.float32_draws import perturbed_folders
from helpers.streaming import random_bounds, worst
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from linstream.ops.backend import BackendUnavailableError, cupy_available
from linstream.ops.model.device import _CupyDevice
from linstream.ops.model.fla import LayerState, ModelFolderError, load_model

pytestmark = pytest.mark.skipif(compiler_missing() is not None, reason=str(compiler_missing()))

_TESTS = Path(__file__).resolve().parents[2]
FAMILIES = ["gla", "retnet", "hgrn2", "delta_net", "gated_deltanet"]
T = 40  # tokens: across the delta kernels' 32-token chunks, short of the decay rules' 64
FACTOR = 8  # see the module docstring


def _device() -> _CupyDevice:
    return _CupyDevice(EmuLauncher())


def _host_run(model, ids, bounds, states=None):
    return _run(model.hidden_states, ids, bounds, states)


def _device_run(model, dev, ids, bounds, states=None):
    return _run(lambda x, s: model._forward_on(dev, x, s, None), ids, bounds, states)


def _run(step, ids, bounds, states):
    """step over the pieces [a, b) of bounds: (each hidden state concatenated, final states)."""
    outs = []
    for a, b in itertools.pairwise(bounds):
        hs, states = step(ids[a:b], states)
        outs.append(hs)
    return [np.concatenate(layer) for layer in zip(*outs, strict=True)], states


def _state_arrays(states):
    return [a for s in states for k, a in s.items() if k != "position"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("fla_device")
    cache: dict = {}

    def get(name, dtype="F32"):
        if (name, dtype) not in cache:
            cache[name, dtype] = write_folder(root / f"{name}_{dtype}", TINY_CONFIGS[name],
                                              dtype=dtype, seed=1)  # fmt: skip
        return cache[name, dtype]

    return get


def _reference(folder, ids, mode="float32"):
    """(host float64 in one piece: hidden states, states), the model in `mode`."""
    ref_hs, ref_st = load_model(folder, compute_dtype="float64").hidden_states(ids, None)
    return ref_hs, ref_st, load_model(folder, compute_dtype=mode)


@functools.cache
def _perturbed(folder: Path) -> tuple:
    """The float32 models of `float32_draws.perturbed_folders(folder)` (written once)."""
    return tuple(load_model(f, compute_dtype="float32") for f in perturbed_folders(folder))


def _float32_error(model, folder, ids, bounds, ref_hs, ref_st):
    """(e32 on hidden states, e32 on states): the largest errors of the host's run over
    `bounds` and of the perturbed models' runs (the module docstring)."""
    runs = [_host_run(model, ids, bounds)]
    if model.compute_mode == "float32":
        runs += [_host_run(p, ids, bounds) for p in _perturbed(Path(folder))]
    e32 = max(worst(hs, ref_hs) for hs, _ in runs)
    s32 = max(worst(_state_arrays(st), _state_arrays(ref_st)) for _, st in runs)
    return e32, s32


def _compare(model, folder, dev, ids, bounds, ref_hs, ref_st):
    """(device error, tolerance) for hidden states and states over the split `bounds`."""
    e32, s32 = _float32_error(model, folder, ids, bounds, ref_hs, ref_st)
    dev_hs, dev_st = _device_run(model, dev, ids, bounds)
    assert all(type(h) is np.ndarray and h.dtype == model.compute_dtype for h in dev_hs)
    assert all(isinstance(s, LayerState) for s in dev_st)
    assert all(a.dtype == np.float64 and type(a) is np.ndarray for a in _state_arrays(dev_st))
    err = worst(dev_hs, ref_hs)
    serr = worst(_state_arrays(dev_st), _state_arrays(ref_st))
    print(f"hidden: device {err:.3g} f32 {e32:.3g}; states: device {serr:.3g} f32 {s32:.3g}")
    return err, FACTOR * e32, serr, FACTOR * s32


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(seed=st.integers(0, 2**32 - 1))
@example(seed=466)  # a lucky host draw at an ill-conditioned element (the module docstring)
@pytest.mark.parametrize("name", FAMILIES)
def test_device_forward_equals_the_host_runtime(folders, name, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 50, T)
    bounds = sorted({*random_bounds(rng, T), int(rng.integers(1, T))})  # a state carried, at least
    print(f"family={name} seed={seed} bounds={bounds}")
    ref_hs, ref_st, model = _reference(folders(name), ids)
    err, tol, serr, stol = _compare(model, folders(name), _device(), ids, bounds, ref_hs, ref_st)
    assert err <= tol
    assert serr <= stol


@pytest.mark.parametrize("name", FAMILIES)
def test_a_state_dropped_on_the_device_fails_the_comparison(folders, name, monkeypatch):
    """The comparison above catches a broken wiring: the device path handed zero states (a
    sequence restarted at every chunk) is far outside the bound."""
    from linstream.ops.model.fla import device

    real = device.upload_states

    def dropped(states, dev):
        zeros = [LayerState({k: np.zeros_like(a) for k, a in st.items()}) for st in states]
        return real(zeros, dev)

    monkeypatch.setattr(device, "upload_states", dropped)
    ids = np.arange(T) % 50
    ref_hs, ref_st, model = _reference(folders(name), ids)
    err, tol, _, _ = _compare(model, folders(name), _device(), ids, [0, 13, T], ref_hs, ref_st)
    assert err > 100 * tol


@pytest.mark.parametrize("name", FAMILIES)
def test_a_sequence_moves_between_host_and_device(folders, name):
    """Chunks 1-2 on the host, 3-4 on the device, 5 on the host again: one sequence, one result
    within the bound of one host run."""
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 50, T)
    cuts = [0, 1, 9, 17, 30, T]
    print(f"family={name} cuts={cuts}")
    ref_hs, ref_st, model = _reference(folders(name), ids)
    e32, s32 = _float32_error(model, folders(name), ids, cuts, ref_hs, ref_st)
    dev = _device()
    a, st1 = _host_run(model, ids, cuts[:3])
    b, st2 = _device_run(model, dev, ids, [cuts[2], cuts[3], cuts[4]], st1)
    c, st3 = _host_run(model, ids, cuts[4:], st2)
    got = [np.concatenate(parts) for parts in zip(a, b, c, strict=True)]
    tol, stol = FACTOR * e32, FACTOR * s32
    err, serr = worst(got, ref_hs), worst(_state_arrays(st3), _state_arrays(ref_st))
    print(f"handoff error {err:.3g} (tolerance {tol:.3g}), states {serr:.3g} ({stol:.3g})")
    assert err <= tol
    assert serr <= stol


@pytest.mark.parametrize("name", FAMILIES)
def test_the_float64_mode_runs_in_float64_on_the_device(folders, name):
    """compute_dtype float64 on the device: float64 outputs within the float32 bound scaled to
    float64's unit roundoff (u64 / u32 = 2^-29), as tests/ops/fla/test_fla_oracle.py scales it,
    of the host's float64 run in one piece."""
    ids = np.random.default_rng(5).integers(0, 50, T)
    bounds = [0, 7, 30, T]
    ref_hs, _, m32 = _reference(folders(name), ids)
    e32 = worst(_host_run(m32, ids, bounds)[0], ref_hs)
    m64 = load_model(folders(name), compute_dtype="float64")
    got, _ = _device_run(m64, _device(), ids, bounds)
    assert all(h.dtype == np.float64 for h in got)
    err, tol = worst(got, ref_hs), FACTOR * e32 * 2.0**-29
    print(f"float64 device error {err:.3g}, tolerance {tol:.3g}")
    assert err <= tol


@pytest.mark.parametrize("name", ["gla", "gated_deltanet"])
def test_bfloat16_weights_stay_16_bit_on_the_device(folders, name):
    """A bfloat16 folder in the bfloat16 mode: the device holds the products' weights and the
    embedding as their 16 bits, and its float32 compute stays within the bound of the host's
    bfloat16 mode (float32 on the widened weights) from the float64 run of the same weights."""
    ids = np.random.default_rng(3).integers(0, 50, T)
    ref_hs, ref_st, model = _reference(folders(name, "BF16"), ids, "bfloat16")
    dev = _device()
    err, tol, serr, stol = _compare(model, folders(name, "BF16"), dev, ids, [0, 11, T], ref_hs,
                                    ref_st)  # fmt: skip
    assert err <= tol
    assert serr <= stol
    held = model._device_models[dev.cache_key()]
    assert held.embed.dtype == np.uint16
    assert held.blocks[0].down.weight.dtype == np.uint16


def test_the_device_copy_is_built_once_and_refuses_a_changed_folder(folders, tmp_path):
    folder = write_folder(tmp_path / "m", TINY_CONFIGS["gla"], seed=2)
    model = load_model(folder)
    dev = _device()
    model._forward_on(dev, np.arange(5), None, 2)
    first = model._device_models[dev.cache_key()]
    model._forward_on(dev, np.arange(5), None, 2)
    assert model._device_models[dev.cache_key()] is first
    other = write_folder(tmp_path / "o", TINY_CONFIGS["gla"], seed=3)
    (folder / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    with pytest.raises(ModelFolderError, match="changed since the model was loaded"):
        model._forward_on(_device(), np.arange(5), None, 2)


@pytest.mark.skipif(cupy_available(), reason="a GPU is present: backend cupy runs here")
def test_no_device_refuses_cupy_in_one_line_as_the_builtin_model_does(folders, tmp_path):
    model = load_model(folders("gla"))
    with pytest.raises(BackendUnavailableError, match="backend 'cupy' was requested"):
        model.embed_chunk(np.arange(3), None, backend="cupy")
    # "auto" without a device is the host runtime, bit for bit
    np.testing.assert_array_equal(
        model.embed_chunk(np.arange(9), None)[0],
        model.embed_chunk(np.arange(9), None, backend="numba")[0],
    )
    write_texts(tmp_path / "in", {"a.txt": "x"})
    lines = []
    for spec in (str(folders("gla")), "builtin:default"):
        proc = linstream("embed", "--input", "in", "--output", "o", "--model", spec,
                         "--backend", "cupy", cwd=tmp_path)  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        lines.append(one_error_line(proc))
    assert "--backend cupy: no usable GPU here" in lines[0]
    assert lines[0] == lines[1]


@pytest.mark.slow
def test_the_gpu_checks_dry_run_passes_for_every_family(tmp_path):
    """tests/gpu/gpu_check_fla.py in its CPU dry run (the emulator behind "cupy", fla on the
    CPU, small shapes): its own logic, before its one shot on a device (~1 minute)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "gpu" / "gpu_check_fla.py"
    env = {**os.environ, "GPU_CHECK_CPU_DRYRUN": "1", "OUT": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check_fla.json").read_text())
    assert report["status"] == "ok"
    checked = {(r["family"], r["check"]) for r in report["fla"]["rows"] if r["ok"] and "err" in r}
    for fam in FAMILIES:
        for check in ("cupy vs CPU float64 (float32)", "cupy vs CPU float64 (bfloat16)",
                      "handoff CPU -> GPU (hidden)", "cupy vs fla forward (float32)"):  # fmt: skip
            assert (fam, check) in checked, (fam, check)


@pytest.mark.slow
def test_every_option_of_the_oracle_configs_runs_on_the_device(tmp_path):
    """The suite's option-covering configs (helpers/fla_oracle.py tiny_configs: grouped heads,
    feature maps, clamps, no convs, sum norms, negative eigenvalues, gate activations, grouped
    value heads, lower bounds), random weights, device against host as above (~20 s: fla's
    import)."""
    from helpers.fla_oracle import tiny_configs

    rng = np.random.default_rng(11)
    for name, cfg in tiny_configs().items():
        folder = write_folder(tmp_path / name, cfg.to_dict(), seed=5)
        ids = rng.integers(0, 128, T)
        bounds = sorted({*random_bounds(rng, T), int(rng.integers(1, T))})
        print(f"config={name} bounds={bounds}")
        ref_hs, ref_st, model = _reference(folder, ids)
        err, tol, serr, stol = _compare(model, folder, _device(), ids, bounds, ref_hs, ref_st)
        assert err <= tol, name
        assert serr <= stol, name


_WITHOUT_NUMBA = """
import importlib.abc, sys
import numpy as np

class NoNumba(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("numba", "llvmlite"):
            raise ImportError(f"no {name} on the device machine")

sys.meta_path.insert(0, NoNumba())
from helpers.cuda_emu import EmuLauncher
from linstream.ops.model.device import _CupyDevice
from linstream.ops.model.fla import load_model

out = {}
for i, folder in enumerate(sys.argv[2:]):
    model = load_model(folder)
    hs, st = model._forward_on(_CupyDevice(EmuLauncher()), np.arange(12) % 50, None, None)
    out[str(i)] = hs[-1]
assert "numba" not in sys.modules
np.savez(sys.argv[1], **out)
"""


def test_the_device_path_runs_where_numba_is_not_installed(folders, tmp_path):
    """The device machine has no Numba: the device path imports and runs without it (a
    process where importing numba fails), and gives what it gives here."""
    import os
    import subprocess
    import sys

    paths = [str(folders(name)) for name in FAMILIES]
    out = tmp_path / "hidden.npz"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(_TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-c", _WITHOUT_NUMBA, str(out), *paths]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    there = np.load(out)
    for i, folder in enumerate(paths):
        here = load_model(folder)._forward_on(_device(), np.arange(12) % 50, None, None)[0][-1]
        np.testing.assert_array_equal(there[str(i)], here)
