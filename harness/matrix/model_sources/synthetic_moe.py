"""``kind: synthetic-moe``: a MoE model generated from its ``params`` with the vocabulary of a file of the base
tree (harness.matrix.moe_generator.generate_synthetic_moe); its file name hashes the generator's version, the
parameters and the vocabulary."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from ..moe_generator import MoeParams, generate_synthetic_moe, synthetic_moe_path
from .shape import Making, Model, ModelSource


def _obtain(model: Model, making: Making) -> Path:
    vocab = making.base_tree() / model.spec["vocab"]
    return generate_synthetic_moe(vocab, MoeParams(**model.spec.get("params", {})), making.cache_dir)


def _made(model: Model, cache_dir: Path, base: Path | None) -> Path | None:
    vocab = base / model.spec["vocab"] if base is not None else None
    if vocab is None or not vocab.is_file():
        return None
    return synthetic_moe_path(vocab, MoeParams(**model.spec.get("params", {})), cache_dir)


def _problems(models: Mapping[str, Any], name: str) -> list[tuple[list[Any], str]]:
    """A ``params`` key the generator does not have (:class:`MoeParams`)."""
    known = {f.name for f in dataclasses.fields(MoeParams)}
    return [(["params", key], f"unknown generator parameter (known: {', '.join(sorted(known))})")
            for key in models[name].get("params", {}) if key not in known]


SYNTHETIC_MOE = ModelSource(
    kind="synthetic-moe",
    obtain=_obtain,
    made=_made,
    identity=lambda model, path: {"kind": model.kind, "generated": path.name},
    problems=_problems,
)
