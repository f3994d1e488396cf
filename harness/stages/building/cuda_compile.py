"""The ``compile`` step: a CUDA platform compiled, not run, on a machine without a GPU.

Hosted CI machines have no NVIDIA GPU, so a CUDA platform can neither run its
tests nor its comparisons there; it can still be compiled.  This step

1. assembles a CUDA toolkit from PyPI wheels (:data:`PACKAGES`, pinned in
   requirements.txt): the wheels install ``nvcc``, the headers and the
   libraries under ``nvidia/cu13/{bin,include,lib,nvvm}``, while nvcc and
   CMake's FindCUDAToolkit expect ``lib64/`` with unversioned library names
   and ``lib64/stubs/libcuda.so``.  :func:`assemble_toolkit` makes that layout
   of symbolic links under the harness cache directory (one path for every
   work directory and clone, so ccache hits across them), plus a ``libcuda.so`` stub
   compiled from the driver API functions that the wheel's ``cuda.h`` declares
   (PyPI has no driver stub);
2. configures the platform with the matrix's ``compile_only`` CMake options
   (one virtual architecture, device code checked by nvcc's front end only,
   see matrix.yaml) and ``CMAKE_EXPORT_COMPILE_COMMANDS``;
3. computes the translation units to compile (:func:`plan`): every unit of
   ``compile_commands.json`` whose source is a file the series changes (from
   git, base against the series tree) or that includes one: read from
   ninja's dependency log where the unit was built before, otherwise from the
   ``#include`` lines of the tree (:func:`include_closure`, which may take in
   a unit whose include is switched off; after the build ninja's log names
   those, :func:`refine`); plus the platform's targets and test targets and
   every target built from a file the series adds, to be linked;
4. builds those object files and targets with ninja (``-k 0``: every failing
   unit is reported, not only the first) and records which targets linked.

Nothing that is built here is ever run: the device code is not generated
(``-fdevice-syntax-only``) and ``libcuda.so`` is a stub.

Longer than 400 lines: the four steps above share one plan (:class:`Plan`) and one build
directory, and harness.stages.building.compile_cache keys the step by this file's bytes as one unit.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ...common.jobserver import JobBudget
from ...record.json_files import write_json
from ...record.layout import BUILD_FILES, COMPILE_FILES
from .unity import CMAKE_HOOK, INCLUDE_LINE, Member, unity_groups, unity_object, write_groups_file
from ...common.statuses import STEP_FAILED, STEP_PASSED

#: PyPI wheels of the CUDA 13.0 toolkit the step compiles with; nvidia-nvvm holds cicc, which
#: nvidia-cuda-nvcc requires without pinning it.
PACKAGES = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-runtime", "nvidia-cuda-crt",
            "nvidia-cuda-cccl", "nvidia-cublas")
#: Bumped when the toolkit layout changes, so an old one is not reused.
LAYOUT_SCHEME = 2
#: The value every function of the libcuda stub returns: CUDA_ERROR_NO_DEVICE (cuda.h).
STUB_RESULT = 100

_DRIVER_FUNCTION = re.compile(r"\bCUresult\s+(?:CUDAAPI\s+)?(cu[A-Za-z0-9_]+)\s*\(")
_TARGET_DIR = re.compile(r"(?:^|/)CMakeFiles/(?P<target>[^/]+)\.dir/")


class ToolkitMissing(Exception):
    """A wheel of :data:`PACKAGES` is not installed; the message names it (the step's skip reason)."""


@dataclass(frozen=True)
class Toolkit:
    """A CUDA toolkit laid out for nvcc and CMake: ``root`` (bin, include, nvvm, lib64, lib64/stubs),
    its ``nvcc``, the CUDA ``version`` nvcc reports and the wheel ``packages`` (name -> version)."""

    root: Path
    nvcc: Path
    version: str
    packages: Mapping[str, str]

    def cmake_options(self) -> dict[str, str]:
        """The CMake cache options that point a configure at this toolkit.

        ``-rpath-link``: a program linked against libggml-cuda.so needs the libraries that one
        names (libcudart.so.13, libcublas.so.13, libcuda.so.1) found at link time; they are
        searched there, never loaded at run time.
        """
        libs = f"{self.root / 'lib64'}:{self.root / 'lib64' / 'stubs'}"
        return {"CMAKE_CUDA_COMPILER": str(self.nvcc), "CUDAToolkit_ROOT": str(self.root),
                "CMAKE_EXE_LINKER_FLAGS": f"-Wl,-rpath-link,{libs}",
                "CMAKE_SHARED_LINKER_FLAGS": f"-Wl,-rpath-link,{libs}"}


def wheel_versions() -> dict[str, str]:
    """Name -> version of every wheel of :data:`PACKAGES`; raises ToolkitMissing naming those absent."""
    versions, missing = {}, []
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        raise ToolkitMissing(f"needs the PyPI package{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                             "(pip install -r requirements.txt)")
    return versions


def wheel_root() -> Path:
    """The directory the CUDA wheels install into (``.../site-packages/nvidia/cu13``), found from the
    location of nvcc in the nvidia-cuda-nvcc wheel; raises ToolkitMissing when it holds no nvcc."""
    dist = importlib.metadata.distribution("nvidia-cuda-nvcc")
    for f in dist.files or ():
        if f.name == "nvcc" and f.parent.name == "bin":
            return Path(str(dist.locate_file(f))).resolve().parent.parent
    raise ToolkitMissing(f"the PyPI package nvidia-cuda-nvcc {dist.version} has no bin/nvcc")


def driver_functions(cuda_h: Path, cc: str) -> list[str]:
    """The driver API functions ``cuda_h`` declares, as linked (``cuMemAlloc`` is ``cuMemAlloc_v2``).

    The header is run through the C preprocessor ``cc`` so that its ``#define cuX cuX_v2`` renames
    apply; every ``CUresult cu...(`` declaration left is a function of libcuda.  Raises
    RuntimeError when the preprocessor fails or finds none.
    """
    proc = subprocess.run([cc, "-E", "-P", "-x", "c", str(cuda_h)], capture_output=True, text=True, check=False)
    names = sorted(set(_DRIVER_FUNCTION.findall(proc.stdout)))
    if proc.returncode != 0 or not names:
        raise RuntimeError(f"{cc} -E {cuda_h} failed or declared no driver function: {proc.stderr.strip()[:300]}")
    return names


def write_driver_stub(cuda_h: Path, out: Path, cc: str) -> int:
    """Compile ``out`` (``libcuda.so``, soname ``libcuda.so.1``) defining every function of
    :func:`driver_functions`, each returning STUB_RESULT.  Linking only: the stub is never loaded
    by a program that runs.  Returns the number of functions; raises RuntimeError when cc fails."""
    names = driver_functions(cuda_h, cc)
    src = out.with_suffix(".c")
    src.write_text("/* libcuda stub for linking only, generated from " + cuda_h.name + " */\n" +
                   "".join(f"int {n}(void) {{ return {STUB_RESULT}; }}\n" for n in names))
    proc = subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(out), str(src)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"compiling the libcuda stub failed: {proc.stderr.strip()[:300]}")
    return len(names)


def _nvcc_version(nvcc: Path) -> str:
    proc = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=False)
    m = re.search(r"release [\d.]+, V([\d.]+)", proc.stdout)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"{nvcc} --version failed: {(proc.stderr or proc.stdout).strip()[:300]}")
    return m.group(1)


