"""``kind: quantized``: a model derived from another of the matrix (``from``) with upstream's llama-quantize
(harness.matrix.models.derive_quantized); its file name holds its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..models import QUANTIZE_TARGET, ModelError, derive_quantized, quantized_spec_problems
from .shape import Making, Model, ModelSource


def _obtain(model: Model, making: Making) -> Path:
    if making.source is None or making.quantize is None:
        raise ModelError(f"model {model.name} is derived with {QUANTIZE_TARGET} from {model.spec['from']}, "
                         f"and this command has no build to take {QUANTIZE_TARGET} from ({making.matrix_path})")
    src_path, src_identity = making.source(model.spec["from"])
    return derive_quantized(model.name, model.spec, src_path, src_identity, making.quantize(), making.cache_dir)


def _problems(models: Mapping[str, Any], name: str) -> list[tuple[list[Any], str]]:
    """Its ``from``: a model the matrix lacks, or a chain of derived models that comes back; then the
    quantizer's own rules (harness.matrix.models.quantized_spec_problems)."""
    seen = [name]
    source = models[name]["from"]
    out: list[tuple[list[Any], str]] = []
    while True:
        if source not in models:
            out.append((["from"], f"unknown model {source!r} (known: {', '.join(sorted(models))})"))
            break
        if source in seen:
            out.append((["from"], f"derived from itself ({' -> '.join([*seen, source])})"))
            break
        if models[source]["kind"] != QUANTIZED.kind:
            break
        seen.append(source)
        source = models[source]["from"]
    return out + quantized_spec_problems(models[name])


QUANTIZED = ModelSource(
    kind="quantized",
    obtain=_obtain,
    # its file's name holds the key of its source and the tool: where it is cannot be known before both are
    made=lambda model, cache_dir, base: None,
    identity=lambda model, path: {"kind": model.kind, "derived": path.name},
    problems=_problems,
)
