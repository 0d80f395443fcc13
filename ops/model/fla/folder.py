"""Load a Hugging Face checkpoint folder in fla's format into the streaming runtime.

    model = load_model("path/to/folder")          # FlaModel, or ModelFolderError in one line
    model = load_model("gs://bucket/models/gla/")  # a URL of a folder (fsspec)

A folder holds config.json (its model_type names the family), the weights as one
model.safetensors or several shards listed by model.safetensors.index.json, and the tokenizer as
tokenizer.json (a folder with only SentencePiece's tokenizer.model, or only RWKV's world
vocabulary, loads, and says what to do when its tokenizer is asked for). Weights are read from
safetensors only (PyTorch's pickle files are refused, never opened), one tensor at a time:
memory-mapped from a local folder, read from a URL's (`tensor_files`). compute_dtype picks the
mode (`dense.Weights`): float32 (the default) or float64 hold every weight in that dtype,
bfloat16 holds the products' weights and the embedding in bfloat16 and computes in float32
(`bf16`); a tensor stored in the dtype it is held in stays mapped (a float32 folder in the
float32 mode, a bfloat16 folder in the bfloat16 mode: not copied), any other is converted once
as its layer is read, so the load holds the runtime's weights plus one layer's converted tensors
at most. The output head (lm_head) is not read: the runtime gives hidden states. Where the
tensors are (their prefix, the embedding, the final norm, each layer's names and shapes) and how
a layer becomes a block is the family's (`families.Family`; fla's layout and standard block by
default); names and shapes are checked against the config before any tensor is read.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import resource
import sys
import time
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import PurePosixPath
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from .bf16 import BF16Unavailable
from .block import Block, ModelLayout, Norm
from .config import CommonConfig, FlaConfig, ModelFolderError, parse_config
from .dense import Weights, compute_mode
from .families import family
from .location import FolderLocation
from .mkl import MKLUnavailable
from .runtime import FlaModel, LoadReport
from .tensor_files import (
    TensorEntry,
    TensorFileError,
    is_mapped,
    map_tensor,
    read_header,
    read_tensor,
)

__all__ = ["expected_tensors", "folder_tokenizer", "load_model", "read_folder_config"]

RWKV_WORLD_VOCAB = "rwkv_vocab_v20230424.txt"  # RWKV's "world" tokenizer's vocabulary file

_log = logging.getLogger(__name__)
_FINGERPRINT_TAG = b"linstream-fla-fingerprint-v1"
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth")


def load_model(
    path: str | os.PathLike[str], *, compute_dtype: npt.DTypeLike | str = np.float32
) -> FlaModel:
    """The runtime of the checkpoint folder at `path` (see the module docstring); compute_dtype:
    float32, float64 or "bfloat16" (a name or a NumPy type, ml_dtypes' bfloat16 too)."""
    t0 = time.perf_counter()
    source = os.fspath(path)
    folder = FolderLocation(source)
    mode = compute_mode(compute_dtype)
    if not folder.is_dir():
        msg = (
            f"{source}: not a folder (expected a Hugging Face checkpoint folder with "
            "config.json and model.safetensors)"
        )
        raise ModelFolderError(msg)
    config = parse_config(_read_json(folder, "config.json", source), source=source)
    entries = _entries(folder, source)
    layout = family(config.common.family).layout(config.layer, config.common)
    prefix = next((p for p in layout.prefixes if any(n.startswith(p) for n in entries)), "")
    want = expected_tensors(config, prefix)
    _check_entries(entries, want, layout.ignored if prefix else (), source)
    tokenizer, problem = _tokenizer(folder, source)
    try:
        weights = Weights(mode)
    except (BF16Unavailable, MKLUnavailable) as ex:
        msg = f"{source}: compute_dtype {mode}: {ex}"
        raise ModelFolderError(msg) from ex
    model, report = _build(config, entries, want, prefix, weights, source, folder)
    model.tokenizer_path, model._tokenizer_problem = tokenizer, problem
    report = LoadReport(**{**vars(report), "seconds": time.perf_counter() - t0})
    model.load_report = report
    _log.info("%s", report)
    return model


def read_folder_config(path: str | os.PathLike[str]) -> FlaConfig:
    """The folder's config.json, parsed and checked as `load_model` does, without reading any
    weights (what a job's planner needs: the vocabulary, the width)."""
    source = os.fspath(path)
    folder = FolderLocation(source)
    if not folder.is_dir():
        msg = f"{source}: not a folder (expected a Hugging Face checkpoint folder)"
        raise ModelFolderError(msg)
    return parse_config(_read_json(folder, "config.json", source), source=source)


def folder_tokenizer(path: str | os.PathLike[str]) -> tuple[str | None, str | None]:
    """(the folder's tokenizer.json as a path or URL, None), or (None, a line saying what to
    add: a folder with only SentencePiece's tokenizer.model, or none)."""
    source = os.fspath(path)
    return _tokenizer(FolderLocation(source), source)


def expected_tensors(config: FlaConfig, prefix: str | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor name the runtime reads for this config, with its shape, in the order it
    reads them (prefix: the names' prefix; None: the family layout's first)."""
    c = config.common
    fam = family(c.family)
    layout = fam.layout(config.layer, c)
    if prefix is None:
        prefix = layout.prefixes[0]
    out: dict[str, tuple[int, ...]] = {f"{prefix}{layout.embedding}": (c.vocab_size, c.hidden_size)}
    for name, shape in layout.final_norm.tensors(c.hidden_size).items():
        out[f"{prefix}{name}"] = shape
    for name, shape in fam.model_tensors(config.layer, c).items():
        out[f"{prefix}{name}"] = shape
    for i in range(c.num_layers):
        p = _layer_prefix(layout, prefix, i)
        for name, shape in fam.layer_tensors(config.layer, c, i).items():
            out[f"{p}{name}"] = shape
    return out


def _layer_prefix(layout: ModelLayout, prefix: str, index: int) -> str:
    return f"{prefix}{layout.layers}{index}."


def _read_json(folder: FolderLocation, name: str, source: str) -> Any:
    if not folder.is_file(name):
        msg = f"{source}: no {name} (expected a Hugging Face checkpoint folder in fla's format)"
        raise ModelFolderError(msg)
    try:
        return json.loads(folder.read_text(name))
    except (UnicodeDecodeError, json.JSONDecodeError) as ex:
        msg = f"{source}: {name} is not valid JSON ({ex})"
        raise ModelFolderError(msg) from ex


def _entries(folder: FolderLocation, source: str) -> dict[str, TensorEntry]:
    """Every tensor entry of the folder's safetensors file(s), by name."""
    if folder.is_file(_INDEX):
        index = _read_json(folder, _INDEX, source)
        wmap = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
            msg = f"{source}: {_INDEX} has no weight_map of tensor names to file names"
            raise ModelFolderError(msg)
        files = sorted(set(wmap.values()))
        for f in files:
            if PurePosixPath(f).name != f or "\\" in f or not f.endswith(".safetensors"):
                msg = f"{source}: {_INDEX} names {f!r}; expected a .safetensors file in the folder"
                raise ModelFolderError(msg)
    elif folder.is_file(_SINGLE):
        wmap, files = None, [_SINGLE]
    else:
        pickles = [p for p in _PICKLES if folder.exists(p)]
        if pickles:
            msg = (
                f"{source}: only PyTorch pickle weights ({pickles[0]}); linstream reads "
                "safetensors only and never unpickles: save the model with transformers' "
                "save_pretrained (safetensors is its default) and load that folder"
            )
        else:
            msg = f"{source}: no {_SINGLE} and no {_INDEX} (the weights, in safetensors)"
        raise ModelFolderError(msg)
    out: dict[str, TensorEntry] = {}
    for f in files:
        path = folder.path(f)
        if not folder.is_file(f):
            msg = f"{source}: {f} is listed in {_INDEX} but missing"
            raise ModelFolderError(msg)
        try:
            header = read_header(path, size=folder.size(path), opener=folder.open)
        except TensorFileError as ex:
            raise ModelFolderError(str(ex)) from ex
        for name, e in header.items():
            if name in out:
                msg = (
                    f"{source}: tensor {name!r} is in both "
                    f"{PurePosixPath(out[name].path).name} and {f}"
                )
                raise ModelFolderError(msg)
            if wmap is not None and wmap.get(name) != f:
                msg = f"{source}: tensor {name!r} is in {f}, but {_INDEX} says {wmap.get(name)!r}"
                raise ModelFolderError(msg)
            out[name] = e
    if wmap is not None:
        lost = sorted(n for n in wmap if n not in out)
        if lost:
            msg = f"{source}: {_INDEX} lists tensor {lost[0]!r} in {wmap[lost[0]]}, which lacks it"
            raise ModelFolderError(msg)
    return out


def _check_entries(
    entries: Mapping[str, TensorEntry],
    want: Mapping[str, tuple[int, ...]],
    ignored: tuple[str, ...],
    source: str,
) -> None:
    missing = [n for n in want if n not in entries]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        msg = (
            f"{source}: missing tensor {missing[0]!r}{more}; a model with this config.json "
            f"needs {len(want)}"
        )
        raise ModelFolderError(msg)
    extra = sorted(n for n in entries if n not in want and n not in ignored)
    if extra:
        msg = (
            f"{source}: unexpected tensor {extra[0]!r} (a model with this config.json has no "
            "such tensor)"
        )
        raise ModelFolderError(msg)
    for name, shape in want.items():
        got = entries[name].shape
        if got != shape:
            msg = (
                f"{source}: tensor {name!r} has shape {list(got)}, expected {list(shape)} for "
                "this config.json"
            )
            raise ModelFolderError(msg)


def _tokenizer(folder: FolderLocation, source: str) -> tuple[str | None, str | None]:
    """(tokenizer.json's path or URL, None), or (None, what to add)."""
    if folder.is_file("tokenizer.json"):
        return folder.url("tokenizer.json"), None
    if folder.is_file("tokenizer.model"):
        return None, (
            f"{source}: only a SentencePiece tokenizer.model, and linstream reads tokenizer.json: "
            "download the model's tokenizer.json into the folder, or write one next to it with "
            '`python -c "from transformers import AutoTokenizer; '
            f"AutoTokenizer.from_pretrained('{source}').save_pretrained('{source}')\"` (needs "
            "transformers and sentencepiece)"
        )
    if folder.is_file(RWKV_WORLD_VOCAB):
        return None, (  # its greedy longest match over bytes has no tokenizer.json form
            f"{source}: only RWKV's world vocabulary {RWKV_WORLD_VOCAB}, no tokenizer.json: "
            f"tokenize with `rwkv.rwkv_tokenizer.TRIE_TOKENIZER('{RWKV_WORLD_VOCAB}')` (pip "
            "install rwkv) and give the ids as --input-format tokens-jsonl"
        )
    return None, f"{source}: no tokenizer.json in the folder"


def _peak_rss() -> int:
    """The process's memory high-water mark in bytes: VmHWM where /proc has it (ru_maxrss
    survives exec on Linux, so a child of a big process would report its parent's)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)


def _read_model(
    config: FlaConfig,
    entries: Mapping[str, TensorEntry],
    prefix: str,
    weights: Weights,
    folder: FolderLocation,
    digests: dict[str, str],
) -> tuple[Any, Norm, list[Block], int]:
    """The embedding table, final norm and blocks built through `weights` (the tensors read
    in the loader's order, their sha256 into digests), and the most one layer converted."""
    c: CommonConfig = config.common
    fam = family(c.family)
    layout = fam.layout(config.layer, c)
    transient = 0
    with ExitStack() as stack:
        files: dict[str, IO[bytes]] = {}

        def read(name: str) -> np.ndarray:
            e = entries[name]
            try:
                if folder.is_local:
                    return map_tensor(e, digests)
                if e.path not in files:
                    files[e.path] = stack.enter_context(folder.open(e.path))
                return read_tensor(files[e.path], e, digests)
            except TensorFileError as ex:
                raise ModelFolderError(str(ex)) from ex

        def step(before: int) -> None:  # what one step converted lived beside the weights
            nonlocal transient
            transient = max(transient, weights.converted_bytes - before)

        n0 = weights.converted_bytes
        embed = weights.table(read(f"{prefix}{layout.embedding}"))
        step(n0)
        n0 = weights.converted_bytes
        norm = layout.final_norm.tensors(c.hidden_size)
        final = Norm.build(
            layout.final_norm, {n: read(f"{prefix}{n}") for n in norm}, weights, c.norm_eps
        )
        extra = {n: read(f"{prefix}{n}") for n in fam.model_tensors(config.layer, c)}
        blocks = []
        for i in range(c.num_layers):
            p = _layer_prefix(layout, prefix, i)
            raw = {n: read(f"{p}{n}") for n in fam.layer_tensors(config.layer, c, i)}
            blocks.append(fam.build_block(config.layer, c, raw, weights, i, extra))
            del raw
            step(n0)
            n0 = weights.converted_bytes
    return embed, final, blocks, transient


def _rebuild(
    config: FlaConfig,
    entries: Mapping[str, TensorEntry],
    prefix: str,
    folder: FolderLocation,
    source: str,
    digests: Mapping[str, str],
    weights: Weights,
) -> tuple[Any, list[Block], Norm]:
    """The model built again through another factory (a device's, `device.DeviceWeights`)
    from the folder's tensors, refused if any changed since the load."""
    seen: dict[str, str] = {}
    embed, final, blocks, _ = _read_model(config, entries, prefix, weights, folder, seen)
    changed = sorted(n for n in seen if seen[n] != digests.get(n))
    if changed:
        msg = (
            f"{source}: tensor {changed[0]!r} changed since the model was loaded (its bytes "
            "differ): load the model again"
        )
        raise ModelFolderError(msg)
    return embed, blocks, final


def _build(
    config: FlaConfig,
    entries: Mapping[str, TensorEntry],
    want: Mapping[str, tuple[int, ...]],
    prefix: str,
    weights: Weights,
    source: str,
    folder: FolderLocation,
) -> tuple[FlaModel, LoadReport]:
    c: CommonConfig = config.common
    digests: dict[str, str] = {}
    embed, final, blocks, transient = _read_model(config, entries, prefix, weights, folder, digests)
    model = FlaModel(
        config,
        embed,
        blocks,
        final,
        fingerprint=_fingerprint(config, entries, want, prefix, digests),
        source=source,
        compute_mode=weights.mode,
        rebuild=functools.partial(_rebuild, config, entries, prefix, folder, source, digests),
    )
    used = [entries[n] for n in want]
    report = LoadReport(
        source=source,
        family=c.family,
        parameters=sum(e.size for e in used),
        files=len({e.path for e in used}),
        disk_bytes=sum(e.nbytes for e in used),
        disk_dtypes=tuple(sorted({e.dtype for e in used})),
        held_bytes=model.held_bytes(),
        compute_dtype=weights.mode,
        transient_bytes=transient,
        peak_rss_bytes=_peak_rss(),
        seconds=0.0,
        mapped_bytes=sum(int(a.nbytes) for a in model.held_arrays() if is_mapped(a)),
        products=weights.products,
    )
    return model, report


def _fingerprint(
    config: FlaConfig,
    entries: Mapping[str, TensorEntry],
    want: Mapping[str, tuple[int, ...]],
    prefix: str,
    digests: Mapping[str, str],
) -> str:
    """sha256 over the architecture (config.describe(), canonical JSON) and each used tensor's
    name, stored dtype, shape and bytes (names without the folder's prefix, in sorted order)."""
    h = hashlib.sha256(_FINGERPRINT_TAG)
    h.update(json.dumps(config.describe(), sort_keys=True, separators=(",", ":")).encode())
    for name in sorted(want, key=lambda n: n.removeprefix(prefix)):
        e = entries[name]
        line = f"\n{name.removeprefix(prefix)}:{e.dtype}:{list(e.shape)}:{digests[name]}"
        h.update(line.encode())
    return h.hexdigest()
