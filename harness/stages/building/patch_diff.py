"""What a patch's diff adds, read with unidiff: the files it creates and the CMake targets its added lines define.

The upstream forecast (harness.upstream.forecast) and bisect (harness.bisect.points) both ask it which patch
brings a test or a target of its own.
"""

from __future__ import annotations

import re

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from .patches import Patch


def diff_files(patch: Patch) -> list:
    """The patch's files as unidiff reads them (PatchedFile objects); [] when unidiff cannot read the diff."""
    try:
        return list(PatchSet(patch.path.read_text(encoding="utf-8", errors="replace")))
    except UnidiffParseError:
        return []


def added_files(patch: Patch) -> list[str]:
    """The paths ``patch`` creates (``new file`` entries of its diff); [] when unidiff cannot read it."""
    return sorted(f.path for f in diff_files(patch) if f.is_added_file)


#: A target a CMake line defines: ``add_executable(NAME ...)``, or the ``NAME`` argument of upstream's
#: test helpers (``llama_build_and_test(src.cpp ... NAME test-x LABEL ...)``, tests/CMakeLists.txt).
CMAKE_TARGET = re.compile(r"\badd_executable\(\s*([A-Za-z0-9_.+-]+)|\bNAME\s+([A-Za-z0-9_.+-]+)")


def defined_targets(patch: Patch) -> dict[str, str]:
    """Target -> the CMake file whose lines added by ``patch`` define it (:data:`CMAKE_TARGET`, in
    ``CMakeLists.txt`` and ``*.cmake`` files); {} when unidiff cannot read the patch."""
    out: dict[str, str] = {}
    for f in diff_files(patch):
        if not (f.path.endswith("CMakeLists.txt") or f.path.endswith(".cmake")):
            continue
        for hunk in f:
            for line in hunk:
                if line.is_added:
                    for m in CMAKE_TARGET.finditer(line.value):
                        out.setdefault(m.group(1) or m.group(2), f.path)
    return out
