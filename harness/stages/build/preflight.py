"""Refusing what cannot run, before it runs: bad input is exit 2 (harness.common.errors.InputError), never a
failed run that looks like a broken patch.

Two moments:

* :func:`check_inputs`, before any build (harness.cli): what the inputs alone prove.  A
  generation whose prompt cannot fit its context (harness.matrix.fit, with the vocabulary of a
  model file already made), a group whose reference runs on a platform this machine cannot run,
  and a configuration that sets an environment variable of the CUDA backend on a platform
  without a GPU.
* :func:`option_refusal`, after the build and before any generation (harness.stages.outputs.refusals): whether
  the build's own llama-completion takes a configuration's arguments.  The exact prompt check
  of that moment is harness.matrix.fit's with the build's llama-tokenize (harness.stages.outputs.refusals).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping, Sequence

from ...common import proc
from ...common.errors import InputError
from ...matrix.config import Matrix, Platform
from ...matrix.fit import Vocabulary, refuse_unfit, selected_generations, selected_groups, vocabulary_of
from ...matrix.models import ModelError, made_model_path, model_summary
from ...matrix.platforms import cannot_run
from ..outputs.compare import find_error_line
from .source import cached_base

#: Environment variables only the CUDA backend reads (ggml/src/ggml-cuda: ``GGML_CUDA_*``; the CUDA
#: runtime: ``CUDA_VISIBLE_DEVICES``): a build without it ignores them, so a configuration setting one on
#: a platform without a GPU would compare nothing it claims to.
CUDA_ONLY_ENV = re.compile(r"^(GGML_CUDA_|CUDA_VISIBLE_DEVICES$)")

#: What llama.cpp's argument parser prints for an option the build takes but ignores (common/arg.cpp:
#: "no usable GPU found, --gpu-layers option will be ignored", "compiled without support for GPU
#: offload. Setting the split mode has no effect", ...).
IGNORED_OPTION = re.compile(r"^warning: .*(will be ignored|has no effect).*$", re.MULTILINE)


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
    CUDA-only variable in a configuration on a platform without a GPU."""
    out = []
    g = matrix.groups[group]
    if compare and g.reference_platform and cannot_run(p) is None:
        why = cannot_run(matrix.platform(g.reference_platform))
        if why:
            out.append(f"group {group} on {p.name} takes its reference from platform {g.reference_platform}, which "
                       f"cannot run here: {why} ({matrix.path}: groups.{group}.reference_platform)")
    if p.gpu == "none":
        for config in configs_on(matrix, p, group):
            for var in matrix.configs[config].env:
                if CUDA_ONLY_ENV.match(var):
                    out.append(f"configuration {config} of group {group} sets {var}, which only the CUDA backend "
                               f"reads, on {p.name}, a platform without a GPU ({matrix.path}: configs.{config}.env)")
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
    problems = []
    for pname in platforms or list(matrix.platforms):
        for gname in selected_groups(matrix, pname, groups, models):
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

    refuse_unfit(selected_generations(matrix, platforms, groups, models, n_predict), vocabulary)


def option_refusal(completion: Sequence[str], args: Sequence[str], env: Mapping[str, str],
                   timeout_s: float = 120.0) -> str | None:
    """Why a build's llama-completion does not take ``args``, or None when it does.

    ``completion``: its command (an emulator prefix, then the binary); ``env``: added to the
    environment (the emulator's and the configuration's).  It runs ``completion args --help``:
    llama.cpp's parser handles every argument before it prints the usage and exits 0
    (common/arg.cpp, ``common_params_parse``), so no model is loaded.  An argument it does not
    know, or a value it refuses, ends it with its ``error:`` line; an option the build ignores
    (a GPU option in a build without GPU offload) prints a warning :data:`IGNORED_OPTION` matches.
    ``timeout_s`` bounds the run, in seconds (past it: None, nothing proven).  Raises OSError when the
    program cannot be started.
    """
    done, _, err = proc.run_capture([*completion, *args, "--help"], env=env, timeout_s=timeout_s)
    if done.timed_out:
        return None  # nothing proven: the generations will show what it does
    if done.returncode != 0:
        return find_error_line(err) or f"llama-completion exited with code {done.returncode}"
    ignored = IGNORED_OPTION.search(err.decode("utf-8", "replace"))
    return ignored.group(0).strip() if ignored else None
