"""The pin of matrix.yaml: ``base.commit``, the file list that proves it (``base.files``) and the sources that
must yield it, checked for agreement and rewritten in place.

A pin agrees with itself when every part that names or proves a commit names ``base.commit``:

* the file list's header line (``# llama.cpp <commit>: ...``, harness.stages.building.source.FILES_HEADER) and
  its sha256 (``base.files.sha256``); a file list named ``llama.cpp-<commit12>.files`` (as ``source files``
  writes it) must name the same commit;
* a mirror archive (``kind: archive``): when it is there, its HARNESS-MIRROR.json's commit and its sha256
  (``sha256`` or the ``sha256_file`` beside it); when it is not, a name ``llama.cpp-<commit12>.tar.gz``
  (as ``source export-mirror`` writes it) naming another commit;
* an sdist (``kind: pypi-sdist``): when the download cache holds it unpacked, the HEAD of its vendored
  checkout.

:func:`pin_problems` lists every disagreement (harness.matrix.config.load_matrix refuses the matrix with
them, so every command refuses a pin edited by hand in one place only).  :func:`rewrite_yaml` replaces
scalars and removes list items of matrix.yaml's text where PyYAML's node marks say they are, so comments and
layout stay as they were (the roll, harness.upstream.roll, writes the new pin with it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

from ..common.fs import sha256_file

#: A 12-hex-digit commit prefix in a name the harness writes (``llama.cpp-<commit12>.files``, ``.tar.gz``).
_NAMED_COMMIT = re.compile(r"llama\.cpp-([0-9a-f]{12})\b")
#: The first line of a file list (harness.stages.building.source.FILES_HEADER), its commit captured.
_FILES_HEADER = re.compile(r"^# llama\.cpp ([0-9a-f]{40}): ")


def archive_manifest_commit(path: Path) -> str | None:
    """The commit the HARNESS-MIRROR.json of the mirror archive ``path`` names, read from the archive's
    first member (``source export-mirror`` writes it first, so the rest is not decompressed); None when
    the first member is not that manifest or names no commit."""
    try:
        with tarfile.open(path) as tf:
            first = tf.next()
            if first is None or first.name != "HARNESS-MIRROR.json":
                return None
            member = tf.extractfile(first)
            data = json.loads(member.read()) if member else {}
    except (OSError, tarfile.TarError, ValueError):
        return None
    commit = data.get("commit") if isinstance(data, dict) else None
    return commit if isinstance(commit, str) else None


def _cache_root() -> Path:
    """The download cache's directory as harness.stages.building.source.cache_dir finds it, without creating it."""
    env = os.environ.get("HARNESS_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "llama-fork-harness"


def unpacked_sdist_head(package: str, version: str, subdir: str, cache: Path | None = None) -> str | None:
    """The HEAD commit of the vendored checkout ``subdir`` of the sdist ``package==version`` where the
    download cache already holds it unpacked (harness.stages.building.source.unpacked_sdist); None when it does
    not (nothing is downloaded) or git cannot read it."""
    stem = f"{package.replace('-', '_')}-{version}".lower()
    root = (cache or _cache_root()) / "sdists"
    if not root.is_dir():
        return None
    for entry in root.iterdir():
        if entry.name.lower() != stem or not entry.is_dir():
            continue
        roots = [p for p in entry.iterdir() if p.is_dir()]
        vendored = roots[0] / subdir if len(roots) == 1 else entry / subdir
        if not vendored.exists():
            return None
        proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=vendored, capture_output=True, text=True,
                              env={**os.environ, "LC_ALL": "C", "GIT_OPTIONAL_LOCKS": "0"})
        return proc.stdout.strip() if proc.returncode == 0 else None
    return None


