"""Units the series does not touch, compiled as CMake unity sources in the ``compile`` step.

Linking ``libggml-cuda`` needs every CUDA unit of the target, though the
series touches one or two, and linking a program needs every C and C++ unit
of ggml, libllama and common.  Each unit's own code is small next to the
headers it shares with the others (``common.cuh``, ``mmq.cuh``, CCCL; the
standard library and nlohmann's ``json.hpp`` in common): with the
compile-only flags one mmq template instance takes about 19 s alone, four of
them in one translation unit about 31 s, and a small CUDA unit about 6 s of
which nearly all is headers.  So the step compiles the units it does not
select (harness.stages.building.cuda_compile.plan) in groups, by CMake's
``UNITY_BUILD_MODE GROUP`` (CMake >= 3.31 for CUDA), and every unit it
selects alone, exactly as without grouping, with its own diagnostics.

The rule (:func:`unity_groups`): units of one target, one language and the
same compile flags are grouped (a unit with flags of its own never shares a
translation unit with others), template instances
(``template-instances/<family>-instance-*.cu``) next to those of their
family; each group holds at most :data:`GROUP_SIZE` units, and two units
share a group only when :func:`clashes` finds no name both define at file
scope and no header without an include guard that defines code and that both
include (such a header, included twice in one translation unit, redefines its
functions).  A unit that explicitly specialises a template it does not itself
declare (:func:`specialises_foreign_template`) is left alone: a unit before
it in a group may already have instantiated that template, which C++ forbids.
Targets that upstream already builds as unity sources (libllama's models) and
sources generated into the build directory are left as they are.  The rule
reads the sources only; what it lets through, the compiler checks, and a
group that fails to compile is dissolved and its units compiled alone
(harness.stages.building.cuda_compile.compile_tree), so a wrong guess costs time, never a
false failure.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

#: Most units in one group.  Measured with the compile-only flags (docs/platforms.md, "CUDA
#: compiled without a GPU"): a group's shared headers cost about what one unit costs alone, each further unit a
#: fraction of that; bigger groups cut less and leave one of the two jobs of a 2-core machine idle
#: while the last group compiles.
GROUP_SIZE = 8

#: The CMake code the configure includes after ggml's ``project()`` (``CMAKE_PROJECT_ggml_INCLUDE``);
#: it applies the groups file named by ``HARNESS_UNITY_GROUPS`` at the end of the top-level directory,
#: when every target exists.
CMAKE_HOOK = Path(__file__).resolve().parent / "unity.cmake"

#: CMake's name of a unit's language, by source suffix; the suffix of its unity source
#: (``unity_<group>_<suffix>.<suffix>``) is :data:`UNITY_SUFFIX`.
LANGUAGE = {".c": "C", ".cc": "CXX", ".cpp": "CXX", ".cxx": "CXX", ".cu": "CUDA"}
UNITY_SUFFIX = {"C": "c", "CXX": "cxx", "CUDA": "cu"}
_UNITY_OBJECT = re.compile(r"/Unity/unity_(?P<group>.+)_(?P<suffix>" + "|".join(UNITY_SUFFIX.values()) +
                           r")\.(?P=suffix)\.o$")

_FAMILY = re.compile(r"^(?P<family>.+?)-instance-")
_GUARD = re.compile(r"^\s*(?:#\s*pragma\s+once|#\s*ifndef\s+(\w+)\s*\n\s*#\s*define\s+\1\b)", re.M)
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_ATTRIBUTES = re.compile(r"\b(?:__\w+__|alignas)\s*\([^()]*\)")
#: An ``#include`` line; group 1 is the name between the quotes or angle brackets.
INCLUDE_LINE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^">\n]+)[">]', re.M)
_DEFINE = re.compile(r"^#\s*define\s+(\w+)", re.M)


@dataclass(frozen=True)
class Member:
    """A unit that may be grouped: ``source`` (absolute path), its ``target`` and ``object``
    (relative to the build directory, as compile_commands.json names it), and ``flags``: its
    compile command without the source, object and dependency-file arguments (units share a
    group only with units of equal flags; ``""`` where not known)."""

    source: str
    target: str
    output: str
    flags: str = ""

    @property
    def language(self) -> str:
        """CMake's language of the unit (:data:`LANGUAGE`); ``""`` for a suffix it does not name."""
        return LANGUAGE.get(Path(self.source).suffix, "")


