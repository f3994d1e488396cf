"""The speed stage's measurements as llama-bench JSONL rows: ``<platform>/speed/llama-bench.jsonl``.

llama.cpp's users compare builds with ``llama-bench -o jsonl`` and upstream's
``scripts/compare-llama-bench.py``; this module writes every measurement of a bench.json
(harness.record.bench) in that format, so the script reads a run as it reads llama-bench's output.
The fields and their meaning are llama-bench's (``tools/llama-bench/llama-bench.cpp`` of the pinned base:
``test::get_fields``, ``cmd_params_defaults``):

* one row per measurement and metric: pp as ``n_prompt=N, n_gen=0``; tg as ``n_prompt=0, n_gen=M,
  n_depth=N`` (the engine generates after its prompt of N tokens, which llama-bench writes ``tg M @ d N``);
* ``samples_ts`` the tok/s of each timed round, ``samples_ns`` each round's nanoseconds for its tokens
  (tokens / tok/s), ``avg_*`` their means and ``stddev_*`` their sample standard deviations (n - 1, as
  llama-bench), by Python's ``statistics``;
* ``build_commit``: the first 7 hex digits of the commit the build was made from, as ``environment.json``
  records it for every build, one found up to date included (``build_commits``: upstream's pinned commit
  for ``base``, the fork tree's HEAD for ``fork``): a maintainer's own llama-bench of the pinned upstream
  writes the same for base.  Records of before: the pinned commit for base, the fork tree's HEAD as its
  configure step printed it (``-- ggml commit:``) for the fork; a build of neither is left out.  A
  configuration that adds an environment (``GGML_CUDA_NO_PINNED=1``) or arguments that llama-bench has no
  field for runs code the fields cannot tell apart; its build_commit is then the first characters of the
  sha256 of the commit and those settings, of the commit's length (the script truncates build ids of
  differing lengths).  Each row also names its ``config``, ``build`` and ``env`` (fields the script ignores);
* the settings llama-bench has fields for are read from the configuration's ``args`` (``-ngl``,
  ``--cpu-moe``, ``-ot``, ``-sm``, ``-ts``, ``-fa``, ...), llama.cpp's defaults otherwise; ``n_threads`` the
  threads the engine's context used (its own word when it loaded, bench.json's ``engine``), else the
  threads it was started with, -1 in records of before that kept neither;
* ``backends`` the platform kind's backend (harness.kinds: ``CUDA``, ``CPU``), which every build of the
  platform is configured with; ``gpu_info`` the names of the visible GPUs of environment.json on a kind
  with a device, "" on a CPU-only one; ``cpu_info`` from the bench.json's machine fingerprint;
* ``test_time`` the start of the run's last command (run.json) as llama-bench writes it (RFC 3339 in UTC,
  whole seconds: ``2026-12-04T07:35:38Z``);
* ``model_type`` the model's description as ``llama_model_desc`` gives it (``llama 34B Q4_K - Medium``):
  the engine's word when it loaded (bench.json's ``engine``), else the same three parts as the model's load
  printed them (``print_info: arch``, ``model type``, ``file type`` of an engine's stderr kept in the run),
  else the matrix's model name; ``model_filename`` the file the engine loaded, ``model_size`` and
  ``model_n_params`` from that GGUF's tensors where the file is readable here (gguf).
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from datetime import datetime, timezone

from ..kinds.shape import GpuKind
from .bench import BenchMeasurement, bench_measurements, read_bench
from .environment import EnvironmentRecord, read_environment
from .layout import BUILD_FILES, RunLayout
from .records import RecordError
from .tolerant import read_json_or_none

#: The file beside bench.json.
FILE_NAME = "llama-bench.jsonl"

#: The regular expression llama.cpp's ``--cpu-moe`` overrides to the CPU buffer type (common/common.h,
#: LLM_FFN_EXPS_REGEX of the pinned base).
CPU_MOE_PATTERN = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"

_COMMIT_LINE = re.compile(r"^-- ggml commit:\s+(\S+)", re.MULTILINE)
#: The three parts of ``llama_model_desc`` as a model's load prints them (llama-model.cpp, print_info).
_DESC_LINES = {part: re.compile(rf"print_info: {label}\s*=\s*(.+?)\s*$", re.MULTILINE)
               for part, label in (("arch", "arch"), ("type", "model type"), ("ftype", "file type"))}
#: Hex digits of a build_commit (llama.cpp's build-info, ``git rev-parse --short``).
COMMIT_DIGITS = 7


@dataclass(frozen=True)
class Setting:
    """How one configuration ran: its build variant and the commit that build was made from (short), its
    ``args`` and ``env``, the model file its engine loaded ("" unknown), its platform's ``backend``
    (harness.kinds: ``CUDA``, ``CPU``) and the names of the GPUs it saw (``gpu_info``, "" on a CPU-only kind)."""

    build: str
    commit: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    model_file: str = ""
    backend: str = "CPU"
    gpu_info: str = ""


def _flag_values(args: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """(llama-bench field -> value from ``args``, the args no field holds)."""
    names = {"-ngl": "n_gpu_layers", "--n-gpu-layers": "n_gpu_layers", "--gpu-layers": "n_gpu_layers",
             "-ncmoe": "n_cpu_moe", "--n-cpu-moe": "n_cpu_moe", "-ot": "ot", "--override-tensor": "ot",
             "-sm": "split_mode", "--split-mode": "split_mode", "-ts": "tensor_split", "--tensor-split": "tensor_split",
             "-mg": "main_gpu", "--main-gpu": "main_gpu", "-fa": "flash_attn", "--flash-attn": "flash_attn",
             "-b": "n_batch", "--batch-size": "n_batch", "-ub": "n_ubatch", "--ubatch-size": "n_ubatch",
             "-t": "n_threads", "--threads": "n_threads", "-ctk": "type_k", "--cache-type-k": "type_k",
             "-ctv": "type_v", "--cache-type-v": "type_v", "-lm": "load_mode", "--load-mode": "load_mode"}
    switches = {"--cpu-moe": "cpu_moe", "-cmoe": "cpu_moe", "-nkvo": "no_kv_offload",
                "--no-kv-offload": "no_kv_offload", "-nopo": "no_op_offload", "--no-op-offload": "no_op_offload"}
    found: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in switches:
            found[switches[a]] = "1"
        elif a in names and i + 1 < len(args):
            key = names[a]
            found[key] = f"{found[key]};{args[i + 1]}" if key == "ot" and key in found else args[i + 1]
            i += 1
        else:
            rest.append(a)
        i += 1
    return found, rest


def build_commit(setting: Setting) -> str:
    """The row's build_commit (see the module): the build's commit, or for settings llama-bench's fields
    cannot hold, a digest of the commit and them cut to the commit's length."""
    _, rest = _flag_values(setting.args)
    if not setting.env and not rest:
        return setting.commit
    extra = json.dumps([setting.commit, sorted(setting.env.items()), rest])
    return hashlib.sha256(extra.encode()).hexdigest()[:len(setting.commit)]