def pin_problems(matrix: Any, line: Callable[[Sequence[str | int]], int]) -> list[str]:  # Any: config.Matrix: it imports this
    """Every way the pin of ``matrix`` (a harness.matrix.config.Matrix) disagrees with itself (module
    docstring), one ``file:line: key: message`` string each, [] when it agrees.  ``line`` gives the 1-based
    line of a key path of the matrix file."""
    commit = matrix.base_commit
    where = matrix.path
    problems: list[str] = []

    def problem(keys: Sequence[str | int], text: str) -> None:
        name = ".".join(map(str, keys))
        problems.append(f"{where}:{line(keys)}: {name}: the pin disagrees with itself: {text}, "
                        f"base.commit is {commit[:12]} (`roll --onto SOURCE` writes every part of a pin)")

    if matrix.base_files is not None:
        files = Path(matrix.base_files)
        named = _NAMED_COMMIT.search(files.name)
        if named and not commit.startswith(named.group(1)):
            problem(("base", "files", "path"), f"the file list {files.name} is named after commit {named.group(1)}")
        try:
            with open(files, "rb") as fh:
                head = fh.readline().decode("utf-8", errors="replace")
            actual = sha256_file(files)
        except OSError as exc:
            problem(("base", "files", "path"), f"{files}: {exc.strerror}")
        else:
            found = _FILES_HEADER.match(head)
            if not found:
                problem(("base", "files", "path"), f"{files}:1 is not a file list's header line")
            elif found.group(1) != commit:
                problem(("base", "files", "path"), f"the file list {files} lists commit {found.group(1)} (its line 1)")
            if actual != matrix.base_files_sha256:
                problem(("base", "files", "sha256"), f"{files} has sha256 {actual}, base.files.sha256 pins "
                                                     f"{matrix.base_files_sha256}")
    for i, src in enumerate(matrix.sources):
        keys = ("base", "sources", i)
        if src.kind == "archive" and src.path is not None:
            if src.path.is_file():
                manifest = archive_manifest_commit(src.path)
                if manifest is not None and manifest != commit:
                    problem((*keys, "path"), f"the mirror archive {src.path} holds commit {manifest} "
                                             "(its HARNESS-MIRROR.json)")
                pinned = src.sha256
                if pinned is None and src.sha256_file is not None and src.sha256_file.is_file():
                    pinned = (src.sha256_file.read_text(encoding="utf-8").split() or [""])[0]
                held = sha256_file(src.path) if pinned is not None else None
                if held is not None and held != pinned:
                    problem((*keys, "sha256" if src.sha256 else "sha256_file"),
                            f"the mirror archive {src.path} has sha256 {held}, the pin says {pinned}")
            else:
                for key, path in (("path", src.path), ("sha256_file", src.sha256_file)):
                    named = _NAMED_COMMIT.search(path.name) if path is not None else None
                    if path is not None and named and not commit.startswith(named.group(1)):
                        problem((*keys, key), f"{path.name} is named after commit {named.group(1)}")
        if src.kind == "pypi-sdist" and src.package and src.version and src.subdir:
            sdist_head = unpacked_sdist_head(src.package, src.version, src.subdir)
            if sdist_head is not None and sdist_head != commit:
                problem((*keys, "version"), f"{src.package} {src.version} vendors commit {sdist_head} "
                                            f"(its {src.subdir} in the download cache)")
    return problems


# --------------------------------------------------------------------------- rewriting


def _node(root: yaml.Node, keys: Sequence[str | int]) -> tuple[yaml.Node | None, yaml.Node | None]:
    """(the node at ``keys``, its parent) in the composed document ``root``; (None, parent) when absent."""
    node: yaml.Node | None = root
    parent: yaml.Node | None = None
    for key in keys:
        parent = node
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == str(key)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and 0 <= key < len(node.value):
            node = node.value[key]
        else:
            node = None
        if node is None:
            return None, parent
    return node, parent


def _plain(value: str) -> str:
    """``value`` as a YAML scalar: plain when YAML reads it back as that string, else double-quoted."""
    try:
        if yaml.safe_load(value) == value and "#" not in value and ": " not in value:
            return value
    except yaml.YAMLError:
        pass
    return json.dumps(value)


def _line_start(text: str, index: int) -> int:
    return text.rfind("\n", 0, index) + 1


def _last_end(node: yaml.Node) -> int:
    """The index just past the last scalar of ``node`` (a block node's own end mark lies past what follows)."""
    if isinstance(node, yaml.ScalarNode):
        return node.end_mark.index
    children = [v for pair in node.value for v in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
    return max((_last_end(c) for c in children), default=node.end_mark.index)


def rewrite_yaml(text: str, values: Mapping[tuple, str], remove: Sequence[tuple] = ()) -> str:
    """``text`` (a YAML document) with the scalar at each key path of ``values`` replaced by its value and the
    list items at the key paths of ``remove`` deleted with their lines; everything else (comments, order,
    layout) as it was.  Raises KeyError naming a key path that holds no scalar (or no list item)."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is None:
        raise KeyError("the document is empty: no key path holds a scalar")
    spans: list[tuple[int, int, str]] = []
    for keys, value in values.items():
        node, _ = _node(root, keys)
        if not isinstance(node, yaml.ScalarNode):
            raise KeyError(f"{'.'.join(map(str, keys))}: no scalar there")
        spans.append((node.start_mark.index, node.end_mark.index, _plain(value)))
    for keys in remove:
        node, parent = _node(root, keys)
        if node is None or not isinstance(parent, yaml.SequenceNode):
            raise KeyError(f"{'.'.join(map(str, keys))}: no list item there")
        i = parent.value.index(node)
        start = _line_start(text, node.start_mark.index)
        if i + 1 < len(parent.value):
            end = _line_start(text, parent.value[i + 1].start_mark.index)
        else:
            newline = text.find("\n", _last_end(node))
            end = len(text) if newline < 0 else newline + 1
        spans.append((start, end, ""))
    for start, end, new in sorted(spans, reverse=True):
        text = text[:start] + new + text[end:]
    return text