def _link_soname(stubs: Path) -> None:
    """``stubs/libcuda.so.1`` -> ``libcuda.so`` where the stub exists: the linker looks up the
    libraries a shared library needs by their soname."""
    link = stubs / "libcuda.so.1"
    if (stubs / "libcuda.so").is_file() and not link.is_symlink():
        link.symlink_to("libcuda.so")


def _point(link: Path, target: Path) -> None:
    """Make ``link`` a symbolic link to ``target``, replacing an older one in one rename."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


def assemble_toolkit(cache: Path, cc: str = "cc") -> Toolkit:
    """The PyPI CUDA toolkit in the standard layout under ``cache/cuda-toolkit/<digest>/``.

    ``cache`` is the harness cache directory (harness.stages.building.source.cache_dir), shared by every work
    directory and clone on the machine, so nvcc's include paths into the toolkit, which are
    absolute and enter ccache's hash, are the same in all of them.  ``<digest>`` covers the wheel
    versions (and :data:`LAYOUT_SCHEME`), not their location: the layout reaches the wheels
    through one link, ``wheels`` (-> ``site-packages/nvidia/cu13``), which is re-pointed in one
    rename, under a file lock, when the wheels of those versions are found elsewhere (another
    virtual environment).  bin/ (nvcc finds nvcc.profile, cicc and the libraries relative to the
    link it was started through), include/ and nvvm/ link through ``wheels``; lib64/ links every
    library of the wheels' lib/ under its own and its unversioned name;
    lib64/stubs/libcuda.so is the driver stub (:func:`write_driver_stub`, compiled with ``cc``),
    also under its soname libcuda.so.1.  Raises ToolkitMissing (a wheel absent) or RuntimeError
    (the stub or nvcc failed).
    """
    from ...common.locks import Rank, exclusive
    versions = wheel_versions()
    src = wheel_root()
    digest = hashlib.sha256(json.dumps({"scheme": LAYOUT_SCHEME, **versions}, sort_keys=True).encode()).hexdigest()[:12]
    root = cache / "cuda-toolkit" / digest
    stamp = root / "toolkit.json"
    with exclusive(root, "the CUDA toolkit layout", Rank.TOOLKIT):
        if stamp.is_file():
            if (root / "wheels").resolve() != src:
                _point(root / "wheels", src)
            info = json.loads(stamp.read_text())
            return Toolkit(root, root / "bin" / "nvcc", info["version"], info["packages"])
        shutil.rmtree(root, ignore_errors=True)
        (root / "bin").mkdir(parents=True)
        (root / "lib64" / "stubs").mkdir(parents=True)
        (root / "wheels").symlink_to(src)
        for entry in sorted((src / "bin").iterdir()):
            (root / "bin" / entry.name).symlink_to(Path("..", "wheels", "bin", entry.name))
        for name in ("include", "nvvm"):
            (root / name).symlink_to(Path("wheels", name))
        for entry in sorted((src / "lib").iterdir()):
            (root / "lib64" / entry.name).symlink_to(Path("..", "wheels", "lib", entry.name))
            m = re.match(r"(lib[\w+-]+\.so)\.\d+$", entry.name)
            if m and not (root / "lib64" / m.group(1)).exists():
                (root / "lib64" / m.group(1)).symlink_to(entry.name)
        n_stub = write_driver_stub(src / "include" / "cuda.h", root / "lib64" / "stubs" / "libcuda.so", cc)
        _link_soname(root / "lib64" / "stubs")
        nvcc = root / "bin" / "nvcc"
        version = _nvcc_version(nvcc)
        stamp.write_text(json.dumps({"version": version, "packages": versions, "libcuda_stub_functions": n_stub},
                                    indent=2) + "\n")
    return Toolkit(root, nvcc, version, versions)


# --------------------------------------------------------------------------- what to compile

@dataclass(frozen=True)
class Unit:
    """A translation unit of compile_commands.json: ``file`` (absolute), ``output`` (the object,
    relative to the build directory), ``target`` (the CMake target it belongs to) and its command."""

    file: str
    output: str
    target: str
    argv: tuple[str, ...]


@dataclass
class Plan:
    """What the step compiles and links.

    ``changed``: files the series changes (relative to the tree; ``A`` added, ``M`` modified,
    ``D`` deleted).  ``units``: the affected translation units (object paths relative to the
    build directory), each with the changed files that put it there.  ``link``: the targets to
    link.  ``scanned``: units decided by the include scan (the rest by ninja's dependency log).
    ``selected``: the objects of ``units`` as planned, before :func:`refine` (the units compiled
    alone; every other unit may be grouped, harness.stages.building.unity).
    """

    changed: dict[str, str]
    units: dict[str, list[str]] = field(default_factory=dict)
    link: list[str] = field(default_factory=list)
    scanned: int = 0
    selected: list[str] = field(default_factory=list)


def changed_files(tree: Path, base_rev: str) -> dict[str, str]:
    """Path (relative, ``/``-separated) -> status letter (A, M, D) of every file that differs
    between ``base_rev`` and ``HEAD`` of the series tree ``tree``.  Raises CalledProcessError."""
    out = subprocess.run(["git", "-C", str(tree), "diff", "--no-renames", "--name-status", "-z", base_rev, "HEAD"],
                         capture_output=True, check=True, env={**os.environ, "LC_ALL": "C"}).stdout.decode()
    fields = [f for f in out.split("\0") if f]
    return {fields[i + 1]: fields[i][0] for i in range(0, len(fields) - 1, 2)}


def read_units(build_dir: Path) -> list[Unit]:
    """Every translation unit of ``build_dir/compile_commands.json`` (CMAKE_EXPORT_COMPILE_COMMANDS).

    Raises FileNotFoundError naming the file when the configure did not write it.
    """
    path = build_dir / "compile_commands.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; configure with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON")
    units = []
    for entry in json.loads(path.read_text()):
        argv = tuple(entry["arguments"]) if "arguments" in entry else tuple(shlex.split(entry["command"]))
        out = entry.get("output") or argv[argv.index("-o") + 1]
        out = os.path.relpath(Path(entry["directory"], out), build_dir)
        m = _TARGET_DIR.search(out)
        units.append(Unit(str(Path(entry["directory"], entry["file"])), out, m.group("target") if m else "", argv))
    return units


def ninja_deps(build_dir: Path, ninja: str) -> dict[str, list[str]]:
    """Object (relative to ``build_dir``) -> dependencies that ninja's log records as current
    (``VALID``) after an earlier build; outputs never built or changed since are left out."""
    proc = subprocess.run([ninja, "-C", str(build_dir), "-t", "deps"], capture_output=True, text=True, check=False)
    deps: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in proc.stdout.splitlines():
        if line and not line[0].isspace():
            out, _, info = line.partition(": #deps")
            current = deps.setdefault(out, []) if "(VALID)" in info else None
        elif line.strip() and current is not None:
            current.append(line.strip())
    return deps


#: Sources and headers of the tree that the include scan reads.
SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu", ".h", ".hh", ".hpp", ".cuh", ".inc")
_INCLUDE = INCLUDE_LINE


def _includes(path: Path) -> list[tuple[str | None, str]]:
    """The files ``path`` names in ``#include`` lines: (the file beside ``path`` when it exists, as a
    quoted include finds it first, else None; the name with leading ``./`` and ``../`` dropped)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    found = []
    for name in _INCLUDE.findall(text):
        local = os.path.normpath(os.path.join(path.parent, name))
        found.append((local if os.path.isfile(local) else None, re.sub(r"^(?:\.\.?/)+", "", name)))
    return found