def _settings_fields(setting: Setting) -> dict[str, Any]:
    flags, _ = _flag_values(setting.args)
    overrides = ([f"{CPU_MOE_PATTERN}=CPU"] if "cpu_moe" in flags else []) + \
        ([x for x in flags["ot"].split(";") if x] if "ot" in flags else [])
    fa = {"on": 1, "1": 1, "off": 0, "0": 0}.get(flags.get("flash_attn", "auto"), -1)
    split = flags.get("tensor_split")
    return {"n_batch": int(flags.get("n_batch", 2048)), "n_ubatch": int(flags.get("n_ubatch", 512)),
            "n_threads": int(flags.get("n_threads", -1)), "cpu_mask": "0x0", "cpu_strict": 0, "poll": 50,
            "type_k": flags.get("type_k", "f16"), "type_v": flags.get("type_v", "f16"),
            "n_gpu_layers": int(flags.get("n_gpu_layers", -1)), "n_cpu_moe": int(flags.get("n_cpu_moe", 0)),
            "split_mode": flags.get("split_mode", "layer"), "main_gpu": int(flags.get("main_gpu", 0)),
            "no_kv_offload": int("no_kv_offload" in flags), "flash_attn": fa,
            "tensor_split": "/".join(f"{float(x):.2f}" for x in split.split(",")) if split else "0.00",
            "tensor_buft_overrides": ";".join(overrides) or "none", "load_mode": flags.get("load_mode", "auto"),
            "embeddings": 0, "no_op_offload": int("no_op_offload" in flags), "fit_target": 0, "fit_min_ctx": 0}


def _model_facts(path: str) -> dict[str, int]:
    """model_size (bytes of the tensors) and model_n_params of a GGUF file; {} where it cannot be read."""
    if not path or not Path(path).is_file():
        return {}
    try:
        from gguf import GGUFReader
        reader = GGUFReader(path)
        return {"model_size": int(sum(int(t.n_bytes) for t in reader.tensors)),
                "model_n_params": int(sum(int(t.n_elements) for t in reader.tensors))}
    except Exception:  # noqa: BLE001 - an unreadable file leaves the two fields out, as the module says
        return {}


