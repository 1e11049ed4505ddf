"""Page-fenced host buffers for the kernels that run on the CPU.

A buffer is mapped on its own: a large unmapped-access (PROT_NONE) region before and after it,
so that a store past either end faults at once instead of landing in the harness's heap, and
the pages themselves can be made read-only, so that a kernel that writes an input, even one
that restores it before returning, faults on the first write. Between the data and the fences
sit small bands of a known byte (the caller checks them): a store a few elements out of bounds
is then a wrong result that says where, not a crash.

Linux (and other POSIX systems with MAP_NORESERVE): the fences cost address space, not memory.
"""

from __future__ import annotations

import ctypes
import mmap
import weakref

PAGE = mmap.PAGESIZE
FENCE_BYTES = 64 * 2**20  # each side: a store this far past a buffer still faults
BAND_BYTES = 64           # checked bands inside the fences; keeps the data 64-byte aligned

_PROT_NONE, _PROT_READ, _PROT_RW = 0, mmap.PROT_READ, mmap.PROT_READ | mmap.PROT_WRITE
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class FencedBuffer:
    """`nbytes` of memory at `BAND_BYTES` into `raw` (a writable byte array over the open
    pages), fenced on both sides. `read_only()` makes the open pages read-only for good."""

    def __init__(self, nbytes: int):
        self.open_bytes = _round_up(BAND_BYTES + nbytes + BAND_BYTES, PAGE)
        self.total = FENCE_BYTES + self.open_bytes + FENCE_BYTES
        addr = _libc.mmap(None, self.total, _PROT_NONE,
                          mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
        if addr is None or addr == _MAP_FAILED:
            raise MemoryError(f"mmap of a fenced buffer of {nbytes} bytes failed (errno {ctypes.get_errno()})")
        self.base = addr
        self.start = addr + FENCE_BYTES
        self._protect(_PROT_RW)
        self.raw = (ctypes.c_uint8 * self.open_bytes).from_address(self.start)
        # Unmapped when the last tensor over it goes (torch keeps `raw` alive while it is viewed).
        weakref.finalize(self.raw, _libc.munmap, ctypes.c_void_p(addr), ctypes.c_size_t(self.total))

    def _protect(self, prot: int) -> None:
        if _libc.mprotect(ctypes.c_void_p(self.start), ctypes.c_size_t(self.open_bytes), prot) != 0:
            raise OSError(ctypes.get_errno(), "mprotect of a fenced buffer failed")

    def read_only(self) -> None:
        self._protect(_PROT_READ)