def include_closure(files: Iterable[Path], changed: Iterable[Path]) -> dict[str, str]:
    """Absolute path -> the changed file it may reach, for every file of ``files`` that includes,
    directly or through other files, a file of ``changed`` (which map to themselves).

    An include resolves to the file beside the includer when there is one; otherwise the name
    matches every file whose path ends with it (``ggml-cuda/pin-ladder.cuh`` matches
    ``.../ggml/src/ggml-cuda/pin-ladder.cuh``), whatever the include directories.  So the result
    never misses an include written by name, but may hold a file whose include is switched off by
    the preprocessor or found elsewhere; the build's dependency log settles those after the
    compile (:func:`refine`).
    """
    reach = {str(c): str(c) for c in changed}
    by_name: dict[str, list[str]] = {}
    for c in reach:
        by_name.setdefault(os.path.basename(c), []).append(c)
    pending = {str(f): _includes(f) for f in files if str(f) not in reach}
    grew = True
    while grew:
        grew = False
        for path, includes in list(pending.items()):
            for local, name in includes:
                if local is not None:
                    hit = local if local in reach else None
                else:
                    hit = next((c for c in by_name.get(os.path.basename(name), ()) if c.endswith("/" + name)), None)
                if hit:
                    reach[path] = reach[hit]
                    by_name.setdefault(os.path.basename(path), []).append(path)
                    del pending[path]
                    grew = True
                    break
    return reach


