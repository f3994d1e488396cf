"""The rules of harness.stages.checks.expectations: what a configuration must do, declared or by default.

:func:`default_expectations` derives every rule from a configuration's build, ``env``,
``args`` and the platform (the rule docs/checks.md states); :func:`expectations_for`
puts a configuration's declarations (matrix.yaml ``configs.<name>.expectations``, schema
``#/$defs/expectations``) over them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from ...kinds.registry import GPUS, gpu_of
from ...matrix.config import Platform, RunConfig
from ...matrix.loading import arg_value, uses_mmap

#: The rules, in the order they are checked and reported.
RULES = ("placement", "weights", "pinned", "mapped", "claims", "warnings")

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

#: The buffer type of the weights upstream repacks for its CPU kernels (ggml-cpu/repack.cpp).
REPACK = "CPU_REPACK"
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
    cap allows the model buffers of type ``capped_type`` (harness.stages.checks.expectation_probe.cap_floor_bytes):
    the GPU kind's page-locked host buffer type (harness.kinds.shape.GpuKind.pinned_host_type, ``CUDA_Host``).
    """

    min: float | None = None
    max: float | None = None
    cap_bytes: int | None = None
    capped_type: str = ""

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


@dataclass
class Finding:
    """The outcome of one rule on one load: ``status`` FINDING_PASSED, FINDING_FAILED or FINDING_INCOMPLETE
    (harness.record.expectations); ``key`` stable across runs (no byte counts); ``message`` for people (with
    sizes); ``evidence`` the record lines it rests on."""

    rule: str
    status: str
    key: str
    message: str
    evidence: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.evidence = list(self.evidence)


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
    mapped: bool | None = None


def pin_layers(env: Mapping[str, str], name: str | None) -> int | None:
    """Variable ``name`` of ``env`` (a kind's ``pin-layers``: GGML_CUDA_MOE_PIN_LAYERS) as the fork reads it
    (patch 0003, src/llama-moe-pin.h): a positive decimal integer, else None (unset, no such variable, or a
    value the fork ignores with a warning: ``4x``, ``0``, ``-1``)."""
    raw = env.get(name) if name else None
    if raw is None or not raw.isdigit() or int(raw) < 1:
        return None
    return int(raw)


def _mib_env(env: Mapping[str, str], name: str | None) -> int | None:
    raw = env.get(name, "") if name else ""
    return int(raw) * 2**20 if raw.isdigit() and int(raw) > 0 else None


def default_expectations(platform: Platform, config: RunConfig, model: Mapping[str, Any]) -> Expectations:
    """The default rules of ``config`` on ``platform`` for ``model``: those of :func:`_placement_defaults`, and
    ``mapped`` from the load mode (:func:`uses_mmap`): a memory-mapped load keeps its host weights outside
    ``CPU_REPACK`` backed by the model file, a load with mmap off keeps none there."""
    base = _placement_defaults(platform, config, model)
    mmap = uses_mmap(config.args)
    return replace(base, mapped=mmap, origin={**base.origin, "mapped": f"default: {'mmap' if mmap else 'mmap off'}"})


