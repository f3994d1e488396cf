"""Platforms of another OS built with a cross compiler and run through an emulator.

A platform with a ``cross`` section in matrix.yaml (``windows-x86_64-cpu``) is
built on a Linux host with the CMake toolchain file it names (MinGW-w64) and
its executables run under the emulator it names (Wine).  This module finds
those tools, says which Debian package is missing when one is not there, and
gives the emulator as an argument-list prefix plus the environment it needs;
callers put the prefix in front of an executable's argv (never into a shell
string) and pass it to CMake as ``CMAKE_CROSSCOMPILING_EMULATOR``, so ctest
runs the test executables through it too.  Which tools a cross platform needs, and
the Debian packages that bring them, is harness.matrix.host_tools's.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ...matrix.config import Platform
from ...matrix.host_tools import find_emulator_program, find_program, missing_run_tools


#: Seconds ``wineboot --init`` may take to create a prefix (about 10-30 s on 2 cores).
WINEBOOT_TIMEOUT_S = 300

#: Seconds the prefix's wineserver stays up after its last program exits (``wineserver -p``).
#: Debian's ``wineserver`` wrapper starts the server with ``-p0``: it exits the moment its last
#: client does, and a program started at that moment fails with "wine client error:0: recvmsg:
#: Connection reset by peer" (seen once in a CI run, on a llama-completion run of the Windows base).
#: A server that outlives its clients by this long takes every program the harness starts one
#: after another; :meth:`Emulator.ready` starts it again before each use where it has gone.
WINESERVER_PERSIST_S = 60


@dataclass(frozen=True)
class Emulator:
    """An emulator ready to run: ``argv`` goes in front of an executable's argv, ``env`` on top of
    os.environ; ``keep_alive``: a command that starts the emulator's server for the programs that
    follow, where there is one (Wine's wineserver), and ``warm_up``: a program run through the
    emulator after a new server started; both run by :meth:`ready`."""

    kind: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    keep_alive: tuple[str, ...] = ()
    warm_up: tuple[str, ...] = ()

    def wrap(self, argv: list[str] | tuple[str, ...]) -> list[str]:
        """``argv`` prefixed with the emulator's own argv."""
        return [*self.argv, *argv]

    def ready(self) -> None:
        """Run ``keep_alive`` (a few milliseconds): for Wine, start the prefix's wineserver with
        WINESERVER_PERSIST_S where none is running (where one is, the new one exits at once with
        status 2).  Call it before starting programs.

        Where it started a server (status 0), ``warm_up`` runs next, with every standard stream on
        /dev/null: the first program of a Wine session starts Wine's own processes (services.exe,
        winedevice.exe), which live as long as the server and keep the standard streams of the
        program that started them; started by a program whose output the harness reads, they would
        hold its pipes open, and the read would wait until the server exits.  Output and status are
        not used otherwise: a server that could not be started leaves the programs to start their
        own, as without it."""
        if not self.keep_alive:
            return
        quiet: dict[str, Any] = {"env": {**os.environ, **self.env}, "stdin": subprocess.DEVNULL,
                                 "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "check": False}  # subprocess.run's keywords
        try:
            if subprocess.run(self.keep_alive, timeout=30, **quiet).returncode == 0 and self.warm_up:
                subprocess.run(self.wrap(self.warm_up), timeout=WINEBOOT_TIMEOUT_S, **quiet)
        except (OSError, subprocess.TimeoutExpired):
            pass


#: The MinGW-w64 runtime DLLs a program may need: OpenMP and those it depends on.
RUNTIME_DLLS = ("libgomp-1.dll", "libwinpthread-1.dll", "libgcc_s_seh-1.dll", "libstdc++-6.dll")


def runtime_dll_dirs(compiler: str) -> tuple[Path, ...]:
    """The directories of the cross compiler's runtime DLLs (RUNTIME_DLLS), each once, in that order.

    Executables are linked statically, but ggml's CPU backend links OpenMP
    through the import library CMake's FindOpenMP names, so it needs
    libgomp-1.dll, which needs libwinpthread-1.dll; Wine finds them through
    WINEPATH.  Asked from the compiler (``-print-file-name``), so it holds for
    any MinGW-w64 installation; DLLs it does not know are left out.
    """
    dirs: list[Path] = []
    for name in RUNTIME_DLLS:
        try:
            out = subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True, text=True,
                                 timeout=60).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            continue
        path = Path(out)
        if path.is_absolute() and path.is_file() and path.resolve().parent not in dirs:
            dirs.append(path.resolve().parent)
    return tuple(dirs)


def wine_env(prefix: Path, dll_dirs: tuple[Path, ...] = ()) -> dict[str, str]:
    """The environment Wine runs with: its own prefix under the harness's cache, no debug channels,
    and ``dll_dirs`` searched for DLLs (WINEPATH, Unix paths joined with ``;``)."""
    env = {"WINEPREFIX": str(prefix), "WINEDEBUG": "-all", "WINEDLLOVERRIDES": "mscoree,mshtml="}
    if dll_dirs:
        env["WINEPATH"] = ";".join(str(d) for d in dll_dirs)
    return env


def prepare_wine(program: str, prefix: Path, dll_dirs: tuple[Path, ...] = ()) -> Emulator:
    """Create the Wine prefix ``prefix`` once (``wineboot --init``), start its wineserver
    (:meth:`Emulator.ready`) and return the emulator using it.

    A prefix whose ``system.reg`` exists is used as it is.  The Mono and Gecko
    installers are disabled (WINEDLLOVERRIDES), so no download is attempted.
    ``dll_dirs``: directories of DLLs the programs need (WINEPATH).
    Raises RuntimeError naming the prefix and wineboot's exit status when the
    prefix could not be created within WINEBOOT_TIMEOUT_S seconds.
    """
    env = wine_env(prefix, dll_dirs)
    server = Path(program).with_name("wineserver")
    if not (prefix / "system.reg").is_file():
        prefix.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        try:
            proc = subprocess.run([program, "wineboot", "--init"], env={**os.environ, **env},
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=WINEBOOT_TIMEOUT_S)
            rc: int | str = proc.returncode
        except subprocess.TimeoutExpired:
            rc = f"timeout after {WINEBOOT_TIMEOUT_S} s"
        # wineboot returns before wineserver has written the registry: wait for it
        if server.exists():
            subprocess.run([str(server), "--wait"], env={**os.environ, **env}, capture_output=True,
                           timeout=WINEBOOT_TIMEOUT_S)
        if not (prefix / "system.reg").is_file():
            raise RuntimeError(f"wineboot --init did not create the Wine prefix {prefix} "
                               f"(exit {rc}, {time.monotonic() - start:.0f} s)")
    keep_alive = (str(server), f"-p{WINESERVER_PERSIST_S}") if server.exists() else ()
    emulator = Emulator("wine", (program,), env, keep_alive, ("cmd", "/c", "exit") if keep_alive else ())
    emulator.ready()
    return emulator


def emulator_for(p: Platform, cache: Path) -> Emulator | None:
    """The emulator that runs ``p``'s executables on this host, prepared; None when ``p`` needs none.

    Raises RuntimeError when the emulator is missing (naming its Debian
    package) or cannot be prepared.
    """
    if p.cross is None:
        return None
    why = missing_run_tools(p.cross)
    if why:
        raise RuntimeError(why)
    program = find_emulator_program(p.cross.emulator)
    assert program is not None
    if p.cross.emulator == "wine":
        compiler = find_program(p.cross.compiler)
        return prepare_wine(program, cache / "wine" / p.name, runtime_dll_dirs(compiler) if compiler else ())
    raise RuntimeError(f"unknown emulator {p.cross.emulator!r}")