def plan(tree: Path, build_dir: Path, changed: Mapping[str, str], link_targets: Iterable[str], ninja: str,
         like: Plan | None = None) -> Plan:
    """The units and targets the step builds for series tree ``tree`` configured in ``build_dir``.

    A unit is affected when its source is a changed file (or is generated from one: ``x.cpp``
    from a changed ``x.cpp.in``) or includes one.  Where ninja's log holds the unit's
    dependencies from an earlier build (:func:`ninja_deps`) they decide; otherwise
    :func:`include_closure` over the tree's sources and the units' own files does.  ``link``:
    ``link_targets`` that the build defines plus every target with a unit whose source the
    series adds.

    ``like``: the plan of the fork; the base then compiles the same units (those its build
    has) and links the ``link_targets`` it defines.
    """
    result = Plan(dict(changed))
    tree = tree.resolve()
    units = read_units(build_dir)
    targets = {u.target for u in units}
    if like is not None:
        outputs = {u.output for u in units}
        result.units = {o: r for o, r in like.units.items() if o in outputs}
        result.selected = [o for o in like.selected if o in outputs]
        result.link = sorted(t for t in link_targets if t in targets)
        return result
    present = {str(tree / p): p for p in changed if (tree / p).is_file()}
    generated = {Path(p).name[:-3]: p for p in changed if p.endswith(".in")}
    sources = [f for f in tree.rglob("*") if f.suffix in SOURCE_SUFFIXES and ".git" not in f.parts]
    reach = include_closure([*sources, *(Path(u.file) for u in units)], [tree / p for p in present.values()])
    known = ninja_deps(build_dir, ninja)
    for unit in units:
        if unit.output in known:
            deps = [unit.file, *(d if os.path.isabs(d) else os.path.normpath(build_dir / d) for d in known[unit.output])]
            reasons = sorted({present[d] for d in deps if d in present})
        else:
            reasons = [present[reach[unit.file]]] if unit.file in reach else []
            result.scanned += 1
        if not unit.file.startswith(str(tree) + os.sep) and Path(unit.file).name in generated:
            reasons.append(generated[Path(unit.file).name])
        if reasons:
            result.units[unit.output] = sorted(set(reasons))
    added = {present[u.file] for u in units if u.file in present and changed[present[u.file]] == "A"}
    result.link = sorted({t for t in link_targets if t in targets} |
                         {u.target for u in units if u.file in present and present[u.file] in added and u.target})
    result.selected = sorted(result.units)
    return result


