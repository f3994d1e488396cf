"""How a configuration's programs are started on its platform, for the comparisons and the speed stage.

:class:`Sessions` turns a side (a configuration on a platform) into the engine's and llama-completion's
command lines of its build (with the platform's executable suffix and emulator: Wine for
windows-x86_64-cpu), says what is done with each process's stderr (the pin-ladder and placement
records), and gives the result cache's view of a side (its identity from its build's binaries).
"""

from __future__ import annotations

from pathlib import Path
from ...common.console import Console, Step
from ...matrix.config import Generation, Matrix, Platform
from ...matrix.loading import reload_count
from ...kinds.registry import gpu_of, os_of
from ...matrix.platforms import executable_suffix
from ...record import gpu
from ...record.cache import DigestMemo, ResultCache
from ...record.progress import InProgress
from ...record.json_files import write_json
from ...record.layout import RunLayout
from ...record.run import Run
from ..building.builds import Builds
from ..building.cross import Emulator
from .compare import GenerationSpec
from ..building.engine_target import ENGINE_TARGET
from .engine import engine_argv
from .generation_cache import SessionCache, side_identity
from .greedy import Hooks, Side


class Sessions:
    """The sides of one run: ``matrix``, ``run`` (its layout), ``builds`` (each side's build and emulator),
    ``progress`` (a side's ``generate`` step in progress), ``results_cache`` and ``console``.

    ``shown``: the console step of the comparison groups running (advanced after each generation), set by
    the comparisons while they run.
    ``placements``: platform -> config -> model -> where the buffers of the config's first generation landed
    (from its stderr), which the comparisons write as ``<config>/placement.json``.
    """

    def __init__(self, matrix: Matrix, run: Run, builds: Builds, progress: InProgress, results_cache: ResultCache,
                 console: Console):
        self.matrix, self.run, self.builds, self.progress = matrix, run, builds, progress
        self.results_cache, self.console = results_cache, console
        self.shown: Step | None = None
        self.placements: dict[str, dict[str, dict[str, dict]]] = {}

    def session_cache(self) -> SessionCache:
        """The result cache as the greedy runner uses it: a side's identity from its build's binaries."""
        def identity(side: Side):
            q = self.matrix.platform(side.platform)
            b = self.builds.build_variant(q, self.matrix.configs[side.config].build)
            emu = self.builds.emulator(q)
            sfx = executable_suffix(q)
            return side_identity(b.bin_dir, [f"{ENGINE_TARGET}{sfx}", f"llama-completion{sfx}"],
                                 emu.argv if emu else (), dict(emu.env) if emu else {}, kind=gpu_of(q))
        return SessionCache(self.results_cache, self.run.id, identity, DigestMemo(self.results_cache.root / "digests"))

    def hooks(self, p: Platform) -> Hooks:
        """How the greedy runner and the speed stage (harness.stages.speed.speed) start the engine and llama-completion
        of a configuration (a Side), with the platform's executable suffix and emulator (Wine for
        windows-x86_64-cpu), and what they do with stderr."""
        layout = self.run.layout

        def where(side: Side) -> tuple[Platform, Path, Emulator | None]:
            q = self.matrix.platform(side.platform)
            b = self.builds.build_variant(q, self.matrix.configs[side.config].build)
            return q, b.bin_dir, self.builds.emulator(q)

        def out_dir(side: Side) -> Path:
            write_json(layout.config_json(side.platform, side.config), self.matrix.configs[side.config])
            return layout.config(side.platform, side.config)

        def engine(side: Side, model_path: Path, gen: Generation) -> tuple[list[str], dict[str, str]]:
            q, bin_dir, emu = where(side)
            config = self.matrix.configs[side.config]
            argv = engine_argv(bin_dir / f"{ENGINE_TARGET}{executable_suffix(q)}", model_path, gen, config.args)
            return ([*emu.argv, *argv] if emu else argv), {**(dict(emu.env) if emu else {}), **config.env}

        def completion(side: Side, model_path: Path, prompt: str, gen: Generation) -> GenerationSpec:
            q, bin_dir, emu = where(side)
            config = self.matrix.configs[side.config]
            return GenerationSpec(binary=bin_dir / f"llama-completion{executable_suffix(q)}", model=model_path,
                                  prompt=prompt, n_predict=gen.n_predict, seed=gen.seed, ctx_size=gen.ctx_size,
                                  threads=gen.threads, args=config.args, env=dict(config.env), timeout_s=gen.timeout_s,
                                  launcher=emu.argv if emu else (), launcher_env=dict(emu.env) if emu else {},
                                  crlf_stdout=os_of(q).crlf_stdout)

        def stderr(side: Side, model: str, stem: Path, text: str) -> None:
            ladder = gpu.parse_ladder_lines(text)
            if ladder:
                write_json(RunLayout.beside(stem, "pin_ladder"), ladder)
            placement = gpu.buffer_placement(text)
            if placement["buffers"] or placement["routing"]:
                write_json(RunLayout.beside(stem, "placement"), placement)
                self.placements.setdefault(side.platform, {}).setdefault(side.config, {}).setdefault(model, placement)

        def progress(side: Side, what: str) -> None:
            if self.shown is not None:
                self.console.advance(self.shown, 1, f"{side.config} {what}")

        def reloads(side: Side) -> int:
            return reload_count(self.matrix, self.matrix.platform(side.platform), self.matrix.configs[side.config])

        return Hooks(engine=engine, completion=completion, out_dir=out_dir,
                     doing=lambda side: self.progress.doing(side.platform, side.config, "generate"),
                     relative=layout.relative, stderr=stderr, progress=progress, reloads=reloads)

