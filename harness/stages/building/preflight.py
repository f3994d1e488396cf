"""Refusing what cannot run, before it runs: bad input is exit 2 (harness.common.errors.InputError), never a
failed run that looks like a broken patch.

Two moments:

* :func:`check_inputs`, before any build (harness.cli): what the inputs alone prove.  A
  generation whose prompt cannot fit its context (harness.matrix.fit, with the vocabulary of a
  model file already made), a group whose reference runs on a platform this machine cannot run,
  and a configuration that sets an environment variable of the CUDA backend on a platform
  without a GPU.
* after the build and before any generation (harness.stages.outputs.refusals): whether the build's own
  llama-completion takes a configuration's arguments, and the exact prompt check, harness.matrix.fit's with
  the build's llama-tokenize.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ...common.errors import InputError
from ...kinds.registry import backend_of, gpu_of
from ...matrix.config import Matrix, Platform
from ...matrix.fit import Vocabulary, refuse_unfit, selected_generations, vocabulary_of
from ...matrix.selection import Selection
from ...matrix.model_sources.registry import made_model_path
from ...matrix.models import ModelError, model_summary
from ...matrix.platforms import cannot_run
from .source import cached_base

def one_line(problems: Sequence[str]) -> str:
    """The first of ``problems`` and how many more there are, as one line."""
    more = len(problems) - 1
    return problems[0] + (f" (and {more} more problem{'s' if more > 1 else ''} of the same kind)" if more else "")


def configs_on(matrix: Matrix, p: Platform, group: str) -> list[str]:
    """The configurations group ``group`` runs on platform ``p``: its reference (unless it runs on its
    ``reference_platform``), its candidates and the upstream configurations of those."""
    g = matrix.groups[group]
    names = [] if g.reference_platform else [g.reference]
    names += list(g.candidates)
    names += [u for c in g.candidates if (u := matrix.configs[c].upstream) and not g.reference_platform]
    return list(dict.fromkeys(names))


def _group_problems(matrix: Matrix, p: Platform, group: str, compare: bool) -> list[str]:
    """What the inputs alone prove group ``group`` cannot run on ``p``: a reference platform this machine
    cannot run (only for a platform it can run, and when ``compare``: the comparisons are to run), a
    variable only another GPU kind's backend reads (harness.kinds: ``GGML_CUDA_*`` and ``CUDA_VISIBLE_DEVICES``
    are the CUDA backend's) in a configuration on ``p``: its build ignores it, so the configuration would
    compare nothing it claims to."""
    out = []
    g = matrix.groups[group]
    if compare and g.reference_platform and cannot_run(p) is None:
        why = cannot_run(matrix.platform(g.reference_platform))
        if why:
            out.append(f"group {group} on {p.name} takes its reference from platform {g.reference_platform}, which "
                       f"cannot run here: {why} ({matrix.path}: groups.{group}.reference_platform)")
    kind = gpu_of(p)
    for config in configs_on(matrix, p, group):
        for var in matrix.configs[config].env:
            other = backend_of(var)
            if other is not None and other is not kind:
                out.append(f"configuration {config} of group {group} sets {var}, which only the {other.backend} "
                           f"backend reads, on {p.name}, {kind.described} ({matrix.path}: configs.{config}.env)")
    return out


def check_inputs(matrix: Matrix, platforms: Sequence[str], groups: Sequence[str], models: Sequence[str],
                 n_predict: int | None, cache: Path, compare: bool = True) -> None:
    """Before any build: raise InputError (one line) for what compare-outputs could not run on
    ``platforms`` (empty: all of the matrix) with ``groups`` and ``models`` (empty: all) and
    ``n_predict`` (the --n-predict option, None: the groups'), from the inputs alone.  ``compare``:
    compare-outputs is among the stages asked for (without it, a reference platform this machine
    cannot run does not stop a build).

    The prompts are bounded with the vocabulary of each model file that is already made in
    ``cache`` (harness.matrix.fit; a synthetic model only when the base tree is cached too, its
    vocabulary being a file of that tree; a derived model by the model it is derived from, whose
    vocabulary llama-quantize keeps); nothing is obtained, built or run.
    """
    selection = Selection.of(matrix, platforms, groups, models)
    problems = []
    for pname in selection.platform_names():
        for gname in selection.groups_with_models(pname):
            problems += _group_problems(matrix, matrix.platform(pname), gname, compare)
    if problems:
        raise InputError(one_line(problems))
    base = cached_base(matrix, cache)

    def vocabulary(model: str) -> Vocabulary | None:
        while matrix.models[model].kind == "quantized":  # llama-quantize keeps its source's vocabulary
            model = matrix.models[model].spec["from"]
        try:
            path = made_model_path(matrix.models[model], cache, base)
            return vocabulary_of(model_summary(path)) if path is not None else None
        except (ModelError, OSError):
            return None  # an unreadable file is the model step's to report; no bound from it

    refuse_unfit(selected_generations(selection, n_predict), vocabulary)
