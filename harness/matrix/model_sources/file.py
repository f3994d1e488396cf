"""``kind: file``: a GGUF file at ``path``, checked against ``sha256`` when given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...common.fs import sha256_file
from ..models import ModelError, verified_digest
from .shape import Making, Model, ModelSource


def _obtain(model: Model, making: Making) -> Path:
    path = Path(model.spec["path"])
    if not path.exists():
        raise ModelError(f"model {model.name}: {path} does not exist ({making.matrix_path})")
    expected = model.spec.get("sha256")
    actual = sha256_file(path) if expected else None
    if actual != expected:
        raise ModelError(f"model {model.name}: {path} has sha256 {actual}, {making.matrix_path} expects {expected}")
    return path


def _identity(model: Model, path: Path) -> dict[str, Any]:
    """Its sha256: from its ``.sha256`` sidecar when current, else read (a directory the sidecar cannot be
    written to)."""
    try:
        return {"kind": model.kind, "sha256": verified_digest(path)}
    except OSError:
        return {"kind": model.kind, "sha256": sha256_file(path)}


FILE = ModelSource(
    kind="file",
    obtain=_obtain,
    made=lambda model, cache_dir, base: Path(model.spec["path"]),
    identity=_identity,
)