def refine(result: Plan, tree: Path, build_dir: Path, ninja: str) -> list[str]:
    """After the build: the units of ``result`` that ninja's dependency log shows include no changed
    file (compiled on the include scan's word only) are moved out of ``result.units``; returns them."""
    tree = tree.resolve()
    present = {str(tree / p): p for p in result.changed if (tree / p).is_file()}
    known = ninja_deps(build_dir, ninja)
    spare = []
    for output, reasons in list(result.units.items()):
        if output in known and not any(r.endswith(".in") for r in reasons):
            deps = [d if os.path.isabs(d) else os.path.normpath(build_dir / d) for d in known[output]]
            exact = sorted({present[d] for d in deps if d in present})
            if exact:
                result.units[output] = exact
            else:
                spare.append(output)
                del result.units[output]
    return sorted(spare)


# --------------------------------------------------------------------------- running it

@dataclass
class CompileResult:
    """Outcome of the step for one variant: ``status`` passed/failed/error, seconds, the plan,
    the targets ``linked`` and ``not_linked`` (target -> why), ``detail`` for the summary and
    the ``logs`` written (configure, build)."""

    status: str
    seconds: float
    plan: Plan | None = None
    linked: list[str] = field(default_factory=list)
    not_linked: dict[str, str] = field(default_factory=dict)
    detail: str = ""
    logs: dict[str, Path] = field(default_factory=dict)


def left_to_do(ninja: str, build_dir: Path, target: str) -> str | None:
    """What ninja would still run for ``target`` in ``build_dir`` (a dry run, ``ninja -n``): None when it
    says "no work to do", else the first step it names (``[1/2] Linking C executable tool``) or, where it
    names none, its exit status and first line of output."""
    proc = subprocess.run([ninja, "-C", str(build_dir), "-n", target], capture_output=True, text=True, check=False)
    if proc.returncode == 0 and "no work to do" in proc.stdout:
        return None
    lines = (proc.stdout + proc.stderr).splitlines()
    step = next((line.strip() for line in lines if line.startswith("[")), "")
    return step or f"ninja -n exited {proc.returncode}: " + next((line.strip() for line in lines
                                                                 if not line.startswith("ninja: Entering")), "")


def _include_dirs(argv: Sequence[str]) -> list[str]:
    """The ``-I`` directories of a compile command (system directories, ``-isystem``, left out)."""
    dirs = []
    for i, arg in enumerate(argv):
        if arg == "-I" and i + 1 < len(argv):
            dirs.append(argv[i + 1])
        elif arg.startswith("-I") and len(arg) > 2:
            dirs.append(arg[2:])
    return dirs


