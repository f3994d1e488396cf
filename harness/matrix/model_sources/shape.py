"""The one shape of a model source (matrix.yaml's ``models.<name>.kind``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from ..models import QuantizeTool


class Model(Protocol):
    """A matrix model as a source reads it (harness.matrix.config.Model: ``name``, ``kind``, ``spec``)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def spec(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class Making:
    """What making a model may use: ``cache_dir`` (where made files go), ``base_tree`` (the base source's
    path, obtained on first call), ``matrix_path`` (for messages), ``source`` (name -> path and identity
    of another matrix model, made on first use) and ``quantize`` (the llama-quantize a derived model needs;
    None where no build is at hand)."""

    cache_dir: Path
    base_tree: Callable[[], Path]
    matrix_path: Path | str
    source: Callable[[str], tuple[Path, dict[str, Any]]] | None = None
    quantize: Callable[[], QuantizeTool] | None = None


@dataclass(frozen=True)
class ModelSource:
    """A kind of model source: how a model of it is made (``obtain``: model, making -> its GGUF file; raises
    ModelError naming the model), where one already made is without making it (``made``: model, cache
    directory, base tree or None -> path or None), what its bytes follow from (``identity``: model, path ->
    a JSON-able dict, the key of models derived from it) and the problems of its matrix entry beyond the
    schema (``problems``: the matrix's models as parsed YAML, the model's name -> (key path below the
    model, message) pairs)."""

    kind: str
    obtain: Callable[[Model, Making], Path]
    made: Callable[[Model, Path, Path | None], Path | None]
    identity: Callable[[Model, Path], dict[str, Any]]
    problems: Callable[[Mapping[str, Any], str], list[tuple[list[Any], str]]] = lambda models, name: []
