"""precsearch.utils.host_heap: with glibc's mmap threshold fixed, host memory a process frees leaves it.

Checked in fresh processes (the setting is the process's): tensors of a few MiB freed behind a small live block
stay resident under glibc's dynamic threshold and leave with it fixed.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from precsearch.utils import host_heap
from precsearch.utils.host_heap import return_freed_blocks

FREE_THEM = """
import sys
import torch
from precsearch.utils import host_heap
from precsearch.utils.host_heap import return_freed_blocks
if sys.argv[1] == "fixed":
    assert return_freed_blocks()
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
big = torch.ones(4 * 2**20)  # 16 MiB, mapped: freeing it raises the dynamic threshold to 16 MiB
del big
before = rss()
blocks, small = [], []
for _ in range(20):
    blocks.append(torch.ones(2**20))  # 4 MiB each
    small.append(torch.ones(2**16))  # a live 256 KiB block after each (from the heap top, not a free list)
del blocks
print((rss() - before) / 2**20)
"""


def _left_resident(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", FREE_THEM, mode], check=True, capture_output=True, text=True)
    return float(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and /proc")
def test_freed_tensors_leave_the_process_with_the_threshold_fixed():
    dynamic, fixed = _left_resident("dynamic"), _left_resident("fixed")
    assert dynamic > 60  # 80 MiB freed, still resident
    assert fixed < 15  # the 5 MiB of live blocks


def test_a_threshold_below_one_byte_is_refused():
    with pytest.raises(ValueError, match="threshold must be at least 1 byte, got 0"):
        return_freed_blocks(0)


def test_a_span_sets_the_threshold_and_leaves_it_at_the_dynamic_ceiling(monkeypatch):
    """The outermost span sets the threshold and, when it ends (even by an exception), fixes it at 32 MiB and trims
    the heaps; a span inside it changes nothing; a span not enabled changes nothing."""
    calls = []
    monkeypatch.setattr(host_heap, "return_freed_blocks",
                        lambda threshold=host_heap.THRESHOLD: calls.append(threshold) or True)
    monkeypatch.setattr(host_heap, "trim", lambda: calls.append("trim") or True)
    with host_heap.freed_memory_returned(False) as done:
        assert done is False
    assert calls == []
    with pytest.raises(RuntimeError):
        with host_heap.freed_memory_returned() as outer:
            with host_heap.freed_memory_returned() as inner:
                assert outer and inner and calls == [2**20]
            assert calls == [2**20]
            raise RuntimeError("the reading failed")
    assert calls == [2**20, 32 * 2**20, "trim"]


TRIM_THEM = """
import torch
from precsearch.utils.host_heap import return_freed_blocks, trim
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
assert return_freed_blocks()  # 1 MiB: the 512 KiB blocks below come from the heap
before = rss()
blocks = [torch.ones(2**17) for _ in range(100)]  # 50 MiB
last = torch.ones(2**17)  # live, above them
del blocks
kept = rss() - before
assert trim()
print(kept / 2**20, (rss() - before) / 2**20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and /proc")
def test_trim_gives_the_heaps_free_blocks_back():
    out = subprocess.run([sys.executable, "-c", TRIM_THEM], check=True, capture_output=True, text=True)
    kept, trimmed = map(float, out.stdout.split())
    assert kept > 40 and trimmed < 5