def _flags(unit: Unit) -> str:
    """A unit's compile command without the compiler launcher, the source, the object and the
    dependency-file arguments: equal for units that CMake compiles with the same flags."""
    argv = list(unit.argv)
    while argv and Path(argv[0]).name in ("ccache", "sccache"):
        argv = argv[1:]
    kept, skip = [], 0
    for arg in argv:
        if skip:
            skip -= 1
        elif arg in ("-o", "-MT", "-MF", "-c"):
            skip = 1
        elif arg not in ("-MD", "-MMD") and os.path.normpath(arg) != os.path.normpath(unit.file):
            kept.append(arg)
    return shlex.join(kept)


def grouping(build_dir: Path, tree: Path, selected: Iterable[str]) -> dict[str, list[Member]]:
    """The unity groups (harness.stages.building.unity) of the units of ``build_dir``'s compile_commands.json
    that are not ``selected`` (object paths compiled alone).

    Left out: units outside ``tree`` (generated into the build directory) and every unit of a
    target that upstream already builds as unity sources (an object under ``Unity/``: its own
    batches stay as they are)."""
    alone = set(selected)
    units = read_units(build_dir)
    upstream_unity = {u.target for u in units if "/Unity/" in u.output}
    root = str(tree.resolve()) + os.sep
    free = [u for u in units if u.target and u.target not in upstream_unity and u.output not in alone
            and u.file.startswith(root)]
    dirs = {u.target: _include_dirs(u.argv) for u in free}
    return unity_groups([Member(u.file, u.target, u.output, _flags(u)) for u in free], dirs)