def family(source: str) -> str:
    """The family of a unit: ``<family>`` for ``template-instances/<family>-instance-*.cu``,
    else ``""`` (the target's other units, grouped after the families)."""
    path = Path(source)
    m = _FAMILY.match(path.name)
    return m.group("family") if path.parent.name == "template-instances" and m else ""


@functools.lru_cache(maxsize=None)
def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _text(path: str) -> str:
    return _COMMENTS.sub(" ", _read(path))


def file_scope_names(text: str) -> set[str]:
    """Names a source (comments removed) defines at file scope, over-approximated.

    Upstream's style starts every file-scope definition at column 0: for each such line that is
    not a preprocessor line, a closing brace, a namespace or ``extern "C"`` line, a declaration
    or macro call ending in ``;`` (explicit instantiations and ``DECL_..._CASE(...)`` lines, which
    never clash), the identifier before the first ``(``, ``[``, ``=``, ``{`` or ``:`` is taken
    (attributes such as ``__launch_bounds__(...)`` dropped first, and names of the ``__x__`` form
    never taken).  ``#define`` names count too.
    ``using X =`` and ``typedef`` lines name their alias.
    """
    names = set(_DEFINE.findall(text))
    for raw in text.splitlines():
        if not raw or raw[0] in " \t#}{)" or raw.startswith(("namespace", "extern \"C\"", "template")):
            continue
        line = _ATTRIBUTES.sub(" ", raw).rstrip()
        if m := re.match(r"using\s+(\w+)\s*=", line):
            names.add(m.group(1))
            continue
        if line.startswith("typedef"):
            if m := re.search(r"(\w+)\s*(?:\[[^\]]*\])?\s*;$", line):
                names.add(m.group(1))
            continue
        if line.endswith(";") and "=" not in line:
            continue
        cut = re.search(r"[(\[={]|:(?!:)", line)
        if cut is None:
            continue
        m = re.search(r"([A-Za-z_]\w*)\s*(?:<[^<>]*>)?\s*$", line[:cut.start()])
        if m and m.group(1) not in ("operator", "return", "if", "for", "while", "switch") and \
                not re.fullmatch(r"__\w+__", m.group(1)):
            names.add(m.group(1))
    return names


def unguarded_headers(source: str, include_dirs: Iterable[str]) -> set[str]:
    """Headers without ``#pragma once`` or an ``#ifndef`` guard that define code (hold a ``{``)
    which ``source`` includes directly or through other such unguarded headers.

    A guarded header's text enters a translation unit once however often it is included, and so
    does everything it includes; only a chain of unguarded headers brings the same code in twice.
    Includes are looked up beside the includer, then in ``include_dirs`` (the ``-I`` directories;
    system headers are not followed).
    """
    dirs = list(include_dirs)
    found: set[str] = set()
    seen: set[str] = set()
    pending = [source]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in INCLUDE_LINE.findall(_read(path)):
            for d in (os.path.dirname(path), *dirs):
                cand = os.path.normpath(os.path.join(d, name))
                if os.path.isfile(cand):
                    text = _COMMENTS.sub(" ", _read(cand))
                    if not _GUARD.search(text):
                        pending.append(cand)
                        if "{" in text:
                            found.add(cand)
                    break
    return found


_SPECIALISATION = re.compile(r"^template\s*<\s*>\s*(?:[^;{(<]*?[\s*&])?(?P<name>[A-Za-z_][\w:]*)\s*[<(]", re.M)


def specialises_foreign_template(text: str) -> bool:
    """Whether a source (comments removed) explicitly specialises, at column 0, a template it does
    not declare itself: a qualified name (``template <> T json::get<T>()``) or one with no
    ``template <...>`` declaration of its own in the text.  Such a unit is never grouped: a unit
    before it in the group may have instantiated the template, and a specialisation after an
    instantiation is an error."""
    for m in _SPECIALISATION.finditer(text):
        name = m.group("name")
        if "::" in name:
            return True
        if not re.search(r"template\s*<\s*[^>\s][^>]*>\s*[^;{]*?\b" + re.escape(name) + r"\b", text):
            return True
    return False


