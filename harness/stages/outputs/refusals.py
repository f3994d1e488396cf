"""After the builds, before any generation: what the comparisons cannot run is refused (exit 2, one line).

A prompt that does not fit its context, counted by the model's own tokenizer, and a configuration's
arguments that its build of llama-completion does not take (:func:`option_refusal`; harness.stages.building.preflight
words the refusal).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Mapping, Sequence

from ...common import proc
from ...common.errors import InputError
from ...matrix.config import Platform
from ...matrix.fit import PlannedGeneration, Vocabulary, refuse_unfit, selected_generations, vocabulary_of
from ...kinds.registry import gpu_of, group_fits, os_of
from ...matrix.models import model_summary
from ...matrix.platforms import executable_suffix
from ..building.preflight import configs_on, one_line
from ..shape import Context
from .compare import TokenizeError, find_error_line, prompt_token_ids
from ...common.statuses import STEP_PASSED


#: What llama.cpp's argument parser prints for an option the build takes but ignores (common/arg.cpp:
#: "no usable GPU found, --gpu-layers option will be ignored", "compiled without support for GPU
#: offload. Setting the split mode has no effect", ...).
IGNORED_OPTION = re.compile(r"^warning: .*(will be ignored|has no effect).*$", re.MULTILINE)


def refuse_what_cannot_run(ctx: Context, platforms: Sequence[Platform]) -> None:
    """After the builds, before any generation: raise InputError (one line, harness.stages.building.preflight) for a
    prompt that does not fit its context, counted by the model's own tokenizer (harness.matrix.fit: only
    the prompts its bounds leave open), and for a configuration's arguments that the platform's build of
    llama-completion does not take.  The arguments are not checked in a forecast (``bases`` given): there
    an option the other upstream lacks is a finding, recorded as its comparisons fail."""
    names = [p.name for p in platforms]
    counted: dict[tuple[str, str], int | None] = {}

    def vocabulary(model: str) -> Vocabulary | None:
        try:
            return vocabulary_of(model_summary(ctx.model_path(model)))
        except Exception:  # the model step records it
            return None

    def count(gen: PlannedGeneration) -> int | None:
        if (gen.model, gen.prompt) not in counted:
            counted[(gen.model, gen.prompt)] = _count_prompt_tokens(ctx,
                [p for p in platforms if gen.group in p.groups], gen)
        return counted[(gen.model, gen.prompt)]

    refuse_unfit(selected_generations(replace(ctx.selection, platforms=tuple(names)), ctx.opts.n_predict),
                 vocabulary, count)
    if not ctx.builds.bases:
        problems = [why for p in platforms for why in _refused_options(ctx, p)]
        if problems:
            raise InputError(one_line(problems))


def _count_prompt_tokens(ctx: Context, platforms: Sequence[Platform], gen: PlannedGeneration) -> int | None:
    """The tokens of ``gen``'s prompt by its model's tokenizer: the llama-tokenize of the first of
    ``platforms`` whose fork build passed and has it; None when none can tell (the generation then runs)."""
    try:
        model = ctx.model_path(gen.model)
    except Exception:  # the model step records it
        return None
    for p in platforms:
        build = ctx.build_variant(p, "fork")
        binary = build.bin_dir / f"llama-tokenize{executable_suffix(p)}"
        if build.status != STEP_PASSED or not binary.is_file():
            continue
        try:
            emu = ctx.emulator(p)
            text = gen.text.encode("utf-8", "surrogateescape")
            return len(prompt_token_ids(
                binary, model, text, ctx.opts.work_dir.resolve() / "tmp",
                launcher=emu.argv if emu else (), launcher_env=dict(emu.env) if emu else None,
                crlf_stdout=os_of(p).crlf_stdout))
        except (RuntimeError, OSError, TokenizeError) as exc:
            ctx.say(f"[{p.name}] the tokens of prompt {gen.prompt} of {gen.model} could not be counted: {exc}")
    return None


def _refused_options(ctx: Context, p: Platform) -> list[str]:
    """Why ``p``'s builds of llama-completion do not take the arguments of the configurations its selected
    groups run there :func:`option_refusal`, one line per configuration refused; a group
    skipped for want of GPUs (harness.stages.outputs.compare_stage) is not checked."""
    out: list[str] = []
    checked: dict[tuple[str, tuple[str, ...]], str | None] = {}
    visible = gpu_of(p).visible()
    for gname in ctx.selection.groups_with_models(p.name):
        if group_fits(p, ctx.matrix.groups[gname], visible):
            continue
        for name in configs_on(ctx.matrix, p, gname):
            config = ctx.matrix.configs[name]
            if not config.args:
                continue
            build = ctx.build_variant(p, config.build)
            if build.status != STEP_PASSED:
                continue
            key = (config.build, config.args)
            if key not in checked:
                try:
                    emu = ctx.emulator(p)
                except RuntimeError:
                    continue  # the comparisons record it
                binary = str(build.bin_dir / f"llama-completion{executable_suffix(p)}")
                checked[key] = option_refusal([*emu.argv, binary] if emu else [binary], config.args,
                                              {**(dict(emu.env) if emu else {}), **config.env})
            if checked[key]:
                out.append(f"configuration {name} of group {gname} on {p.name}: the {config.build} build's "
                           f"llama-completion does not take {' '.join(config.args)}: {checked[key]} "
                           f"({ctx.matrix.path}: configs.{name}.args)")
    return out


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
