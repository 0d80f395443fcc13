"""Where a loaded fla model's forward spends its time, by kind of work, for the benchmarks.

    with Profile() as prof:                 # wraps the runtime's functions in this process
        model.embed_chunk(ids, states)
    prof.seconds   # {"products": s, "recurrence": s, "norms and activations": s,
                   #  "layout copies": s}; the rest of the wall time is "other"

On a device, `Profile(sync=...)` waits for the device around each outermost call.  Each kind
is the wall time of the outermost calls of its functions on the calling thread (a
product's row ranges run on helper threads inside its call; a norm calling another norm counts
once):

- products: every `dense.Dense` and `dense.FusedProjection` call and `Weights.together` (BLAS,
  or the bfloat16 products), and `device.DeviceDense`'s (cuBLAS);
- recurrence: the compute backend's kernels (`compute.Compute`'s `*_chunks` methods, which the
  families call as `weights.ops.<kernel>`), and any kernel a family module imports from
  `linstream.ops` outside `linstream.ops.model` (found by its module);
- norms and activations: the backend's other pieces (`Compute`'s methods), the families' pass
  selectors (classes named `*Ops` in the family modules: RWKV-7's and Mamba-2's passes), and the
  functions of `pieces`, `fused`, `rwkv7_passes` and `mamba2_passes` as each module calls them;
- layout copies: `head_major` (the backend's and `families`') and `families.row_major`;
- other (wall time minus the kinds): the embedding lookup, residual adds, dtype casts, state
  copies and the Python between the calls.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
import time
from collections.abc import Callable
from typing import Any

KINDS = ("products", "recurrence", "norms and activations", "layout copies")
_LAYOUT = ("head_major", "row_major")
_KERNELS = [["linstream", "ops", k] for k in ("additive", "decay", "delta", "dplr", "rules", "ssd")]
_PASSES = ("pieces", "fused", "rwkv7_passes", "mamba2_passes")  # fla's modules of such passes
# the backend's methods that are not pieces of the computation: state and array handling
_NOT_PIECES = ("copy", "state", "gather", "rotary_tables")


def _methods(cls: type) -> list[str]:
    """The public functions a class defines itself."""
    return [n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")]


class Profile:
    """Wraps the runtime's functions while inside the `with` block (see the module docstring)."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        """sync: on a device, called before and after each outermost call (the device's work
        waited for, so each kind's time is its kernels', not their launch)."""
        self.sync = sync
        self.seconds = dict.fromkeys(KINDS, 0.0)
        self.calls = dict.fromkeys(KINDS, 0)
        self.by_function: dict[str, float] = {}
        self._depth = threading.local()
        self._undo: list[Callable[[], None]] = []

    def reset(self) -> None:
        self.seconds = dict.fromkeys(KINDS, 0.0)
        self.calls = dict.fromkeys(KINDS, 0)
        self.by_function = {}

    def _wrap(self, kind: str, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        depth, seconds, calls, sync = self._depth, self, self, self.sync

        def timed(*args: Any, **kwargs: Any) -> Any:
            d = getattr(depth, "n", 0)
            depth.n = d + 1
            if d == 0 and sync is not None:
                sync()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                depth.n = d
                if d == 0:
                    if sync is not None:
                        sync()
                    dt = time.perf_counter() - t0
                    seconds.seconds[kind] += dt
                    calls.calls[kind] += 1
                    seconds.by_function[name] = seconds.by_function.get(name, 0.0) + dt

        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        return timed

    def _patch(self, owner: Any, name: str, kind: str) -> None:
        old = getattr(owner, name)
        setattr(owner, name, self._wrap(kind, old, name))
        self._undo.append(lambda: setattr(owner, name, old))

    def __enter__(self) -> Profile:
        from linstream.ops.model import fla
        from linstream.ops.model.fla import dense
        from linstream.ops.model.fla.compute import Compute
        from linstream.ops.model.fla.device import DeviceDense

        self._patch(dense.Dense, "__call__", "products")
        self._patch(DeviceDense, "__call__", "products")  # its own: the device's products
        self._patch(dense.FusedProjection, "__call__", "products")
        self._patch(dense.Weights, "together", "products")
        for name in _methods(Compute):
            if name.endswith("_chunks"):
                self._patch(Compute, name, "recurrence")
            elif name in _LAYOUT:
                self._patch(Compute, name, "layout copies")
            elif name not in _NOT_PIECES:
                self._patch(Compute, name, "norms and activations")
        helpers = {f"{fla.__name__}.{name}" for name in _PASSES}
        for info in pkgutil.iter_modules(fla.__path__):
            mod = importlib.import_module(f"{fla.__name__}.{info.name}")
            if mod is dense:
                continue
            for name, value in list(vars(mod).items()):
                where = getattr(value, "__module__", "") or ""
                if isinstance(value, type) and name.endswith("Ops") and where == mod.__name__:
                    for method in _methods(value):
                        self._patch(value, method, "norms and activations")
                    continue
                if not callable(value) or isinstance(value, type):
                    continue
                if name in _LAYOUT and where.endswith(".families"):
                    self._patch(mod, name, "layout copies")
                elif where in helpers and not name.startswith("_"):
                    self._patch(mod, name, "norms and activations")
                elif where.split(".")[:3] in _KERNELS and not name.isupper():
                    self._patch(mod, name, "recurrence")
        return self

    def __exit__(self, *exc: object) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def shares(self, wall: float) -> dict[str, float]:
        """Each kind's share of `wall` seconds, and "other" for the rest."""
        out = {k: v / wall for k, v in self.seconds.items()}
        out["other"] = max(0.0, 1.0 - sum(out.values()))
        return out
