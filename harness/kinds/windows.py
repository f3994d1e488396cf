"""``os: windows``: executables end in ``.exe``, standard output writes ``\\r\\n``; on a Linux host, cross-built
with MinGW-w64 and run under Wine (matrix.yaml's ``cross`` section names them)."""

from __future__ import annotations

from .shape import HostTool, OsKind

WINDOWS = OsKind(name="windows", executable_suffix=".exe", crlf_stdout=True, sys_platform="win",
                 runner_label="windows", shell="pwsh", max_path=260)  # MAX_PATH of the Windows API

#: Wine, the emulator matrix.yaml's ``cross.emulator: wine`` names.  Debian's wine64 package installs the loader
#: as /usr/lib/wine/wine64 and puts no wrapper on PATH unless the ``wine`` package is there.
WINE = HostTool("the emulator wine", ("wine64", "wine"), "wine64", ("/usr/lib/wine/wine64",))
