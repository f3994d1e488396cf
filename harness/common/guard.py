"""The guard of one harness process: ends the process groups it left running when it dies (standard library only).

harness.common.proc starts it once per harness process, in a session of its own, with a pipe on its stdin that
only the harness holds.  The harness writes ``+<pgid>`` when it starts a child (which leads its own process
group) and ``-<pgid>`` when it has waited for it.  End of file on stdin means the harness is gone (it ended, or
was killed with SIGKILL, which no handler sees): every group still listed gets SIGTERM (ninja stops its compilers,
ctest its tests are in the same group), then SIGKILL after :data:`GRACE_S` seconds, and the guard exits.
A group whose members are all gone is skipped; nothing else is signalled.

Run as a script (``python guard.py``), so it needs nothing but the standard library.
"""

from __future__ import annotations

import os
import signal
import sys
import time

#: Seconds between SIGTERM and SIGKILL: short, so that nothing a killed harness started runs 5 s after it.
GRACE_S = 2.0


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_groups(groups: set[int], grace_s: float = GRACE_S) -> None:
    """SIGTERM to each process group of ``groups`` still alive, then SIGKILL to those alive after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in [g for g in groups if _alive(g)]:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace_s
        while any(_alive(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.05)


def main() -> int:
    """Read ``+pgid``/``-pgid`` lines until end of file, then end the groups still listed; returns 0."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a terminal's Ctrl-C is the harness's to handle; the guard waits
    groups: set[int] = set()
    for line in sys.stdin.buffer:
        text = line.strip().decode("ascii", "replace")
        if text[1:].isdigit():
            (groups.add if text[0] == "+" else groups.discard)(int(text[1:]))
    end_groups({g for g in groups if g > 1 and g != os.getpgrp()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
