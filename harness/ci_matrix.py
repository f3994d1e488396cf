"""The CI job matrix, derived from ``matrix.yaml``: ``python -m harness ci-matrix``.

Prints ``{"include": [...]}``, one entry per platform that has a ``ci`` section,
in the order of ``matrix.yaml``.  GitHub Actions expands it with
``strategy.matrix: ${{ fromJSON(needs.<job>.outputs.matrix) }}``; the workflow
lists no platform itself, so ``matrix.yaml`` stays the only place that does.

Each entry carries what one platform job reads from ``matrix.<key>``:

``platform``       the platform's name in matrix.yaml (passed as ``--platform``)
``os``             ``linux`` or ``windows``
``runs_on``        the runner labels of ``ci.runs_on`` (``runs-on`` takes a list;
                   a runner must carry every label)
``shell``          the job's default shell: ``bash`` on Linux, ``pwsh`` on Windows
``steps``          nox sessions every runner of the platform runs (``ci.steps``)
``gpu_steps``      nox sessions that need a GPU on the runner (``ci.gpu_steps``)
``needs_gpu``      true when ``gpu_steps`` is not empty
``gpu``            the GPU the platform's hardware needs: ``nvidia`` or ``none``
``base_commit``    the pinned upstream commit (a cache key part)
``models_digest``  SHA-256 of the matrix's model definitions (a cache key part)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from .config import Matrix, MatrixError, load_matrix

#: The default shell of a platform job, by matrix ``os``.
SHELLS = {"linux": "bash", "windows": "pwsh"}


def _canonical(value: Any, base: Path) -> Any:
    """``value`` with paths written relative to ``base`` in POSIX form, so a digest is machine independent."""
    if isinstance(value, Path):
        try:
            return Path(os.path.relpath(value, base)).as_posix()
        except ValueError:  # another drive on Windows
            return value.as_posix()
    if isinstance(value, dict):
        return {str(k): _canonical(v, base) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v, base) for v in value]
    return value


def models_digest(matrix: Matrix) -> str:
    """SHA-256 (hex, 64 digits) of every model's name, kind and definition in ``matrix``.

    The download cache holds the assembled and generated models, so its key
    changes exactly when a model definition does (not when a prompt or group
    does).  Paths are hashed relative to the matrix file's directory.
    """
    base = matrix.path.resolve().parent
    doc = {name: {"kind": m.kind, "spec": _canonical(dict(m.spec), base)} for name, m in matrix.models.items()}
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def ci_matrix(matrix: Matrix, platforms: Sequence[str] = ()) -> dict:
    """The GitHub Actions matrix ``{"include": [entry, ...]}`` for ``matrix``.

    ``platforms``: names to keep (default: every platform with a ``ci``
    section).  Entries follow the order of matrix.yaml; their keys are listed
    in this module's docstring.  Raises MatrixError for an unknown platform
    name, for a named platform without a ``ci`` section, and when no platform
    is left (GitHub rejects an empty ``include``).
    """
    wanted = set()
    for name in platforms:
        p = matrix.platform(name)  # MatrixError listing the known names
        if p.ci is None:
            raise MatrixError([f"{matrix.path}: platform {name!r} has no ci section, so CI cannot run it"])
        wanted.add(name)
    digest = models_digest(matrix)
    include = []
    for name, p in matrix.platforms.items():
        if p.ci is None or (wanted and name not in wanted):
            continue
        include.append({
            "platform": name,
            "os": p.os,
            "runs_on": list(p.ci.runs_on),
            "shell": SHELLS[p.os],
            "steps": list(p.ci.steps),
            "gpu_steps": list(p.ci.gpu_steps),
            "needs_gpu": bool(p.ci.gpu_steps),
            "gpu": p.gpu,
            "base_commit": matrix.base_commit,
            "models_digest": digest,
        })
    if not include:
        raise MatrixError([f"{matrix.path}: no platform has a ci section; the CI matrix would be empty"])
    return {"include": include}


def write_github_output(path: Path, name: str, value: str) -> None:
    """Append ``name=value`` as one line to the GitHub Actions output file ``path``.

    ``value`` must be a single line (compact JSON is); raises ValueError otherwise.
    """
    if "\n" in value or "\r" in value:
        raise ValueError(f"output {name!r} must be a single line")
    with path.open("a", encoding="utf-8", newline="\n") as fh:
        fh.write(f"{name}={value}\n")


def _split(values: Sequence[str]) -> list[str]:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness ci-matrix [--matrix FILE] [--platform P ...] [--github-output]``.

    Prints the matrix as JSON on stdout.  With ``--github-output`` it also
    appends ``matrix=<compact JSON>`` to the file named by ``$GITHUB_OUTPUT``.
    Returns 0, or 2 with a message on stderr for a bad matrix, an unknown
    platform or a missing ``$GITHUB_OUTPUT``.
    """
    ap = argparse.ArgumentParser(prog="python -m harness ci-matrix",
                                 description="Print the GitHub Actions job matrix derived from matrix.yaml.")
    ap.add_argument("--matrix", type=Path, default=Path("matrix.yaml"), help="matrix file (default: matrix.yaml)")
    ap.add_argument("--platform", action="append", default=[],
                    help="only this platform (repeatable or comma separated; default: every platform with ci)")
    ap.add_argument("--github-output", action="store_true",
                    help="also append matrix=<json> to the file named by $GITHUB_OUTPUT")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    out_file = os.environ.get("GITHUB_OUTPUT") if args.github_output else None
    if args.github_output and not out_file:
        print("error: --github-output: $GITHUB_OUTPUT is not set (GitHub Actions sets it in a step)", file=sys.stderr)
        return 2
    try:
        result = ci_matrix(load_matrix(args.matrix), _split(args.platform))
    except (MatrixError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    if out_file:
        write_github_output(Path(out_file), "matrix", json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