def clashes(a: tuple[set[str], set[str]], b: tuple[set[str], set[str]]) -> bool:
    """Whether two units, each given as (file-scope names of the unit and of the unguarded headers
    it brings in, those unguarded headers that define code), may not share a translation unit:
    a name in common or such a header in common."""
    return bool(a[0] & b[0]) or bool(a[1] & b[1])


def unity_groups(members: Iterable[Member], include_dirs: Mapping[str, list[str]]) -> dict[str, list[Member]]:
    """Group name -> units (each group >= 2 units of one target, language and flags, none
    clashing with another).

    ``include_dirs``: target -> the include directories of its units (for
    :func:`unguarded_headers`).  Units are taken in order of target, :func:`family` and path, so
    that instances of one family, which share their heavy header, fill groups together; each
    joins the first group of its target, language and flags that has fewer than
    :data:`GROUP_SIZE` units and no unit it clashes with (:func:`clashes`), else opens one.
    Instances whose family header has no include guard (the flash-attention ones) clash with
    each other and so open a group each, which units of other families then fill.  Units of a
    language CMake does not group (:data:`LANGUAGE`) and those of
    :func:`specialises_foreign_template` are left out.  A group left with one unit is dropped
    (the unit compiles alone).  Names: ``<target>-<n>``, ``n`` from 1 across the target's
    languages.
    """
    _read.cache_clear()  # sources may have changed since the last call
    ordered = sorted(members, key=lambda m: (m.target, m.language, family(m.source) or "~", m.source))
    groups: dict[str, list[tuple[Member, tuple[set[str], set[str]]]]] = {}
    homes: dict[tuple[str, str, str], list[str]] = {}
    count: dict[str, int] = {}
    for m in ordered:
        if not m.language or specialises_foreign_template(_text(m.source)):
            continue
        headers = unguarded_headers(m.source, include_dirs.get(m.target, []))
        names = set().union(file_scope_names(_text(m.source)), *(file_scope_names(_text(h)) for h in headers))
        facts = (names, headers)
        key = (m.target, m.language, m.flags)
        home = next((name for name in homes.get(key, ())
                     if len(groups[name]) < GROUP_SIZE and not any(clashes(facts, f) for _, f in groups[name])),
                    None)
        if home is None:
            count[m.target] = count.get(m.target, 0) + 1
            home = f"{m.target}-{count[m.target]}"
            homes.setdefault(key, []).append(home)
            groups[home] = []
        groups[home].append((m, facts))
    return {name: [m for m, _ in ms] for name, ms in groups.items() if len(ms) > 1}


def write_groups_file(path: Path, groups: Mapping[str, list[Member]]) -> None:
    """Write the CMake code that :data:`CMAKE_HOOK` includes: ``UNITY_BUILD`` in ``GROUP`` mode on
    each target with a group, and ``UNITY_GROUP`` on each grouped source (absolute paths; the other
    sources of the target get none and compile alone).  Raises ValueError for a path CMake could
    not take quoted (``"``, ``\\``, ``$`` or ``;``)."""
    lines = ["# Written by the compile step (harness/stages/building/unity.py): the units the series\n"
             "# does not touch, grouped.\n"]
    for target in sorted({m.target for ms in groups.values() for m in ms}):
        lines.append(f'set_target_properties("{target}" PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)\n')
    for name, ms in sorted(groups.items()):
        for m in ms:
            if any(c in m.source + name for c in '"\\$;'):
                raise ValueError(f"{m.source}: a path with one of \" \\ $ ; cannot be grouped")
        sources = " ".join(f'"{m.source}"' for m in ms)
        lines.append(f'set_source_files_properties({sources} TARGET_DIRECTORY "{ms[0].target}" '
                     f'PROPERTIES UNITY_GROUP "{name}")\n')
    path.write_text("".join(lines))


def unity_object(output: str) -> str | None:
    """The group name of a unity object path (``.../Unity/unity_<group>_<suffix>.<suffix>.o``,
    :data:`UNITY_SUFFIX`), else None."""
    m = _UNITY_OBJECT.search(output)
    return m.group("group") if m else None
