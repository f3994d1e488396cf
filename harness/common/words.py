"""Numbers as people read them in logs and reports: a byte count with its binary unit, a signal by its name."""

from __future__ import annotations

import signal


def size_text(n: float) -> str:
    """``n`` bytes in the largest binary unit it reaches, two decimals (``1.50 GiB``, ``12.00 KiB``); below 1 KiB
    the whole number of bytes (``512 B``).  Negative sizes (a change) keep their sign."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def signal_name(number: int) -> str:
    """The name of signal ``number`` on this host (``SIGSEGV`` for 11 on Linux), ``signal <number>`` for a number
    it does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