def _row_stats(tokens: int, samples_ts: Sequence[float]) -> dict[str, Any]:
    samples_ns = [round(tokens * 1e9 / ts) for ts in samples_ts]
    two = len(samples_ts) > 1
    return {"avg_ns": round(statistics.fmean(samples_ns)), "stddev_ns": round(statistics.stdev(samples_ns)) if two else 0,
            "avg_ts": statistics.fmean(samples_ts), "stddev_ts": statistics.stdev(samples_ts) if two else 0.0,
            "samples_ns": samples_ns, "samples_ts": list(samples_ts)}


def llama_bench_time(iso: str) -> str:
    """``iso`` (ISO 8601, e.g. run.json's ``2026-12-04T07:35:38.422060+00:00``) as llama-bench writes its
    ``test_time``: RFC 3339 in UTC to the second (``strftime("%FT%TZ", gmtime(...))``, llama-bench.cpp);
    "" for "".  Raises ValueError for a text that is not ISO 8601."""
    if not iso:
        return ""
    when = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def llama_bench_rows(measurements: Sequence[BenchMeasurement], machine: Mapping[str, Any],
                     settings: Mapping[str, Setting], test_time: str,
                     model_types: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The llama-bench rows of ``measurements`` (harness.record.bench.bench_measurements), two per
    measurement with samples (pp, then tg; a metric without samples gives none).  ``machine``: bench.json's
    fingerprint; ``settings``: per configuration (a measurement of a configuration without one, or whose
    build's commit is unknown, gives no rows); ``test_time``: as llama-bench writes it (:func:`llama_bench_time`);
    ``model_types``: matrix model name -> its description where the measurement's engine did not say
    (:func:`logged_model_types`).  Field by field: the module docstring."""
    rows = []
    facts: dict[str, dict[str, int]] = {}
    for m in measurements:
        s = settings.get(m.config)
        if s is None or not s.commit:
            continue
        if s.model_file not in facts:
            facts[s.model_file] = _model_facts(s.model_file)
        model_type = m.model_desc or (model_types or {}).get(m.model) or m.model
        common = {"build_commit": build_commit(s), "build_number": 0, "cpu_info": str(machine.get("cpu") or ""),
                  "gpu_info": s.gpu_info, "backends": s.backend,
                  "model_filename": s.model_file, "model_type": model_type, **facts[s.model_file],
                  **_settings_fields(s)}
        used = m.n_threads_used if m.n_threads_used is not None else m.threads  # the engine's word first
        if used is not None:
            common["n_threads"] = used
        extra = {"config": m.config, "build": s.build, "env": dict(s.env), "pair": list(m.pair)}
        for samples, n_prompt, n_gen, n_depth, tokens in ((m.pp, m.n_prompt, 0, 0, m.n_prompt),
                                                          (m.tg, 0, m.n_gen, m.n_prompt, m.n_gen)):
            if samples and tokens:
                rows.append({**common, "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": n_depth,
                             "test_time": test_time, **_row_stats(tokens, samples), **extra})
    return rows


def _environment(run_dir: Path, platform: str) -> EnvironmentRecord:
    """The platform's environment.json, an empty record where the run has none or it cannot be read."""
    try:
        return read_environment(RunLayout(run_dir).environment_json(platform))
    except (OSError, RecordError):
        return EnvironmentRecord()


def built_from(run_dir: Path, platform: str, variant: str, env: EnvironmentRecord | None = None) -> str:
    """The first :data:`COMMIT_DIGITS` hex digits of the commit ``variant``'s build was made from: recorded
    in environment.json (``build_commits``, also for a build found up to date); in records of before, the
    pinned upstream commit for ``base`` and the commit the configure step printed (the fork tree's HEAD) for
    another variant; "" where neither says."""
    env = env if env is not None else _environment(run_dir, platform)
    if env.build_commits.get(variant):
        return env.build_commits[variant][:COMMIT_DIGITS]
    if variant == "base" and env.base_commit:
        return env.base_commit[:COMMIT_DIGITS]
    try:
        text = (RunLayout(run_dir).build_logs(platform, variant) / BUILD_FILES["configure"]).read_text(
            encoding="utf-8", errors="replace")
    except OSError:
        return ""
    found = _COMMIT_LINE.search(text)
    return found.group(1)[:COMMIT_DIGITS] if found else ""


def visible_gpu_names(env: EnvironmentRecord) -> list[str]:
    """The names of the GPUs a platform's programs saw (environment.json's ``gpus``, the first
    ``visible_gpus`` of them where it says how many)."""
    names = [str(g.get("name")) for g in env.gpus if g.get("name")]
    return names[:env.visible_gpus] if env.visible_gpus is not None else names


def run_settings(run_dir: Path, platform: str, configs: Sequence[str], kind: GpuKind) -> dict[str, Setting]:
    """The :class:`Setting` of each of ``configs`` on ``platform`` (of platform kind ``kind``) of a run, from
    its files: the configuration's config.json, environment.json (:func:`built_from`, the GPUs), its speed
    engine command (``<config>.<model>[.t<threads>].cmd`` in the speed directory, for the model file).  A
    configuration without config.json is left out."""
    layout = RunLayout(run_dir)
    env = _environment(run_dir, platform)
    gpu_info = ", ".join(visible_gpu_names(env)) if kind.has_device else ""
    out = {}
    for config in configs:
        cfg = read_json_or_none(layout.config_json(platform, config))
        if not isinstance(cfg, dict):
            continue
        build = str(cfg.get("build", ""))
        model_file = ""
        for cmd in sorted(layout.speed(platform).glob(f"{config}.*.cmd")):
            argv = (read_json_or_none(cmd) or {}).get("argv") or []
            if "-m" in argv[:-1]:
                model_file = str(argv[argv.index("-m") + 1])
                break
        out[config] = Setting(build, built_from(run_dir, platform, build, env),
                              tuple(str(a) for a in cfg.get("args") or ()),
                              {str(k): str(v) for k, v in (cfg.get("env") or {}).items()}, model_file,
                              kind.backend, gpu_info)
    return out


def logged_model_types(run_dir: Path, platform: str) -> dict[str, str]:
    """Matrix model name -> ``"<arch> <model type> <file type>"``, the three parts of ``llama_model_desc`` as a
    load of that model printed them (``print_info:`` lines of an engine's stderr kept in the run: a
    generation's ``gen/<model>/engine.stderr`` or a speed engine's ``<config>.<model>.engine.stderr``), for
    measurements whose engine did not say; models without such a log are left out."""
    layout = RunLayout(run_dir)
    found: dict[str, str] = {}
    logs = [(p.parent.name, p) for p in sorted(layout.platform(platform).glob("*/gen/*/engine.stderr"))]
    logs += [(p.name.split(".")[1], p) for p in sorted(layout.speed(platform).glob("*.*.engine.stderr"))]
    for model, path in logs:
        if model in found:
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        parts = [pattern.search(text) for pattern in _DESC_LINES.values()]
        if all(parts):
            found[model] = " ".join(p.group(1) for p in parts if p)
    return found


def _test_time(run_dir: Path) -> str:
    """The start of the run's last command (run.json), else summary.json's ``updated``, else "", as llama-bench
    writes a test_time (:func:`llama_bench_time`)."""
    run = read_json_or_none(RunLayout(run_dir).run_json) or {}
    commands = run.get("commands") or []
    if commands and commands[-1].get("started"):
        return llama_bench_time(str(commands[-1]["started"]))
    return llama_bench_time(str((read_json_or_none(RunLayout(run_dir).summary_json) or {}).get("updated")
                               or run.get("started") or ""))


def rows_of_run(run_dir: Path, platform: str, kind: GpuKind) -> list[dict[str, Any]]:
    """The llama-bench rows of a run's ``<platform>/speed/bench.json`` (``kind``: the platform's kind,
    harness.kinds.registry.gpu_of); [] without one.  A configuration the run recorded no config.json of, or
    whose build's commit it did not record (:func:`built_from`), gives no rows.  Raises ValueError for a
    bench.json of the wrong shape."""
    data = read_bench(run_dir, platform)
    if data is None:
        return []
    where = str(RunLayout(run_dir).bench_json(platform))
    measurements = bench_measurements(data, where)
    settings = run_settings(run_dir, platform, sorted({m.config for m in measurements}), kind)
    return llama_bench_rows(measurements, data.get("machine") or {}, settings, _test_time(run_dir),
                            logged_model_types(run_dir, platform))


def write_rows(run_dir: Path, platform: str, kind: GpuKind, out: Path | None = None) -> Path:
    """Write :func:`rows_of_run` as JSON lines to ``out`` (default: ``<platform>/speed/llama-bench.jsonl``);
    returns the path."""
    out = out or RunLayout(run_dir).speed(platform) / FILE_NAME
    rows = rows_of_run(run_dir, platform, kind)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return out
