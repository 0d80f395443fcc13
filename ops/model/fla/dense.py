"""The fla runtime's matrix products: one weight object (`Dense`) for every x @ Wᵀ, made by one
factory (`Weights`) that the loader hands to each family's `build`.

    weights = Weights("float32")                   # the compute mode: float32, float64, bfloat16
    o_proj = weights.dense(tensors["o_proj.weight"])           # Dense: W [out, in] as loaded
    y = o_proj(x)                                  # x [T, in] -> x @ Wᵀ [T, out]
    qkv = weights.fused([("q", wq), ("k", wk), ("v", wv)])      # several projections of one x
    p = qkv(x); p["q"], p["k"], p["v"]             # one [T, out_i] array each
    r, k = weights.together([(r_proj, xr), (k_proj, xk)])      # independent products at once
    norm_w = weights.array(tensors["o_norm.weight"])            # anything else: a plain array
    a_log = weights.array(tensors["A_log"], np.float64)         # ... in a dtype of its own

The contract (what a family may rely on, and what a compute mode may change):

- A family never assumes how the loader hands it a tensor (a NumPy array of its stored dtype,
  maybe a read-only mapping of the file): every tensor goes through the factory,
  `weights.dense` / `weights.fused` for each matrix it multiplies by, `weights.array` for every
  other tensor (norm weights, biases, convolution weights, a gate's small tensors), which it gets
  as a new array of `weights.xp` (NumPy on the host) in the compute dtype `weights.dtype` (or
  the dtype it asks).
- A family computes through `weights.ops` (`compute.Compute`: the pieces, the recurrences, new
  states) and makes arrays with `weights.xp`, never NumPy or a Numba kernel directly: the same
  family code runs on the host and, built again with `device.DeviceWeights`, on a device.
- A Dense's product takes x [T, in] in the compute dtype and returns [T, out] in the compute
  dtype; how the weight is held (`Dense.weight`) and how the product is formed are the Dense's.
- The modes: "float32" and "float64" hold the weights in that dtype; float64 multiplies with
  NumPy's BLAS, float32 with `weights.f32` (`f32.choose_f32_products`: MKL's SGEMM on an Intel CPU
  where MKL is found, else NumPy's BLAS); "bfloat16" holds them in bfloat16
  (`bf16.BF16`) and multiplies through `bf16.Engine` (bfloat16 products accumulated in float32
  where the CPU has the instructions, the weights widened per product for `weights.f32` where
  it has not), with float32 activations (`weights.dtype`).  A weight
  stored in the held dtype is kept as the loader handed it (a local file's mapping: not copied);
  any other is converted once, at load.  An engine that `packs` (MKL from Intel's package) packs
  each bfloat16 weight once, per range of its output columns (a part of a fused projection of
  several: in one range, as a short chunk runs it whole), and the Dense keeps only that
  (`Dense.packed`: the loader's mapping is let go with its layer); so does the float32 mode
  where its products pack (`f32.Float32Products.packs`: MKL, either library).
- Inside `split_rows(split)` (the runtime's forward) a product's rows run in the ranges of
  `split` (`linstream.ops.model.threads.row_split`: ranges fixed by the number of rows alone,
  BLAS at one thread, each range one call), or for a chunk too short for two row ranges its
  output's columns (ranges fixed by the output width), so its bits do not depend on the thread
  count.  The widening bfloat16 engine widens the whole weight once per product on the calling
  thread before a long chunk's row ranges, and each column range's own rows of it on that
  range's thread for a short chunk (so the widening is split too).
  `weights.dense(w, split=False)` is one call over all rows, for a product too small to be
  worth ranges (GLA's rank-16 gate); also independent of the thread count.  A packed weight's
  calls are its row ranges by its packed column ranges, the same calls on any thread count.
- `weights.fused` (and `weights.together`, for independent products of different inputs) runs
  its parts' calls in one hand-off to the threads (`RowSplit.each`, the largest first): a long
  chunk's row ranges of every part, and a short chunk's parts each as one whole call on one
  thread (measured in the bfloat16 mode at 64 tokens: MKL gains nothing from cutting a
  768-wide product in two, and each hand-off costs tens of microseconds here).
- A short chunk's calls of packed weights (each an `mkl.Cell`, a part's an `mkl.Group`) run
  on `packed_batch`'s spinning helpers where it takes them (a hand-off there costs no wake-up
  and no GIL), else on `split`'s threads; the same calls either way, so the same bits.
- `weights.fused` keeps its parts apart (one product each, of the same input): measured on the
  ~110M models' shapes at 64 and 2,048 rows, one product per part ran as fast as one product
  of the concatenated weight (0.84-1.17x, within the noise), and the parts need no copy.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from linstream.ops.model.threads import MIN_ROWS, RowSplit, row_ranges

from . import avx512, mkl
from .bf16 import BF16, Engine, choose_engine, widened
from .compute import HOST, Compute
from .f32 import Rows, blas_rows, choose_f32_products
from .mkl import Cell, Group

__all__ = [
    "MODES",
    "Dense",
    "FusedProjection",
    "RowSplit",
    "Weights",
    "compute_mode",
    "split_rows",
    "together",
]

MODES = ("float32", "float64", "bfloat16")
#: a weight packed once at load: by MKL, or for the AVX512-BF16 kernel
PackedWeight = mkl.Packed | avx512.Packed
_SPLIT: contextvars.ContextVar[RowSplit | None] = contextvars.ContextVar("rows", default=None)


def compute_mode(value: Any) -> str:
    """ "float32", "float64" or "bfloat16" for a compute dtype given as a name, a NumPy type or
    dtype (ml_dtypes' bfloat16 too); TypeError for anything else."""
    if isinstance(value, str):
        name = value.strip().lower()
        name = "bfloat16" if name in ("bf16", "bfloat16") else name
    else:
        try:
            dt = np.dtype(value)
        except TypeError:
            dt = None
        name = "bfloat16" if dt == BF16 else (dt.name if dt is not None else repr(value))
    if name not in MODES:
        msg = f"compute_dtype must be one of {', '.join(MODES)}, got {value!r}"
        raise TypeError(msg)
    return name


@contextlib.contextmanager
def split_rows(split: RowSplit | None) -> Iterator[None]:
    """Within this block (on this thread), every Dense runs its product through ``split``
    (`linstream.ops.model.threads.row_split`); None: one call over all rows."""
    token = _SPLIT.set(split)
    try:
        yield
    finally:
        _SPLIT.reset(token)


Call = Callable[[], None]
#: a short chunk's product by a weight of fewer elements is one call, not column ranges: its
#: work (64 rows by RWKV-7's 64 × 768 low-rank weights: ~10 µs) is less than a hand-off to
#: another thread costs on a shared 2-vCPU machine (measured 25-50 µs)
SMALL_WEIGHT = 1 << 17


def _calls(
    x: np.ndarray, w: np.ndarray, rows: Rows, split: RowSplit | None, *, part: bool = False
) -> tuple[np.ndarray, list[Call]]:
    """y = x [T, in] @ w.T for w [out, in], and the calls that fill it (each one call of
    `rows`): one over all rows without a split; under a split, a chunk long enough for several
    row ranges runs each range on its own rows; a shorter one (one row range) runs the ranges of
    the output's columns instead (`row_ranges` of the output width: fixed by the shape alone, so
    the bits do not depend on the thread count), each over all rows and its own columns of w:
    both threads work on a small chunk, and neither packs the other's half of the weight (row
    halves of a short chunk each pack all of it), unless w has fewer than SMALL_WEIGHT
    elements (one call: less work than a hand-off).  part: a short chunk's product is one of
    several run together (`FusedProjection`, `together`), one call over all of it: the parts,
    not their columns, go to the threads (one hand-off for all, no product cut smaller)."""
    dt = np.float32 if w.dtype == BF16 else np.result_type(x, w)
    t, n = x.shape[0], w.shape[0]
    y = np.empty((t, n), dtype=dt)
    if split is None or (t < 2 * MIN_ROWS and (part or w.size < SMALL_WEIGHT)):
        return y, [functools.partial(rows, x, w, y)]
    if t >= 2 * MIN_ROWS:
        return y, [functools.partial(rows, x[r], w, y[r]) for r in row_ranges(t)]
    return y, [functools.partial(rows, x, w[c], y[:, c]) for c in row_ranges(n)]


def _run(calls: Sequence[Call], split: RowSplit | None) -> None:
    if split is None or len(calls) == 1:
        for call in calls:
            call()
    else:
        from . import packed_batch  # Numba, on the host only

        if not packed_batch.run(calls, split.threads):  # a short chunk's packed products
            split.each(calls)


def _widening(rows: Rows) -> Rows:
    """rows on each call's own rows of a bfloat16 weight, widened on the calling thread."""
    return lambda x, w, out: rows(x, widened(w), out)


def _packed_calls(
    x: np.ndarray, packed: PackedWeight, split: RowSplit | None, *, part: bool = False
) -> tuple[np.ndarray, list[Call]]:
    """`_calls` for a packed weight: each call one range of rows (`row_ranges`, under a split)
    by one packed range of columns, the same calls whoever runs them (a short chunk's columns
    on the threads, or, for a part, all of them on one; a long chunk's rows by columns), so the
    same bits on any thread count."""
    t = x.shape[0]
    y = np.empty((t, packed.n), np.float32)
    rows = row_ranges(t) if split is not None and t >= 2 * MIN_ROWS else [slice(0, t)]
    cells: list[Any] = [
        Cell(packed, x[r], j, y[r])
        if isinstance(packed, mkl.Packed)
        # another engine's packed weight: calls the spinning helpers decline (they call MKL)
        else functools.partial(packed.rows, x[r], j, y[r])
        for r in rows
        for j in range(len(packed.ranges))
    ]
    if split is None or (t < 2 * MIN_ROWS and (part or packed.n * packed.k < SMALL_WEIGHT)):
        return y, [Group(cells)]
    return y, list(cells)


class Dense:
    """A projection: x [T, in] @ Wᵀ for its weight W [out, in] (a linear layer without bias),
    held read-only in the compute dtype, or in bfloat16 with the engine that multiplies by it;
    `packed` once, and the weight not kept, where the engine packs (bfloat16) or `pack` is
    given (a float32 weight: the float32 products' `f32.Float32Products.pack`)."""

    __slots__ = ("engine", "packed", "rows", "shape", "split", "weight")

    def __init__(
        self,
        weight: np.ndarray,
        *,
        split: bool = True,
        engine: Engine | None = None,
        rows: Rows = blas_rows,
        pack: Callable[[np.ndarray, list[slice]], PackedWeight] | None = None,
        columns: bool = True,
    ) -> None:
        if weight.dtype == BF16 and engine is None:
            msg = "a bfloat16 weight needs the engine that multiplies by it (bf16.choose_engine)"
            raise ValueError(msg)
        out, inp = weight.shape
        #: (out, in)
        self.shape = (int(out), int(inp))
        self.engine = engine if weight.dtype == BF16 else None
        self.split = split
        self.rows = rows  # the float32 products' (and the widening engine's) rows
        self.packed: PackedWeight | None = None
        self.weight: np.ndarray | None = weight
        if self.engine is not None and self.engine.packs:
            pack = self.engine.pack
        elif self.engine is not None or weight.dtype != np.float32:
            pack = None  # the float32 products' packing is for float32 weights only
        if pack is not None:
            # per range of the output's columns, as a split runs a short chunk's lone product
            # (one: split=False, or columns=False for a part of several, run whole then)
            whole = [slice(0, self.shape[0])]
            cols = row_ranges(self.shape[0]) if split and columns else whole
            self.packed = pack(weight, cols)
            self.weight = None  # the loader's array (a mapping) is released with the layer
        elif weight.flags.writeable:
            weight.setflags(write=False)

    def arrays(self) -> list[np.ndarray]:
        """What the Dense holds (for the model's held bytes)."""
        return self.packed.arrays() if self.packed is not None else [self._weight]

    @property
    def _weight(self) -> np.ndarray:
        assert self.weight is not None  # held unless packed
        return self.weight

    def calls(self, x: np.ndarray, *, part: bool = False) -> tuple[np.ndarray, list[Call]]:
        """The product's output and the calls that fill it under the current `split_rows`
        (`_calls`; x `prepare`d by the bfloat16 engine)."""
        split = _SPLIT.get() if self.split else None
        engine = self.engine
        if self.packed is not None:
            return _packed_calls(x, self.packed, split, part=part)
        w = self._weight
        if engine is not None and engine.name == "mkl":
            return _calls(x, w, engine.rows, split, part=part)
        if engine is None:
            return _calls(x, w, self.rows, split, part=part)
        # widening: a long chunk widens the whole weight once, on the caller, before its row
        # ranges (into an array of its own: the calls of several parts may wait to run
        # together); a short chunk's calls (column ranges, or a whole part) each widen their
        # own rows of it on their own thread.  The same operands and calls as the float32
        # mode's, so the same bits.
        if split is not None and x.shape[0] < 2 * MIN_ROWS:
            return _calls(x, w, _widening(self.rows), split, part=part)
        return _calls(x, widened(w, np.empty(w.shape, np.float32)), self.rows, split, part=part)

    def sized_calls(
        self, x: np.ndarray, *, part: bool = False
    ) -> tuple[np.ndarray, list[tuple[int, Call]]]:
        """`calls`, each with its share of the weight's elements (to run the largest first)."""
        y, calls = self.calls(x, part=part)
        size = self.shape[0] * self.shape[1] // len(calls)
        return y, [(size, call) for call in calls]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.engine is not None:
            x = self.engine.prepare(x)
        y, calls = self.calls(x)
        _run(calls, _SPLIT.get())
        return y


class FusedProjection:
    """Several projections of one input: one Dense per named weight [out_i, in], called in
    turn; the results by name."""

    __slots__ = ("engine", "parts")

    def __init__(self, parts: dict[str, Dense]) -> None:
        self.parts = parts
        engines = {id(d.engine): d.engine for d in parts.values()}
        #: the parts' one bfloat16 engine, which prepares their shared input once (else None)
        self.engine = next(iter(engines.values())) if len(engines) == 1 else None

    def arrays(self) -> list[np.ndarray]:
        return [a for d in self.parts.values() for a in d.arrays()]

    def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
        if _SPLIT.get() is None:
            if self.engine is not None:
                x = self.engine.prepare(x)  # the bfloat16 mode rounds the shared input once
            return {name: d(x) for name, d in self.parts.items()}
        out: dict[str, np.ndarray] = together([(self, x)])[0]
        return out

    def planned(
        self, x: np.ndarray, *, part: bool
    ) -> tuple[dict[str, np.ndarray], list[tuple[int, Call]]]:
        """The outputs by name and their calls, each with its size (`Dense.sized_calls`)."""
        if self.engine is not None:
            x = self.engine.prepare(x)  # the bfloat16 mode rounds the shared input once
        out: dict[str, np.ndarray] = {}
        sized: list[tuple[int, Call]] = []
        for name, d in self.parts.items():
            out[name], calls = d.sized_calls(x, part=part)
            sized += calls
        return out, sized


Projection = Dense | FusedProjection


def together(items: Sequence[tuple[Projection, np.ndarray]]) -> list[Any]:
    """Independent products, each of its own input (a Dense's output, or a FusedProjection's
    dict), with every call of all of them in one hand-off to the threads of the current
    `split_rows`, the largest first (the threads then end together); a short chunk's products
    each whole on one thread, when there are several (`Dense.calls`'s part)."""
    split = _SPLIT.get()
    if split is None:
        return [p(x) for p, x in items]
    many = len(items) > 1 or any(
        isinstance(p, FusedProjection) and len(p.parts) > 1 for p, _ in items
    )
    outs: list[Any] = []
    sized: list[tuple[int, Call]] = []
    for p, x in items:
        out: Any
        if isinstance(p, FusedProjection):
            out, calls = p.planned(x, part=many)
        else:
            if p.engine is not None:
                x = p.engine.prepare(x)
            out, calls = p.sized_calls(x, part=many)
        outs.append(out)
        sized += calls
    sized.sort(key=lambda sc: -sc[0])
    _run([call for _, call in sized], split)
    return outs


class Weights:
    """The factory of a load's weights in one compute mode (see the module docstring).

    dtype: the activations' dtype (float32 in the bfloat16 mode); held: what products'
    weights and the embedding are held in; engine: the bfloat16 mode's `bf16.Engine`;
    converted_bytes: the stored bytes of every tensor converted (copied) so far; ops: the
    compute backend the families call (`compute.HOST` here; a device's in
    `device.DeviceWeights`), xp its array namespace."""

    ops: Compute = HOST

    @property
    def xp(self) -> Any:
        return self.ops.xp

    def __init__(self, mode: npt.DTypeLike | str = "float32", *, engine: Engine | None = None):
        self.mode = compute_mode(mode)
        self.dtype = np.dtype(np.float64 if self.mode == "float64" else np.float32)
        self.held = BF16 if self.mode == "bfloat16" else self.dtype
        self.engine = None
        if self.mode == "bfloat16":
            self.engine = engine if engine is not None else choose_engine()
        #: the float32 products (the float32 mode's, and the widening engine's); NumPy's BLAS
        #: in the float64 mode
        self.f32 = choose_f32_products() if self.mode != "float64" else None
        self.converted_bytes = 0

    @property
    def products(self) -> str:
        """How this mode's products are formed (the line a load logs)."""
        parts = [self.engine.note] if self.engine is not None else []
        if self.f32 is not None and (self.engine is None or self.engine.name == "widen"):
            parts.append(self.f32.note)
        return "; ".join(parts)

    def array(self, tensor: Any, dtype: npt.DTypeLike | None = None) -> np.ndarray:
        """A tensor as loaded, as a new NumPy array in `dtype` (default: the compute dtype)."""
        return np.array(tensor, dtype=self.dtype if dtype is None else dtype, copy=True)

    def held_array(self, tensor: Any) -> np.ndarray:
        """A tensor in the held dtype, read-only: the loader's array itself where it is already
        so (a local file's mapping stays a mapping), else converted once."""
        a = np.asarray(tensor)
        if a.dtype == self.held and a.flags.c_contiguous and a.flags.aligned:
            return a
        self.converted_bytes += int(a.nbytes)
        out = np.array(a, dtype=self.held, order="C", copy=True)
        out.setflags(write=False)
        return out

    def table(self, tensor: Any) -> np.ndarray:
        """A table read by rows (the token embedding), held as products' weights are; its rows
        are converted to the compute dtype as they are gathered."""
        return self.held_array(tensor)

    def dense(self, tensor: Any, *, split: bool = True, columns: bool = True) -> Dense:
        """The projection of a weight [out, in] as loaded; columns=False: a packed weight in one
        range of columns (`fused`'s parts)."""
        f32 = self.f32
        rows = f32.rows if f32 is not None else blas_rows
        pack = f32.pack if f32 is not None and f32.packs else None  # Dense: float32 weights
        held = self.held_array(tensor)
        d = Dense(held, split=split, engine=self.engine, rows=rows, pack=pack, columns=columns)
        if d.packed is not None:  # a copy in MKL's layout, beside the tensor until it is let go
            self.converted_bytes += d.packed.nbytes
        return d

    def together(self, items: Sequence[tuple[Any, Any]]) -> list[Any]:
        """Independent products of their own inputs [(dense or fused, x), ...], in one hand-off
        to the threads (`together`): each result what its own call gives, to rounding (a short
        chunk's products are whole calls then, not column ranges)."""
        return together(items)

    def fused(self, parts: Sequence[tuple[str, Any]]) -> FusedProjection:
        """Several projections [out_i, in] of one input, by name.  Of two or more, each packed
        weight is one range of columns: a short chunk runs each part whole on one thread, and a
        long chunk's row ranges then multiply the whole width (a 2,048-row product by a
        768 × 768 weight in two column ranges took 1.04x the time of one; 2,048 wide: 1.01-1.03x;
        MKL, one thread)."""
        whole = len(parts) > 1
        return FusedProjection({name: self.dense(w, columns=not whole) for name, w in parts})
