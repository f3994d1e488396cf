"""Expectations: what each configuration must do beyond its tokens, checked in every run from its records.

The fork exists so that expert tensors in host memory are page-locked; a silent fallback
to pageable ``CPU`` buffers leaves every greedy token unchanged.  So every load of a
configuration's model (the engine's and each llama-completion run's stderr, which
harness.record.gpu parses into ``*.placement.json`` and ``*.pin-ladder.json``) is checked
against four rules:

``placement``
    which buffer type holds the expert tensors, per layer range.  llama logs one line per
    model buffer (``load_tensors:    CUDA_Host model buffer size =  4733.00 MiB``) named
    after the buffer actually allocated, so a host buffer that fell back to plain memory
    shows as ``CPU``.  The experts' bytes per layer come from the model file
    (``<platform>/models/<model>.json``, harness.matrix.models.model_summary): the buffer
    types expected for a layer range must hold at least those bytes, and no buffer type
    may hold more expert bytes than it is expected to plus every non-expert byte of the
    model.
``weights``
    every model buffer's type is one of a list (on the CPU platform ``CPU_Mapped`` when
    the model is memory-mapped: a silent loss of mmap makes it ``CPU``).
``pinned``
    the fraction of the experts' bytes that is page-locked, measured against the experts'
    size, not against what was requested: a model buffer with no pin-ladder record never
    asked to be pinned and counts as pageable.  Of a buffer of S bytes, X of them experts,
    whose allocation was granted G page-locked bytes, at least ``max(0, G - (S - X))``
    expert bytes are page-locked (the rest of the buffer can take up at most S - X of
    them); the fraction is the sum over the model buffers divided by the experts' bytes.
``warnings``
    warnings that must appear and warnings that must not (:data:`WARNINGS`).

A configuration declares rules in matrix.yaml (``configs.<name>.expectations``, schema
``#/$defs/expectations``); every rule it leaves out gets the default of
:func:`default_expectations`, derived from its build, ``env``, ``args`` and the platform
(docs/checks.md states the rule).  Each configuration that generated gets a step
``expectations`` with its own status, detail, log (``<config>/expectations.log``) and
record (``<config>/expectations.json``); harness.analysis.signatures gives a failed one
its signature, e.g. ``placement: cuda-pin-all/moe-large: expert tensors of layers 0-7 in
CPU (4733 MiB), expected CUDA_Host``.  A record that is missing or cannot be read makes
the step ``incomplete``, never ``passed``.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from ..matrix.config import Platform, RunConfig
from ..record.gpu import SUMMARY_KINDS
from ..record.results import Failure, RunLayout, StepRecord, write_json

if TYPE_CHECKING:  # harness.stages.checks imports this module
    from .checks import CheckContext

#: The step every configuration that generated gets.
STEP_NAME = "expectations"

#: The rules, in the order they are checked and reported.
RULES = ("placement", "weights", "pinned", "warnings")

#: The warnings a configuration can require or forbid, and how each is recognised.  The pin ladder's
#: WARN lines (patch 0002, harness.record.gpu.parse_ladder_lines) and the loader's
#: GGML_CUDA_MOE_PIN_LAYERS lines (patch 0003, harness.record.gpu.buffer_placement's ``routing``).
#: The same names are the schema's ``#/$defs/warning`` (tests/test_expectations.py keeps them equal).
WARNINGS = {
    "partial-pin": "the pin ladder pinned part of a host buffer (WARN pin ladder: partial pin)",
    "no-pin": "the pin ladder pinned none of a host buffer it tried to pin (WARN pin ladder: no pin)",
    "pin-layers-invalid": "GGML_CUDA_MOE_PIN_LAYERS is not a positive integer and is ignored",
    "pin-layers-clamped": "GGML_CUDA_MOE_PIN_LAYERS is larger than the model's layer count, which is used instead",
    "pin-layers-no-effect": "GGML_CUDA_MOE_PIN_LAYERS has no effect (the model is memory-mapped, or no host buffer)",
}
_ROUTING_WARNINGS = (("pin-layers-invalid", "- ignoring it"), ("pin-layers-clamped", "is larger than the number of layers"),
                     ("pin-layers-no-effect", "has no effect"))

#: llama prints buffer sizes in MiB with two decimals: a logged size is within half of 0.01 MiB of the bytes.
LOGGED_MIB_TOLERANCE_BYTES = int(0.005 * 2**20) + 1
#: The pin ladder's smallest chunk (GGML_CUDA_PIN_CHUNK_MIN_MB, default 16 MiB, ggml-cuda/pin-ladder.cuh): under a
#: simulated total cap the ladder stops within one smallest chunk of the cap.
PIN_CHUNK_MIN_BYTES = 16 * 2**20
#: Two fractions closer than this are equal (bytes over gigabytes: far below one byte in a million).
FRACTION_EPSILON = 1e-9

_MMAP_OFF_MODES = ("none", "dio")
_LAYER_KEY = re.compile(r"^(\d+)(?:-(\d*))?$")


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class LayerRange:
    """Expert tensors of layers ``first``..``last`` (inclusive; None: to the model's last layer) belong in
    ``buffer_type``, a buffer type name as llama logs it or an fnmatch pattern of such names."""

    first: int
    last: int | None
    buffer_type: str

    def layers(self, n_layer: int) -> range:
        """The layers of a model with ``n_layer`` layers that this range covers (layers past the model dropped)."""
        return range(self.first, n_layer if self.last is None else min(self.last + 1, n_layer))

    def describe(self) -> str:
        """``0-3``, ``4-`` or ``5``: the range as matrix.yaml writes it."""
        if self.last is None:
            return f"{self.first}-"
        return str(self.first) if self.last == self.first else f"{self.first}-{self.last}"


@dataclass(frozen=True)
class Pinned:
    """The page-locked fraction of the experts' bytes: at least ``min``, at most ``max`` (None: no bound).

    ``cap_bytes``: GGML_CUDA_PIN_SIM_TOTAL_MAX_MB in bytes; the fraction must then also reach what that
    cap allows the model buffers of type ``capped_type`` (see :func:`cap_floor_bytes`).
    """

    min: float | None = None
    max: float | None = None
    cap_bytes: int | None = None
    capped_type: str = "CUDA_Host"

    def describe(self) -> str:
        """The rule in words: ``1``, ``at least 0.4``, ``0.5``, ``at least what a 2048 MiB cap allows``."""
        if self.min is not None and self.min == self.max:
            text = f"{self.min:.4g}"
        else:
            text = " and ".join(x for x in (f"at least {self.min:.4g}" if self.min is not None else "",
                                            f"at most {self.max:.4g}" if self.max is not None else "") if x)
        if self.cap_bytes is not None:
            text = " and ".join(x for x in (text, f"at least what a {self.cap_bytes / 2**20:g} MiB cap allows") if x)
        return text or "any"


@dataclass(frozen=True)
class Expectations:
    """Every rule of one configuration on one platform for one model.  A rule that is None is not checked;
    ``origin`` says per rule where it came from: ``declared``, ``default: <why>`` or ``not checked: <why>``."""

    experts: tuple[LayerRange, ...] | None = None
    weights: tuple[str, ...] | None = None
    pinned: Pinned | None = None
    present: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    origin: Mapping[str, str] = field(default_factory=dict)


def _arg_value(args: Sequence[str], *names: str) -> str | None:
    """The value after the last of ``names`` in ``args`` (``--flag value`` or ``--flag=value``), or None."""
    value = None
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                value = args[i + 1]
            elif a.startswith(n + "="):
                value = a[len(n) + 1:]
    return value


def uses_mmap(args: Sequence[str]) -> bool:
    """True when llama memory-maps the model with these arguments: load mode ``auto`` (default), ``mmap``,
    ``mlock`` or ``mmap+mlock``; False for ``--load-mode none``/``dio`` and ``--no-mmap``
    (common/arg.cpp at the pinned commit)."""
    if "--no-mmap" in args:
        return False
    return _arg_value(args, "--load-mode", "-lm") not in _MMAP_OFF_MODES


def pin_layers(env: Mapping[str, str]) -> int | None:
    """GGML_CUDA_MOE_PIN_LAYERS as the fork reads it (patch 0003, src/llama-moe-pin.h): a positive decimal
    integer, else None (unset, or a value the fork ignores with a warning: ``4x``, ``0``, ``-1``)."""
    raw = env.get("GGML_CUDA_MOE_PIN_LAYERS")
    if raw is None or not raw.isdigit() or int(raw) < 1:
        return None
    return int(raw)


def _mib_env(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "")
    return int(raw) * 2**20 if raw.isdigit() and int(raw) > 0 else None


def default_expectations(platform: Platform, config: RunConfig, model: Mapping[str, Any]) -> Expectations:
    """The default rules of ``config`` on ``platform`` for ``model`` (its summary: ``n_layer``,
    ``expert_tensor_bytes_by_layer``), derived from the build, ``env`` and ``args`` (docs/checks.md):

    * CPU platform (``gpu: none``): weights and experts in ``CPU_Mapped`` when the model is
      memory-mapped (:func:`uses_mmap`), in ``CPU`` otherwise; ``CPU_REPACK`` (weights repacked for
      the CPU's kernels) is allowed beside either.  Nothing is pinned, so no pinned or warning rule.
    * CUDA platform without ``--cpu-moe``: experts in a device buffer (``CUDA<n>``).
    * CUDA with ``--cpu-moe`` and mmap: experts in ``CPU_Mapped`` (llama avoids host buffers with mmap).
    * CUDA with ``--cpu-moe``, mmap off: experts in the host buffer, ``CUDA_Host``, or ``CPU`` under
      GGML_CUDA_NO_PINNED (the host buffer type then hands out plain memory); on the fork with a valid
      GGML_CUDA_MOE_PIN_LAYERS=N the experts of layers N and up in ``CPU``.  On the fork (whose pin
      ladder logs every host allocation): pinned exactly 0 under GGML_CUDA_NO_PINNED; else the
      experts' share of layers 0..N-1 under PIN_LAYERS=N, else 1.0; under a simulated total cap
      (GGML_CUDA_PIN_SIM_TOTAL_MAX_MB) at least what the cap allows, with a ``partial-pin`` warning;
      under GGML_CUDA_PIN_SIM_STICKY a ``no-pin`` warning and no bound; with no simulated limit no
      ``partial-pin`` or ``no-pin`` warning.  PIN_LAYERS: ``pin-layers-invalid`` present for a value
      the fork ignores and absent otherwise, ``pin-layers-clamped`` present when N exceeds the
      model's layers and absent otherwise.
    * ``-ot``/``--override-tensor``/``--n-cpu-moe`` place tensors by pattern: no default placement
      (declare one).  Upstream's build logs no pin records: no pinned or pin warning rules.
    """
    args, env = config.args, config.env
    mmap = uses_mmap(args)
    origin: dict[str, str] = {}
    n_layer = int(model.get("n_layer") or 0)
    if platform.gpu == "none":
        home = "CPU_Mapped" if mmap else "CPU"
        why = f"CPU platform, {'mmap' if mmap else 'mmap off'}"
        origin.update(placement=f"default: {why}", weights=f"default: {why}",
                      pinned="not checked: nothing is pinned on the CPU platform",
                      warnings="not checked: no pin warnings on the CPU platform")
        return Expectations(experts=(LayerRange(0, None, home),), weights=(home, "CPU_REPACK"), origin=origin)
    origin["weights"] = "not checked: model weights are split between device and host buffers by design"
    if _arg_value(args, "-ot", "--override-tensor", "-ncmoe", "--n-cpu-moe") is not None:
        origin.update(placement="not checked: tensors placed by pattern (-ot/--n-cpu-moe); declare the placement",
                      pinned="not checked: placement by pattern", warnings="not checked: placement by pattern")
        return Expectations(origin=origin)
    host_experts = "--cpu-moe" in args or "-cmoe" in args
    if not host_experts:
        origin.update(placement="default: CUDA platform, experts offloaded (no --cpu-moe)",
                      pinned="not checked: no expert tensors in host memory",
                      warnings="not checked: no expert tensors in host memory")
        return Expectations(experts=(LayerRange(0, None, "CUDA[0-9]*"),), origin=origin)
    if mmap:
        origin.update(placement="default: --cpu-moe with mmap (no host buffer)",
                      pinned="not checked: a memory-mapped model is not pinned",
                      warnings="not checked: a memory-mapped model is not pinned")
        return Expectations(experts=(LayerRange(0, None, "CPU_Mapped"),), origin=origin)
    no_pinned = "GGML_CUDA_NO_PINNED" in env  # tested for presence by the fork and upstream
    host = "CPU" if no_pinned else "CUDA_Host"
    fork = config.build == "fork"
    n_pin = pin_layers(env) if fork else None
    if n_pin is not None and n_pin < max(n_layer, 1):
        experts = (LayerRange(0, n_pin - 1, host), LayerRange(n_pin, None, "CPU"))
        origin["placement"] = f"default: --cpu-moe, mmap off, GGML_CUDA_MOE_PIN_LAYERS={n_pin}" + \
                              (", GGML_CUDA_NO_PINNED" if no_pinned else "")
    else:
        experts = (LayerRange(0, None, host),)
        origin["placement"] = "default: --cpu-moe, mmap off" + (", GGML_CUDA_NO_PINNED" if no_pinned else "")
    if not fork:
        origin.update(pinned="not checked: upstream's build logs no pin records",
                      warnings="not checked: upstream's build logs no pin warnings")
        return Expectations(experts=experts, origin=origin)
    by_layer = list(model.get("expert_tensor_bytes_by_layer") or [])
    total = sum(by_layer)
    cap = _mib_env(env, "GGML_CUDA_PIN_SIM_TOTAL_MAX_MB")
    sticky = env.get("GGML_CUDA_PIN_SIM_STICKY", "0") not in ("", "0")
    present: list[str] = []
    absent: list[str] = []
    if no_pinned:
        pinned = Pinned(0.0, 0.0)
        why = "GGML_CUDA_NO_PINNED: nothing pinned"
    elif sticky:
        pinned = None
        why = "not checked: GGML_CUDA_PIN_SIM_STICKY refuses every call after the first refusal"
        present.append("no-pin")
    elif cap is not None:
        pinned = Pinned(cap_bytes=cap)
        why = f"GGML_CUDA_PIN_SIM_TOTAL_MAX_MB={cap // 2**20}: at least what the cap allows"
        present.append("partial-pin")
    else:
        share = 1.0
        if n_pin is not None and n_pin < n_layer and total:
            share = sum(by_layer[:n_pin]) / total
        pinned = Pinned(share, share)
        why = f"experts of layers 0-{min(n_pin, n_layer) - 1} pinned" if n_pin is not None else "full pin"
        absent += ["partial-pin", "no-pin"]
    origin["pinned"] = why if why.startswith("not checked") else f"default: {why}"
    raw_pin = env.get("GGML_CUDA_MOE_PIN_LAYERS")
    if raw_pin is not None:
        (absent if n_pin is not None else present).append("pin-layers-invalid")
        (present if n_pin is not None and n_layer and n_pin > n_layer else absent).append("pin-layers-clamped")
    origin["warnings"] = "default: from GGML_CUDA_NO_PINNED, GGML_CUDA_PIN_SIM_*, GGML_CUDA_MOE_PIN_LAYERS"
    return Expectations(experts=experts, pinned=pinned, present=tuple(present), absent=tuple(absent), origin=origin)


def declared_applies(config: RunConfig, platform: Platform) -> bool:
    """True when ``config``'s declared expectations hold on ``platform`` (their ``gpu`` key, when given,
    names the platform's GPU kind)."""
    decl = config.expectations
    return bool(decl) and decl.get("gpu", platform.gpu) == platform.gpu


def parse_experts(value: str | Mapping[str, str]) -> tuple[LayerRange, ...]:
    """matrix.yaml's ``experts``: one buffer type for every layer, or ``{"0-3": CUDA_Host, "4-": CPU}``.

    Raises ValueError for a range whose end precedes its start (the schema checks the key's form).
    """
    if isinstance(value, str):
        return (LayerRange(0, None, value),)
    out = []
    for key, buft in value.items():
        m = _LAYER_KEY.match(str(key))
        if not m:
            raise ValueError(f"layer range {key!r}: write N, N-M or N-")
        first = int(m.group(1))
        last = first if m.group(2) is None else (int(m.group(2)) if m.group(2) else None)
        if last is not None and last < first:
            raise ValueError(f"layer range {key!r}: ends before it starts")
        out.append(LayerRange(first, last, buft))
    return tuple(sorted(out, key=lambda r: r.first))


def parse_pinned(value: float | Mapping[str, float]) -> Pinned:
    """matrix.yaml's ``pinned``: an exact fraction, or ``{min, max}``."""
    if isinstance(value, (int, float)):
        return Pinned(float(value), float(value))
    return Pinned(value.get("min"), value.get("max"))


def expectations_for(platform: Platform, config: RunConfig, model: Mapping[str, Any]) -> Expectations:
    """The rules that hold for ``config`` on ``platform`` and ``model``: each declared rule (when the
    declaration applies on this platform, :func:`declared_applies`), else its default.  Raises ValueError
    for a declared layer range that cannot be read."""
    base = default_expectations(platform, config, model)
    if not declared_applies(config, platform):
        return base
    decl = config.expectations
    origin = dict(base.origin)
    experts, weights, pinned, present, absent = base.experts, base.weights, base.pinned, base.present, base.absent
    if "experts" in decl:
        experts, origin["placement"] = parse_experts(decl["experts"]), "declared"
    if "weights" in decl:
        weights, origin["weights"] = tuple(decl["weights"]), "declared"
    if "pinned" in decl:
        pinned, origin["pinned"] = parse_pinned(decl["pinned"]), "declared"
    if "warnings" in decl:
        present = tuple(decl["warnings"].get("present", ()))
        absent = tuple(decl["warnings"].get("absent", ()))
        origin["warnings"] = "declared"
    return Expectations(experts, weights, pinned, present, absent, origin)


# --------------------------------------------------------------------------- facts of one load


@dataclass(frozen=True)
class Buffer:
    """One model buffer of a load: its type name as logged and its size in bytes (from the logged MiB)."""

    buffer_type: str
    bytes: int


@dataclass
class Finding:
    """The outcome of one rule on one load: ``status`` passed, failed or incomplete; ``key`` stable across
    runs (no byte counts); ``message`` for people (with sizes); ``evidence`` the record lines it rests on."""

    rule: str
    status: str
    key: str
    message: str
    evidence: list[str] = field(default_factory=list)


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def _layers_text(layers: Sequence[int]) -> str:
    """``0-7``, ``0-3, 6`` : consecutive layers joined into ranges."""
    parts: list[str] = []
    start = prev = None
    for n in list(layers) + [None]:
        if start is not None and (n is None or n != prev + 1):
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if n is not None and start is None:
            start = n
        prev = n
    return ", ".join(parts)


def model_buffers(placement: Mapping[str, Any]) -> list[Buffer]:
    """The model (weight) buffers of a placement record (harness.record.gpu.buffer_placement): the
    ``load_tensors`` lines whose buffer is ``model``, in log order."""
    return [Buffer(b["buffer_type"], round(float(b["mib"]) * 2**20)) for b in placement.get("buffers", [])
            if b.get("stage") == "load_tensors" and b.get("what") == "model"]


def _matches(buffer_type: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(buffer_type, pattern)


@dataclass
class ExpertPlacement:
    """Where a load's expert bytes are, as far as buffer sizes prove it.

    ``expected``: per layer range, (range text, pattern, expected expert bytes, bytes of the buffers of
    that pattern); ``per_buffer``: expert bytes attributed to each model buffer (index in
    :func:`model_buffers` order): the expected bytes where the buffer's type holds them, else the least a
    buffer of that size must hold (its size minus every non-expert byte of the model).
    """

    expected: list[tuple[str, str, int, int]]
    per_buffer: list[int]


def place_experts(buffers: Sequence[Buffer], by_layer: Sequence[int], other_bytes: int,
                  ranges: Sequence[LayerRange]) -> tuple[ExpertPlacement, list[Finding]]:
    """Check that the expert tensors of each layer range are in its buffer type, from buffer sizes.

    ``buffers``: the load's model buffers; ``by_layer``: expert bytes per layer (the model file);
    ``other_bytes``: the model's non-expert tensor bytes; ``ranges``: the expected placement.  A range
    fails when the buffers of its type hold fewer bytes than its experts (``expert tensors of layers 0-7
    in CPU (4733 MiB), expected CUDA_Host``, naming the buffer types that hold more than they should), or
    when a buffer type holds more than its expected experts plus every non-expert byte (experts of other
    layers are there).  Returns the attribution (for the pinned rule) and one finding per failure, or one
    passed finding.
    """
    n_layer = len(by_layer)
    have: dict[str, int] = {}
    for b in buffers:
        have[b.buffer_type] = have.get(b.buffer_type, 0) + b.bytes
    tol = LOGGED_MIB_TOLERANCE_BYTES * max(1, len(buffers))
    by_pattern: dict[str, list[int]] = {}  # ranges of one buffer type are checked together
    for r in ranges:
        by_pattern.setdefault(r.buffer_type, []).extend(r.layers(n_layer))
    groups = [(LayerRange(0, None, pattern), sorted(set(layers)), sum(by_layer[i] for i in set(layers)))
              for pattern, layers in by_pattern.items() if layers]

    def expected_in(buffer_type: str) -> int:
        return sum(need for r, _, need in groups if _matches(buffer_type, r.buffer_type))

    excess = {t: n - expected_in(t) for t, n in have.items() if n > expected_in(t) + other_bytes + tol}
    findings: list[Finding] = []
    expected = []
    for r, layers, need in groups:
        got = sum(n for t, n in have.items() if _matches(t, r.buffer_type))
        expected.append((_layers_text(layers), r.buffer_type, need, got))
        if got + tol >= need:
            continue
        where = sorted(excess, key=lambda t: -excess[t]) or sorted(t for t in have if not _matches(t, r.buffer_type))
        found = ", ".join(f"{t} ({_mib(have[t])})" for t in where) or "no model buffer"
        what = f"expert tensors of layers {_layers_text(layers)}"
        if got == 0:
            findings.append(Finding("placement", "failed", f"{what} in {', '.join(where) or 'none'}, expected {r.buffer_type}",
                                    f"{what} in {found}, expected {r.buffer_type}"))
        else:
            findings.append(Finding("placement", "failed",
                                    f"{what} not all in {r.buffer_type} (also in {', '.join(where) or 'none'})",
                                    f"{what}: {r.buffer_type} holds {_mib(got)} of their {_mib(need)}; "
                                    f"more than expected in {found}"))
    short = {f.key for f in findings}
    for t, extra in sorted(excess.items()):
        if any(t in k for k in short):
            continue  # already named as where a short range's experts went
        findings.append(Finding("placement", "failed", f"expert tensors of other layers in {t}",
                                f"{t} holds {_mib(have[t])}: {_mib(extra)} more than its expected experts "
                                f"({_mib(expected_in(t))}) plus every non-expert tensor ({_mib(other_bytes)})"))
    per_buffer = []
    for b in buffers:
        share = expected_in(b.buffer_type)
        if share and b.buffer_type not in excess:
            per_buffer.append(min(b.bytes, round(share * b.bytes / have[b.buffer_type])))
        else:
            per_buffer.append(max(0, b.bytes - other_bytes))
    if not findings:
        text = "; ".join(f"layers {lay} in {pat} ({_mib(got)} holding {_mib(need)} of experts)"
                         for lay, pat, need, got in expected)
        findings.append(Finding("placement", "passed", "as expected", f"expert tensors: {text}"))
    return ExpertPlacement(expected, per_buffer), findings


def ladder_grants(buffers: Sequence[Buffer], ladder: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """Page-locked bytes granted to each model buffer: the pin-ladder summary record (cudaMallocHost,
    ladder or disabled) whose requested bytes match the buffer's logged size, each record used once;
    None for a buffer with no such record (it never asked to be pinned)."""
    free = [r for r in ladder if r.get("kind") in SUMMARY_KINDS]
    out: list[int | None] = []
    for b in buffers:
        hit = next((r for r in free if abs(int(r["requested"]) - b.bytes) <= LOGGED_MIB_TOLERANCE_BYTES), None)
        if hit is None:
            out.append(None)
            continue
        free.remove(hit)
        out.append(int(hit["granted"]))
    return out


def pinned_expert_bytes(buffers: Sequence[Buffer], experts_in: Sequence[int], grants: Sequence[int | None]) -> int:
    """Expert bytes certainly page-locked: per buffer ``max(0, G - (S - X))`` (S its bytes, X its expert
    bytes, G granted; 0 without a grant), summed."""
    return sum(max(0, (g or 0) - (b.bytes - x)) for b, x, g in zip(buffers, experts_in, grants))


def cap_floor_bytes(rule: Pinned, buffers: Sequence[Buffer], experts_in: Sequence[int]) -> int:
    """Expert bytes a simulated total cap of ``rule.cap_bytes`` must still let be page-locked: the model
    buffers of ``rule.capped_type`` (S bytes, X of them experts) are granted at least ``min(cap, S)`` less
    one smallest ladder chunk (:data:`PIN_CHUNK_MIN_BYTES`), of which at least that minus ``S - X`` are
    expert bytes."""
    if rule.cap_bytes is None:
        return 0
    s = sum(b.bytes for b in buffers if _matches(b.buffer_type, rule.capped_type))
    x = sum(e for b, e in zip(buffers, experts_in) if _matches(b.buffer_type, rule.capped_type))
    return max(0, min(rule.cap_bytes, s) - PIN_CHUNK_MIN_BYTES - (s - x))


def warnings_found(placement: Mapping[str, Any], ladder: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The :data:`WARNINGS` a load logged, each with the log lines that show it."""
    found: dict[str, list[str]] = {}
    for r in ladder:
        kind = r.get("warning") if r.get("kind") == "repeated" else r.get("kind")
        name = {"partial": "partial-pin", "none": "no-pin"}.get(str(kind))
        if name:
            found.setdefault(name, []).append(str(r.get("line", "")))
    for line in placement.get("routing", []):
        for name, marker in _ROUTING_WARNINGS:
            if marker in line:
                found.setdefault(name, []).append(line)
    return found


def check_load(exp: Expectations, placement: Mapping[str, Any], ladder: Sequence[Mapping[str, Any]],
               model: Mapping[str, Any]) -> tuple[list[Finding], dict[str, Any]]:
    """Check one load (its placement record, its pin-ladder records, the model's summary) against ``exp``.

    Returns the findings (one or more per checked rule) and the measured facts: ``model_buffers``
    ({type: bytes}), ``expert_bytes``, ``pinned_expert_bytes``, ``pinned_fraction`` (None without
    experts) and ``warnings`` (names found).  A rule that needs what the records do not hold (no model
    buffer line; no per-layer expert bytes) gives an ``incomplete`` finding.
    """
    buffers = model_buffers(placement)
    by_layer = [int(x) for x in model.get("expert_tensor_bytes_by_layer") or []]
    expert_total = int(model.get("expert_tensor_bytes") or 0)
    other = max(0, int(model.get("tensor_bytes") or 0) - expert_total)
    findings: list[Finding] = []
    facts: dict[str, Any] = {"model_buffers": {}, "expert_bytes": expert_total, "pinned_expert_bytes": None,
                             "pinned_fraction": None, "warnings": []}
    for b in buffers:
        facts["model_buffers"][b.buffer_type] = facts["model_buffers"].get(b.buffer_type, 0) + b.bytes
    if not buffers:
        for rule in ("placement", "weights", "pinned"):
            if _rule_on(exp, rule):
                findings.append(Finding(rule, "incomplete", "no model buffer in the record",
                                        "the placement record has no load_tensors model buffer line"))
    else:
        placed = None
        if exp.experts is not None:
            if expert_total == 0:
                findings.append(Finding("placement", "passed", "no expert tensors", "the model has no expert tensors"))
            elif sum(by_layer) != expert_total:
                findings.append(Finding("placement", "incomplete", "no per-layer expert bytes",
                                        "the model summary has no expert_tensor_bytes_by_layer matching its experts"))
            else:
                placed, found = place_experts(buffers, by_layer, other, exp.experts)
                findings += found
        if exp.weights is not None:
            wrong = [b for b in buffers if not any(_matches(b.buffer_type, p) for p in exp.weights)]
            if wrong:
                types = sorted({b.buffer_type for b in wrong})
                findings.append(Finding("weights", "failed",
                                        f"model weights in {', '.join(types)}, expected {' or '.join(exp.weights)}",
                                        "model weights in " + ", ".join(f"{b.buffer_type} ({_mib(b.bytes)})" for b in wrong)
                                        + f", expected {' or '.join(exp.weights)}"))
            else:
                findings.append(Finding("weights", "passed", "as expected",
                                        "model buffers: " + ", ".join(f"{b.buffer_type} ({_mib(b.bytes)})" for b in buffers)))
        if exp.pinned is not None and expert_total:
            experts_in = placed.per_buffer if placed else [max(0, b.bytes - other) for b in buffers]
            grants = ladder_grants(buffers, ladder)
            pinned = pinned_expert_bytes(buffers, experts_in, grants)
            fraction = pinned / expert_total
            facts.update(pinned_expert_bytes=pinned, pinned_fraction=round(fraction, 6))
            rule = exp.pinned
            low = rule.min
            floor = cap_floor_bytes(rule, buffers, experts_in)
            if rule.cap_bytes is not None:
                low = max(low or 0.0, floor / expert_total)
            ok = (low is None or fraction + FRACTION_EPSILON >= low) and \
                 (rule.max is None or fraction <= rule.max + FRACTION_EPSILON)
            grant_text = ", ".join(f"{b.buffer_type} {_mib(b.bytes)}: " + ("no pin record" if g is None else f"granted {_mib(g)}")
                                   for b, g in zip(buffers, grants) if g is not None or _matches(b.buffer_type, "CUDA_Host") or b.bytes > other)
            message = (f"{fraction:.3f} of the expert tensors pinned ({_mib(pinned)} of {_mib(expert_total)}), "
                       f"expected {rule.describe()}" + (f" ({floor / expert_total:.3f})" if rule.cap_bytes else "")
                       + f"; {grant_text}")
            key = f"pinned fraction {'below' if low is not None and fraction + FRACTION_EPSILON < low else 'above'} " \
                  f"{rule.describe()}"
            findings.append(Finding("pinned", "passed" if ok else "failed", "as expected" if ok else key, message,
                                    [str(r.get("line", "")) for r in ladder if r.get("kind") in SUMMARY_KINDS][:6]))
    found = warnings_found(placement, ladder)
    facts["warnings"] = sorted(found)
    if exp.present or exp.absent:
        bad = False
        for name in exp.present:
            if name not in found:
                bad = True
                findings.append(Finding("warnings", "failed", f"warning {name} missing",
                                        f"warning {name} missing: {WARNINGS[name]}"))
        for name in exp.absent:
            if name in found:
                bad = True
                findings.append(Finding("warnings", "failed", f"unexpected warning {name}",
                                        f"unexpected warning {name}: {found[name][0]}", found[name][:3]))
        if not bad:
            findings.append(Finding("warnings", "passed", "as expected",
                                    f"present: {', '.join(exp.present) or '-'}; absent: {', '.join(exp.absent) or '-'}"))
    return findings, facts


def _rule_on(exp: Expectations, rule: str) -> bool:
    return {"placement": exp.experts is not None, "weights": exp.weights is not None,
            "pinned": exp.pinned is not None, "warnings": bool(exp.present or exp.absent)}[rule]


# --------------------------------------------------------------------------- the step


def _read_json(path: Path) -> tuple[Any, str]:
    """(parsed JSON, "") or (None, why it cannot be read)."""
    try:
        return json.loads(path.read_text(encoding="utf-8")), ""
    except FileNotFoundError:
        return None, f"{path.name} missing"
    except (OSError, ValueError) as exc:
        return None, f"{path.name} cannot be read ({exc})"


def _failed_models(step: StepRecord | None) -> set[str]:
    """Models whose generations the configuration's generate step records as failed (their records say
    nothing about placement: the generate step holds that failure)."""
    if step is None:
        return set()
    return {f.model for f in step.failures if f.model}


def check_config(layout: RunLayout, platform: Platform, config: RunConfig,
                 generate: StepRecord | None) -> StepRecord:
    """The ``expectations`` step of ``config`` on ``platform``: every load under ``<config>/gen/<model>/``
    (one per ``.stderr`` file) checked with :func:`check_load`; writes ``<config>/expectations.json``
    (rules, their origin, per load the facts and findings) and ``<config>/expectations.log``.

    Status: ``failed`` when a rule failed on a load; else ``incomplete`` when a record a rule needs is
    missing or unreadable (a load whose stderr has no placement record, a model summary missing) on a
    model whose generations did not fail; else ``passed`` when something was checked; ``skipped`` when
    every load belongs to a failed generation or nothing is checked.  ``failures`` hold one
    ``expectation`` fact per failed rule and model.
    """
    failed_models = _failed_models(generate)
    loads: list[dict[str, Any]] = []
    rules: dict[str, dict[str, Any]] = {}
    for model, stem, stderr in layout.load_logs(platform.name, config.name):
        entry: dict[str, Any] = {"model": model, "load": stem, "log": layout.relative(stderr), "findings": []}
        loads.append(entry)
        if model in failed_models:
            entry["skipped"] = "a generation of this model failed (see the generate step)"
            continue
        summary, why = _read_json(layout.model_json(platform.name, model))
        if summary is None:
            entry["findings"].append(asdict(Finding("records", "incomplete", "model summary missing",
                                                    f"model summary: {why}")))
            continue
        try:
            exp = expectations_for(platform, config, summary)
        except ValueError as exc:
            entry["findings"].append(asdict(Finding("records", "incomplete", "expectations unreadable", str(exc))))
            continue
        rules.setdefault(model, _describe_rules(exp))
        if not any(_rule_on(exp, r) for r in RULES):
            entry["skipped"] = "no rule holds for this configuration"
            continue
        placement, why = _read_json(stderr.with_name(stem + ".placement.json"))
        if placement is None:
            entry["findings"].append(asdict(Finding("records", "incomplete", "no placement record",
                                                    f"no placement record for {layout.relative(stderr)}: {why} "
                                                    "(its stderr has no buffer lines)")))
            continue
        ladder_path = stderr.with_name(stem + ".pin-ladder.json")
        ladder: Any = []
        if ladder_path.exists():  # no file: the load logged no pin-ladder line
            ladder, why = _read_json(ladder_path)
            if not isinstance(ladder, list):
                entry["findings"].append(asdict(Finding("records", "incomplete", "pin-ladder record unreadable",
                                                        f"{layout.relative(ladder_path)}: {why or 'not a list'}")))
                continue
        findings, facts = check_load(exp, placement, ladder, summary)
        entry["facts"] = facts
        entry["findings"] = [asdict(f) for f in findings]
    return _step(layout, platform, config, loads, rules)


def _describe_rules(exp: Expectations) -> dict[str, Any]:
    return {"experts": [[r.describe(), r.buffer_type] for r in exp.experts] if exp.experts is not None else None,
            "weights": list(exp.weights) if exp.weights is not None else None,
            "pinned": exp.pinned.describe() if exp.pinned is not None else None,
            "warnings": {"present": list(exp.present), "absent": list(exp.absent)},
            "origin": dict(exp.origin)}


def _step(layout: RunLayout, platform: Platform, config: RunConfig, loads: list[dict[str, Any]],
          rules: dict[str, Any]) -> StepRecord:
    out_dir = layout.config(platform.name, config.name)
    record_path, log_path = out_dir / "expectations.json", out_dir / "expectations.log"
    failures: list[Failure] = []
    incomplete: list[str] = []
    passed = 0
    lines = []
    for m, r in rules.items():
        lines.append(f"rules for {m}: " + "; ".join(f"{k}: {v}" for k, v in r["origin"].items()))
    for load in loads:
        head = f"{load['model']} {load['load']} ({load['log']})"
        if "skipped" in load:
            lines.append(f"{head}: not checked: {load['skipped']}")
            continue
        for f in load["findings"]:
            lines.append(f"{head}: {f['rule']}: {f['status']}: {f['message']}")
            if f["status"] == "failed":
                fact = Failure("expectation", model=load["model"], status=f["rule"], message=f["message"],
                               log=load["log"])
                if not any((x.model, x.status, x.message) == (fact.model, fact.status, fact.message) for x in failures):
                    failures.append(fact)
            elif f["status"] == "incomplete":
                incomplete.append(f"{load['model']} {load['load']}: {f['message']}")
            else:
                passed += 1
    checked = sum(1 for load in loads if "skipped" not in load)
    if failures:
        status = "failed"
        detail = "; ".join(dict.fromkeys(f.text() for f in failures))
    elif incomplete:
        status, detail = "incomplete", "; ".join(dict.fromkeys(incomplete))
    elif passed:
        status = "passed"
        kinds = sorted({f["rule"] for load in loads for f in load["findings"] if f["status"] == "passed"},
                       key=RULES.index)
        detail = f"{', '.join(kinds)} as expected in {checked} load(s)"
    else:
        status = "skipped"
        detail = "nothing to check: " + ("; ".join(dict.fromkeys(load.get("skipped", "") for load in loads))
                                         or "no generation of this configuration left a record")
    write_json(record_path, {"config": config.name, "platform": platform.name, "status": status, "rules": rules,
                             "loads": loads})
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("\n".join(lines + [f"status: {status}: {detail}"]) + "\n", encoding="utf-8")
    return StepRecord(platform.name, config.name, STEP_NAME, status, 0.0, detail, layout.relative(log_path), failures)


def check(ctx: CheckContext) -> Iterable[StepRecord]:
    """The ``expectations`` step of every configuration of ``ctx.configs`` that has a generate step on
    ``ctx.platform`` (a check of harness.stages.checks)."""
    for name in ctx.configs:
        generate = ctx.run.step(ctx.platform.name, name, "generate")
        if generate is None or name not in ctx.matrix.configs:
            continue
        if generate.status == "skipped":
            yield StepRecord(ctx.platform.name, name, STEP_NAME, "skipped",
                             detail=f"generate step skipped: {generate.detail}")
            continue
        yield check_config(ctx.run.layout, ctx.platform, ctx.matrix.configs[name], generate)
