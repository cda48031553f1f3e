"""Whole lines on stdout for one process of a multi-process job.

A job's processes write through pipes (`podkit launch`, srun, a pod's log), where a Python
child runs unbuffered (PYTHONUNBUFFERED=1, so its lines appear as printed). Unbuffered, a
print() is several writes (its text, then the newline), and Python's start-up also makes C's
stdout unbuffered, so a C++ library writes each `<<` piece apart: gloo's connection line
("[Gloo] Rank " << rank << " is connected to " ...) is eight writes, from two threads. Pieces of
gloo's line then land inside a print() and a print() inside gloo's line, and no reader of the
pipe can tell a rank number split off its line from the user's text ("0process 0 of 2").

`whole_lines()` makes each stream write whole lines: Python's stdout line-buffered (a print()
is one write, text and newline), and C's stdout line-buffered (C and C++ text reaches the pipe
only up to a newline, so a write of it holds only C's text). A line on the pipe is then
either Python's or C's; gloo's two threads can still mix their pieces in C's buffer, but only
with each other (`podkit launch` drops such lines whole, launch/supervisor.py).

`connect()` calls it before joining a multi-process job (before gloo starts), when stdout is
not a terminal (a terminal is line-buffered already).
"""

from __future__ import annotations

import ctypes
import sys

_IOLBF = 1  # <stdio.h>: line buffered, on glibc and musl
_BUFFER_BYTES = 1 << 16
_done = False


def whole_lines() -> bool:
    """Line-buffer Python's and C's stdout (see the module docstring); idempotent. False where
    that is not possible here (no C library with `stdout`, a replaced sys.stdout)."""
    global _done
    if _done:
        return True
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is None:  # replaced by something that is not a TextIOWrapper
        return False
    try:
        libc = ctypes.CDLL(None)
        c_stdout = ctypes.c_void_p.in_dll(libc, "stdout")
    except (OSError, ValueError):  # no C stdio to reach (not glibc/musl)
        return False
    sys.stdout.flush()
    reconfigure(line_buffering=True, write_through=False)
    libc.fflush(c_stdout)
    # setvbuf needs a buffer of its own: given none, glibc keeps an unbuffered stream's
    # one-byte buffer and still writes piece by piece. malloc'd and never freed, since C's
    # exit() flushes stdout after Python has freed its objects.
    libc.malloc.restype = ctypes.c_void_p
    buffer = libc.malloc(_BUFFER_BYTES)
    if not buffer or libc.setvbuf(c_stdout, ctypes.c_void_p(buffer), _IOLBF,
                                  ctypes.c_size_t(_BUFFER_BYTES)) != 0:
        return False
    _done = True
    return True