def compile_tree(tree: Path, build_dir: Path, options: Mapping[str, str], changed: Mapping[str, str],
                 link_targets: Sequence[str], logs_dir: Path, *, cmake: str, ninja: str, jobs: int = 2,
                 env: Mapping[str, str] | None = None, like: Plan | None = None,
                 budget: JobBudget | None = None) -> CompileResult:
    """Configure ``tree`` into ``build_dir`` with ``options``, then compile and link what :func:`plan` selects.

    The plan is made from a configure without grouping, so compile_commands.json names every unit.
    Where something is linked, the units it does not select are grouped into unity sources
    (harness.stages.building.unity; :func:`grouping`, written to ``build_dir/unity-groups.cmake``
    and applied by a second configure through ``CMAKE_PROJECT_ggml_INCLUDE``); the selected ones
    compile alone, as without grouping.  A unity source that fails to compile is dissolved (its units compile
    alone) and the build runs again, so a grouping the rule got wrong costs time, not a failure.

    Logs: ``configure.log``/``.rc`` (and ``configure-unity.log``) and ``build.log``/``.rc`` (one
    ``ninja -k 0`` over the affected objects and the link targets; ``like`` as in :func:`plan`)
    in ``logs_dir`` (a first build with groups that failed stays as ``build-grouped.log``), and
    ``compile.json`` (the plan, the unity groups, the targets linked and not linked, the times).
    ``budget``: the run's job budget (harness.common.jobserver), shared with the builds running beside
    the step: where it governs, ninja gets no ``-j`` and every configure and ninja holds one of its
    slots; elsewhere (and without one) ninja runs ``-j jobs``.
    ``status`` is ``failed`` when configure or a compile or link failed (``detail`` holds the
    first error line), and also when ninja exited 0 but a link target is not up to date afterwards
    (:func:`left_to_do`: a step that did not do its work never passes; ``detail`` names each such
    target and what ninja would still run for it), else ``passed``.  Raises nothing for a failing compile.
    """
    from .build import _run_step, first_error_line
    start = time.monotonic()
    logs_dir.mkdir(parents=True, exist_ok=True)
    build_dir.mkdir(parents=True, exist_ok=True)
    result = CompileResult(STEP_PASSED, 0.0)
    groups_file = build_dir / "unity-groups.cmake"
    opts = {**options, "CMAKE_EXPORT_COMPILE_COMMANDS": "ON", "CMAKE_PROJECT_ggml_INCLUDE": CMAKE_HOOK.as_posix()}

    def configure(groups: Mapping[str, list[Member]], log: str) -> bool:
        if groups:
            write_groups_file(groups_file, groups)
        argv = [cmake, "-S", str(tree), "-B", str(build_dir), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}",
                *[f"-D{k}={v}" for k, v in sorted(opts.items())],
                f"-DHARNESS_UNITY_GROUPS={groups_file.as_posix() if groups else ''}"]
        rc, _ = _run_step(argv, logs_dir / log, env, budget)
        result.logs[log.removesuffix(".log")] = logs_dir / log
        if rc != 0:
            result.status = STEP_FAILED
            result.detail = "configure failed: " + (first_error_line(logs_dir / log) or f"exit {rc}")
            result.seconds = time.monotonic() - start
        return rc == 0

    if not configure({}, BUILD_FILES["configure"]):
        return result
    scan_start = time.monotonic()
    result.plan = plan(tree, build_dir, changed, link_targets, ninja, like)
    groups = grouping(build_dir, tree, result.plan.selected) if result.plan.link else {}
    scan_seconds = time.monotonic() - scan_start
    if groups and not configure(groups, "configure-unity.log"):
        return result
    outputs = sorted(result.plan.units)
    parallel = budget.jobs_option(jobs) if budget is not None else ["-j", str(jobs)]
    build = [ninja, "-C", str(build_dir), "-k", "0", *parallel, *outputs, *result.plan.link]
    rc, build_seconds = _run_step(build, logs_dir / BUILD_FILES["build"], env, budget)
    dissolved = sorted({g for g in map(unity_object, _failed_outputs(logs_dir / BUILD_FILES["build"]))
                        if g in groups})
    if dissolved:
        (logs_dir / BUILD_FILES["build"]).replace(logs_dir / "build-grouped.log")
        groups = {name: ms for name, ms in groups.items() if name not in dissolved}
        if not configure(groups, "configure-unity.log"):
            return result
        rc, again = _run_step(build, logs_dir / BUILD_FILES["build"], env, budget)
        build_seconds += again
    result.logs["build"] = logs_dir / BUILD_FILES["build"]
    spare = refine(result.plan, tree, build_dir, ninja) if like is None else []
    failed_objects = _failed_outputs(logs_dir / BUILD_FILES["build"])
    for target in result.plan.link:
        left = left_to_do(ninja, build_dir, target)
        if left is None:
            result.linked.append(target)
        elif any(not f.endswith(".o") and target in Path(f).name for f in failed_objects):
            result.not_linked[target] = "its link failed"
        elif failed_objects:
            result.not_linked[target] = "an object or library it needs failed to compile"
        else:
            result.not_linked[target] = f"nothing failed, yet ninja still has work for it: {left}"
    result.seconds = time.monotonic() - start
    n_cu = sum(1 for o in outputs if o.endswith(".cu.o"))
    what = (f"{len(outputs)} translation units the series touches ({n_cu} CUDA), "
            f"linked {', '.join(result.linked) or 'nothing'} against the libcuda stub")
    if groups:
        n_cuda = sum(len(ms) for ms in groups.values() if ms[0].language == "CUDA")
        what += (f"; {sum(len(ms) for ms in groups.values())} other units ({n_cuda} CUDA) compiled in "
                 f"{len(groups)} unity groups")
    if rc != 0:
        result.status = STEP_FAILED
        if result.not_linked:
            what += f"; not linked: {', '.join(sorted(result.not_linked))}"
        result.detail = ("compile failed: " + (first_error_line(logs_dir / BUILD_FILES["build"]) or f"exit {rc}")
                         + f" ({what})")
    elif result.not_linked:  # ninja exited 0, but what the step was to link is not there: it did not do its work
        result.status = STEP_FAILED
        result.detail = ("not linked: " + "; ".join(f"{t} ({why})" for t, why in sorted(result.not_linked.items()))
                         + f" ({what})")
    else:
        result.detail = f"compiled {what}"
    write_json(logs_dir / COMPILE_FILES["record"], {
        "status": result.status, "seconds": round(result.seconds, 1), "scan_seconds": round(scan_seconds, 1),
        "build_seconds": round(build_seconds, 1), "options": opts, "changed": result.plan.changed,
        "units": result.plan.units, "units_decided_by_include_scan": result.plan.scanned,
        "compiled_not_affected": spare,
        "unity_groups": {name: [os.path.relpath(m.source, tree.resolve()) for m in ms] for name, ms in groups.items()},
        "unity_groups_dissolved": dissolved,
        "link_targets": result.plan.link, "linked": result.linked, "not_linked": result.not_linked,
        "failed_outputs": failed_objects})
    return result


def _failed_outputs(log: Path) -> list[str]:
    """The outputs ninja reports as ``FAILED:`` in ``log``."""
    return re.findall(r"^FAILED: (?:\[code=\d+\] )?(\S+)", log.read_text(errors="replace"), re.M)
