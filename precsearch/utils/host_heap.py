"""Host memory a process frees goes back to the system: glibc's mmap threshold fixed (the reading on a CPU).

glibc's ``malloc`` serves a block of at least ``M_MMAP_THRESHOLD`` bytes (128 KiB at first) with its own ``mmap``,
unmapped when freed; smaller blocks come from its heaps, where freed memory stays in the process for reuse. The
threshold is dynamic: freeing an mmapped block raises it to that block's size, up to 32 MiB. A CPU probe frees
tensors of a few MiB to tens of MiB all the time (gradients, activations), so after the first the threshold sits
near 32 MiB and those tensors come from the heaps, where they fragment: on the fixed-state reading at SmolLM2's
width on a CPU (2026-12-06) the resident set grew by 100-150 MiB with each backward pass over the same model
while the tensors alive did not, and stayed ~290 MiB above them between trials. :func:`return_freed_blocks`
fixes the threshold (which also ends its dynamic raising), so such tensors are mapped and unmapped and the
resident set follows the tensors alive. It changes where memory comes from, never a value, but each such block
is then faulted in afresh: the reading at that width took 1.4x as long with it. :func:`freed_memory_returned` sets
it for a span (the reading) and leaves it at :data:`AFTER` (the ceiling of the dynamic rule, where a CPU probe's
threshold sits after its first freed activation) for the rest, so the trials' probes keep their heaps' reuse,
and trims the heaps (``malloc_trim``: the small blocks freed in the span, ~100 MiB after that reading's BF16 side).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

#: ``mallopt``'s parameter number for the mmap threshold (glibc's malloc.h).
M_MMAP_THRESHOLD = -3
#: Blocks of this size and larger are mapped (and unmapped when freed): 1 MiB.
THRESHOLD = 2**20
#: The threshold left after :func:`freed_memory_returned`: 32 MiB, glibc's ceiling for its dynamic threshold
#: (``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit systems).
AFTER = 32 * 2**20


def _libc():
    """glibc's functions, or None where the C library is not glibc (or not found)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - both must be there
    except (OSError, AttributeError):  # not glibc (macOS, musl): its own allocator's rules
        return None
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


def trim() -> bool:
    """Give the free memory inside glibc's heaps back to the system (``malloc_trim(0)``: small freed blocks the
    threshold leaves there); True when some was. False where the C library is not glibc."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def return_freed_blocks(threshold: int = THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for the rest of the process (module docstring). True when
    it is set; False where the C library is not glibc or refuses (nothing changes then)."""
    if threshold < 1:
        raise ValueError(f"threshold must be at least 1 byte, got {threshold}")
    libc = _libc()
    if libc is None:
        return False
    done = bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))
    if not done:
        log.debug("mallopt(M_MMAP_THRESHOLD, %d) refused", threshold)
    return done


_open: list[int] = []  # thresholds of the spans now open, outermost first


@contextmanager
def freed_memory_returned(enabled: bool = True, threshold: int = THRESHOLD) -> Iterator[bool]:
    """Within: :func:`return_freed_blocks` at ``threshold``; after: the threshold fixed at :data:`AFTER` and the
    heaps' free memory given back (:func:`trim`). A span inside another leaves both to the outer one. Yields
    whether it is set (False when not ``enabled`` or where the C library is not glibc)."""
    if not enabled or _open:
        yield bool(_open)
        return
    if not return_freed_blocks(threshold):
        yield False
        return
    _open.append(threshold)
    try:
        yield True
    finally:
        _open.pop()
        return_freed_blocks(AFTER)
        trim()
