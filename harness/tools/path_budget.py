"""The path budget of platforms built on Windows runners: no path of the layout past MAX_PATH.

Windows limits a path to 260 characters (MAX_PATH) unless long paths are
enabled both in the registry (``LongPathsEnabled``) and in each program's
manifest; git honours ``core.longpaths`` (the harness sets it), but CMake,
Ninja and compilers may not.  The harness's layout below a runner's
workspace is therefore checked with the real file list of the base tree
and the files the patch series adds:

``<workspace>\\.ci-cache\\harness\\base\\<commit12>\\<file>``  the cached base tree
                                                           (the workflow sets
                                                           HARNESS_CACHE_DIR to
                                                           ``<workspace>/.ci-cache/harness``)
``<workspace>\\.harness\\<variant>\\llama.cpp\\<file>``         the base and fork work trees
``<workspace>\\.harness\\<variant>\\build-<platform>\\bin\\<target>.exe``
``<workspace>\\results\\<run-id>\\<platform>\\<config>\\gen\\<model>\\<prompt>.r<k>.pin-ladder.json``

The workspace is GitHub's: ``D:\\a\\<repo>\\<repo>\\`` on hosted runners,
``C:\\actions-runner\\_work\\<repo>\\<repo>\\`` on self-hosted ones (the runner's
default install directory).  Object files inside build directories are not
listed: CMake shortens an object path past ``CMAKE_OBJECT_PATH_MAX`` (250) by
itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from typing import Iterable, Sequence

from ..kinds.windows import WINDOWS
from ..matrix.config import Matrix, Platform
from ..matrix.platforms import executable_suffix
from ..record.layout import RunLayout
from ..record.run_id import new_run_id

#: Windows' MAX_PATH: the longest path, in characters, without long path support (harness.kinds.windows).
MAX_PATH: int = WINDOWS.max_path or 260
#: The runner workspace of hosted and self-hosted runners; ``{repo}`` is the repository's name.
HOSTED_WORKSPACE = "D:\\a\\{repo}\\{repo}"
SELF_HOSTED_WORKSPACE = "C:\\actions-runner\\_work\\{repo}\\{repo}"
#: HARNESS_CACHE_DIR of the workflow's platform jobs, relative to the workspace.
CI_CACHE_DIR = ".ci-cache/harness"
#: The work directory of the harness (``--work-dir`` default), relative to the workspace.
WORK_DIR = ".harness"

_DIFF_HEADER = re.compile(rb"^diff --git a/\S+ b/(\S+)$", re.M)


@dataclass(frozen=True)
class PathBudget:
    """The longest path of ``platform``'s layout below ``workspace``: ``longest`` has ``length`` characters."""

    platform: str
    workspace: str
    longest: str
    length: int

    @property
    def over(self) -> bool:
        """True when ``longest`` is longer than MAX_PATH."""
        return self.length > MAX_PATH


def workspace(p: Platform, repo: str) -> str:
    """The runner workspace of ``p``'s CI job for repository name ``repo`` (see the module docstring)."""
    assert p.ci is not None
    template = SELF_HOSTED_WORKSPACE if "self-hosted" in p.ci.runs_on else HOSTED_WORKSPACE
    return template.format(repo=repo)


def files_added_by(patch_texts: Iterable[bytes]) -> list[str]:
    """Paths (``/``-separated) that patches name as their new side, from their ``diff --git`` headers."""
    out: list[str] = []
    for text in patch_texts:
        out += [m.group(1).decode("utf-8", "replace") for m in _DIFF_HEADER.finditer(text)]
    return out


def layout_paths(matrix: Matrix, p: Platform, base_files: Sequence[str], fork_files: Sequence[str]) -> list[str]:
    """Every path of the layout of ``p``, relative to the workspace, with ``\\`` separators."""
    commit12 = matrix.base_commit[:12]
    exe = executable_suffix(p)
    rel: list[str] = []
    rel += [f"{CI_CACHE_DIR}/base/{commit12}/{f}" for f in base_files]
    rel += [f"{WORK_DIR}/base/llama.cpp/{f}" for f in base_files]
    rel += [f"{WORK_DIR}/fork/llama.cpp/{f}" for f in (*base_files, *fork_files)]
    for variant in ("base", "fork"):
        rel += [f"{WORK_DIR}/{variant}/build-{p.name}/bin/{t}{exe}" for t in (*p.targets, *p.test_targets)]
    layout = RunLayout(Path("results", new_run_id()))
    for gname in p.groups:
        g = matrix.groups[gname]
        repeats = g.generation.repeats
        for config in (g.reference, *g.candidates):
            for model in g.models:
                for prompt in g.prompts:
                    rel.append(layout.load_file(p.name, config, model, f"{prompt}.r{repeats}", "pin_ladder").as_posix())
    return [str(PureWindowsPath(r)) for r in rel]


def path_budget(matrix: Matrix, p: Platform, repo: str, base_files: Sequence[str],
                fork_files: Sequence[str]) -> PathBudget:
    """The longest path of ``p``'s layout below its runner workspace for repository ``repo``.

    ``base_files``: the base tree's files (``git ls-files``); ``fork_files``:
    the files the patch series adds or changes (``files_added_by``).  Lengths
    count characters of the absolute Windows path.
    """
    ws = workspace(p, repo)
    longest = max((f"{ws}\\{r}" for r in layout_paths(matrix, p, base_files, fork_files)), key=len)
    return PathBudget(p.name, ws, longest, len(longest))