def _placement_defaults(platform: Platform, config: RunConfig, model: Mapping[str, Any]) -> Expectations:
    """The default rules of ``config`` on ``platform`` for ``model`` (its summary: ``n_layer``,
    ``expert_tensor_bytes_by_layer``), derived from the build, ``env`` and ``args`` (docs/checks.md):

    * CPU platform (``gpu: none``): weights and experts in ``CPU_Mapped`` when the model is
      memory-mapped (:func:`uses_mmap`), in ``CPU`` otherwise; ``CPU_REPACK`` (weights repacked for
      the CPU's kernels) is allowed beside either, for the experts too: which quantized types upstream
      repacks depends on the CPU (on AVX2 Q4_0, Q4_K, IQ4_NL, MXFP4; Q2_K with AVX-512; Q5_K, Q6_K, Q8_0
      on ARM), so a quantized MoE's experts of one layer may be repacked and those of the next mapped.
      Nothing is pinned, so no pinned or warning rule.
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
    kind = gpu_of(platform)  # where the experts land per load mode: harness.kinds
    homes = kind.expert_homes
    if not kind.has_device:
        home = homes["host-mmap" if mmap else "host"]
        why = f"CPU platform, {'mmap' if mmap else 'mmap off'}"
        origin.update(placement=f"default: {why}", weights=f"default: {why}",
                      pinned="not checked: nothing is pinned on the CPU platform",
                      warnings="not checked: no pin warnings on the CPU platform")
        return Expectations(experts=(LayerRange(0, None, f"{home}|{REPACK}"),), weights=(home, REPACK), origin=origin)
    origin["weights"] = "not checked: model weights are split between device and host buffers by design"
    if arg_value(args, "-ot", "--override-tensor", "-ncmoe", "--n-cpu-moe") is not None:
        origin.update(placement="not checked: tensors placed by pattern (-ot/--n-cpu-moe); declare the placement",
                      pinned="not checked: placement by pattern", warnings="not checked: placement by pattern")
        return Expectations(origin=origin)
    host_experts = "--cpu-moe" in args or "-cmoe" in args
    if not host_experts:
        origin.update(placement=f"default: {kind.backend} platform, experts offloaded (no --cpu-moe)",
                      pinned="not checked: no expert tensors in host memory",
                      warnings="not checked: no expert tensors in host memory")
        return Expectations(experts=(LayerRange(0, None, homes["device"]),), origin=origin)
    if mmap:
        origin.update(placement="default: --cpu-moe with mmap (no host buffer)",
                      pinned="not checked: a memory-mapped model is not pinned",
                      warnings="not checked: a memory-mapped model is not pinned")
        return Expectations(experts=(LayerRange(0, None, homes["host-mmap"]),), origin=origin)
    var = kind.pin_vars  # its pinning variables: harness.kinds.shape.PIN_ROLES
    no_pinned = var.get("no-pinned") in env  # tested for presence by the fork and upstream (harness.kinds.nvidia.ENV)
    host = homes["host-unpinned" if no_pinned else "host"]
    fork = config.build == "fork"
    n_pin = pin_layers(env, var.get("pin-layers")) if fork else None
    if n_pin is not None and n_pin < max(n_layer, 1):
        experts: tuple[LayerRange, ...] = (LayerRange(0, n_pin - 1, host),
                                           LayerRange(n_pin, None, homes["host-unpinned"]))
        origin["placement"] = f"default: --cpu-moe, mmap off, {var['pin-layers']}={n_pin}" + \
                              (f", {var['no-pinned']}" if no_pinned else "")
    else:
        experts = (LayerRange(0, None, host),)
        origin["placement"] = "default: --cpu-moe, mmap off" + (f", {var['no-pinned']}" if no_pinned else "")
    if not fork:
        origin.update(pinned="not checked: upstream's build logs no pin records",
                      warnings="not checked: upstream's build logs no pin warnings")
        return Expectations(experts=experts, origin=origin)
    by_layer = list(model.get("expert_tensor_bytes_by_layer") or [])
    total = sum(by_layer)
    cap = _mib_env(env, var.get("sim-total-max-mb"))
    sticky = "sim-sticky" in var and env.get(var["sim-sticky"], "0") not in ("", "0")
    present: list[str] = []
    absent: list[str] = []
    if no_pinned:
        pinned = Pinned(0.0, 0.0)
        why = f"{var['no-pinned']}: nothing pinned"
    elif sticky:
        pinned = None
        why = f"not checked: {var['sim-sticky']} refuses every call after the first refusal"
        present.append("no-pin")
    elif cap is not None:
        pinned = Pinned(cap_bytes=cap, capped_type=kind.pinned_host_type or "")
        why = f"{var['sim-total-max-mb']}={cap // 2**20}: at least what the cap allows"
        present.append("partial-pin")
    elif n_pin is not None and (not n_layer or (n_pin < n_layer and not total)):
        pinned = None
        why = (f"not checked: {var['pin-layers']}={n_pin} pins a share of the experts that the model summary "
               "cannot tell (no layer count or no expert bytes per layer)")
        absent += ["partial-pin", "no-pin"]
    else:
        share = 1.0
        if n_pin is not None and n_pin < n_layer:
            share = sum(by_layer[:n_pin]) / total
        pinned = Pinned(share, share)
        why = f"experts of layers 0-{min(n_pin, n_layer) - 1} pinned" if n_pin is not None else "full pin"
        absent += ["partial-pin", "no-pin"]
    origin["pinned"] = why if why.startswith("not checked") else f"default: {why}"
    if var.get("pin-layers") in env:
        (absent if n_pin is not None else present).append("pin-layers-invalid")
        (present if n_pin is not None and n_layer and n_pin > n_layer else absent).append("pin-layers-clamped")
    origin["warnings"] = f"default: from {', '.join(var.values())}"
    return Expectations(experts=experts, pinned=pinned, present=tuple(present), absent=tuple(absent), origin=origin)


def declared_applies(config: RunConfig, platform: Platform) -> bool:
    """True when ``config``'s declared expectations hold on ``platform`` (their ``gpu`` key, when given,
    names the platform's GPU kind)."""
    decl = config.expectations
    return bool(decl) and ("gpu" not in decl or gpu_of(platform) is GPUS.get(decl["gpu"]))


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
    mapped = base.mapped
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
    if "mapped" in decl:
        mapped, origin["mapped"] = bool(decl["mapped"]), "declared"
    return Expectations(experts, weights, pinned, present, absent, origin, mapped)


def rule_on(exp: Expectations, rule: str) -> bool:
    """True when ``exp`` checks ``rule`` (one of :data:`RULES`)."""
    return {"placement": exp.experts is not None, "weights": exp.weights is not None,
            "pinned": exp.pinned is not None, "mapped": exp.mapped is not None, "claims": True,
            "warnings": bool(exp.present or exp.absent)}[rule]
