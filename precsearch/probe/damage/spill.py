"""Tensors the reading keeps on disk (``objectives.damage.keep_states: disk``): written once, read back a slice at a
time, so that nothing is held in memory between trials.

A :class:`SpillFile` is an anonymous temporary file (``tempfile.TemporaryFile``: it has no name in its
directory, and the kernel frees its blocks when it is closed or its process ends, a crash included), tensors
appended to it byte for byte. A :class:`SpilledTensor` is one of them: read back whole (:meth:`~SpilledTensor.load`)
or, flattened, a slice at a time (``t.reshape(-1)[span]``), which is all the compare needs
(:func:`precsearch.probe.damage.compare.compare_unit` takes it in place of a tensor). A :class:`Spilled` mapping
holds a state's weights, moments or one batch's gradients by name; indexing it reads a tensor (or a pair), and
:func:`source` gives the compare the unread one. A tensor read back has the bits written, so a reading from disk is
the reading from memory, to the bit.

Reads and writes go through the page cache, which the kernel may keep or drop (it is not the process's memory;
``mmap`` is not used, as mapped pages would count in the resident set).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Union

import torch
from torch import Tensor


class SpillFile:
    """An anonymous temporary file in ``directory`` (None: ``tempfile.gettempdir()``) tensors are appended to."""

    def __init__(self, directory: str | Path | None = None):
        self.directory = directory
        self._file = tempfile.TemporaryFile(dir=directory)
        self.nbytes = 0  # bytes written so far (the file's size)

    @property
    def closed(self) -> bool:
        return self._file.closed

    def write(self, tensor: Tensor | SpilledTensor, at: SpilledTensor | None = None) -> SpilledTensor:
        """``tensor``'s bytes appended, or written over ``at`` (a tensor of this file, of the same shape and
        dtype); its :class:`SpilledTensor`. A GPU tensor is copied to the host first, a spilled one read."""
        if isinstance(tensor, SpilledTensor):
            tensor = tensor.load()
        if at is not None and (at.file is not self or at.shape != tuple(tensor.shape) or at.dtype != tensor.dtype):
            raise ValueError(f"a tensor of shape {tuple(tensor.shape)} and {tensor.dtype} cannot be written over one "
                             f"of shape {at.shape} and {at.dtype}" + ("" if at.file is self else " in another file"))
        flat = tensor.detach().reshape(-1)
        if flat.device.type != "cpu":
            flat = flat.cpu()
        raw = memoryview(flat.contiguous().view(torch.uint8).numpy())
        offset, done = (self.nbytes if at is None else at.offset), 0
        while done < len(raw):
            done += os.pwrite(self._file.fileno(), raw[done:], offset + done)
        if at is not None:
            return at
        self.nbytes += len(raw)
        return SpilledTensor(self, offset, tuple(tensor.shape), tensor.dtype)

    def read_into(self, out: Tensor, offset: int) -> Tensor:
        """``out`` (contiguous, on the host) filled with the bytes at ``offset``."""
        raw = memoryview(out.reshape(-1).view(torch.uint8).numpy())
        done = 0
        while done < len(raw):
            got = os.preadv(self._file.fileno(), [raw[done:]], offset + done)
            if got == 0:
                raise EOFError(f"spill file: {len(raw) - done} bytes missing at offset {offset + done}")
            done += got
        return out

    def close(self) -> None:
        """Close the file: the kernel frees its blocks (it never had a name to delete)."""
        self._file.close()


class SpilledTensor:
    """A tensor in a :class:`SpillFile`: its shape and dtype, read back on the host.

    ``reshape(-1)`` is the flattened tensor (still on disk), ``flat[a:b]`` reads elements ``a`` to ``b`` of it,
    ``numel()`` and ``device`` (always the CPU) are a tensor's: what the compare asks of its inputs.
    """

    def __init__(self, file: SpillFile, offset: int, shape: tuple[int, ...], dtype: torch.dtype):
        self.file, self.offset, self.shape, self.dtype = file, offset, shape, dtype
        self.device = torch.device("cpu")

    def numel(self) -> int:
        return int(torch.Size(self.shape).numel())

    @property
    def nbytes(self) -> int:
        return self.numel() * self.dtype.itemsize

    def load(self) -> Tensor:
        """The whole tensor, read into a new host tensor."""
        return self.file.read_into(torch.empty(self.shape, dtype=self.dtype), self.offset)

    def reshape(self, *shape) -> SpilledTensor:
        """The flattened tensor (``reshape(-1)``, the only shape asked), still on disk."""
        if shape not in ((-1,), ((-1,),)):
            raise ValueError(f"a spilled tensor is only flattened (reshape(-1)), got reshape{shape}")
        return SpilledTensor(self.file, self.offset, (self.numel(),), self.dtype)

    def __getitem__(self, span: slice) -> Tensor:
        """Elements ``span`` of the flattened tensor (a step-1 slice), read into a new host tensor."""
        start, stop, step = span.indices(self.numel())
        if step != 1 or len(self.shape) != 1:
            raise ValueError(f"a spilled tensor is read by step-1 slices of its flattened form, got {span} of "
                             f"shape {self.shape}")
        out = torch.empty(max(stop - start, 0), dtype=self.dtype)
        return self.file.read_into(out, self.offset + start * self.dtype.itemsize)


Entry = Union[SpilledTensor, tuple[SpilledTensor, ...]]


class Spilled(Mapping):
    """Tensors (or tuples of tensors) on disk by name; ``m[name]`` reads one back (a tuple: each of it)."""

    def __init__(self, entries: dict[str, Entry]):
        self.entries = entries

    def __getitem__(self, name: str) -> Tensor | tuple[Tensor, ...]:
        entry = self.entries[name]
        return tuple(t.load() for t in entry) if isinstance(entry, tuple) else entry.load()

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def nbytes(self) -> int:
        """Bytes of its tensors on disk."""
        return sum(t.nbytes for e in self.entries.values() for t in (e if isinstance(e, tuple) else (e,)))


def write_all(file: SpillFile, tensors: Mapping[str, Tensor | tuple[Tensor, ...]]) -> Spilled:
    """``tensors`` (name -> tensor or tuple of tensors) written to ``file``, one at a time, as a :class:`Spilled`."""
    return Spilled({name: tuple(file.write(x) for x in t) if isinstance(t, tuple) else file.write(t)
                    for name, t in tensors.items()})


_ABSENT = object()


def source(tensors: Mapping, name: str, default=_ABSENT):
    """``tensors[name]`` for the compare: unread where ``tensors`` is :class:`Spilled` (the compare reads it a
    slice at a time), else the tensor itself; ``default`` where the name is absent (without one: KeyError)."""
    entries = tensors.entries if isinstance(tensors, Spilled) else tensors
    if default is _ABSENT:
        return entries[name]
    return entries.get(name, default)


def is_spilled(tensors: Mapping) -> bool:
    """True when ``tensors`` is on disk (holds no memory)."""
    return isinstance(tensors, Spilled)
