"""Failure signatures: every failed step of a run, classified from its logs.

A signature names *what* failed in a form that stays the same from run to run,
so that triage can tell a failure already known from a new one.  Its ``kind``
is one of harness.triage.text_rules.KINDS; its ``key`` is built only from stable facts: source
paths relative to the source or build tree (no home or temporary directories),
no line numbers, no hex addresses, no timestamps, durations or process ids.

Kinds and what the key holds:

``configure_error``
    the CMake file and command of the first ``CMake Error`` and its first message line.
``compile_error``
    the source file and message of the first compiler error (GCC/Clang, nvcc, MSVC).
``link_error``
    the undefined or duplicate symbol, or the missing library.
``patch_apply``
    the file name of the series patch that did not apply (harness.stages.building.patches.PatchApplyError),
    without its directory, the base commit or its position in the series.
``test_assertion``
    ``GGML_ASSERT(cond) failed`` with its file, a C ``assert`` condition, or a
    test's ``FAIL`` line, prefixed by the test name.
``signal``
    the signal (SIGSEGV, SIGABRT, ...) and the test or program it ended; read from
    "Segmentation fault"-style messages, ctest's ``SEGFAULT``/``Subprocess aborted``,
    exit codes 128+N, negative return codes and the step detail.
``cuda_error``
    the CUDA error message and the API call where it surfaced.  ggml's
    ``ggml_cuda_error`` (ggml/src/ggml-cuda/ggml-cuda.cu) prints::

        CUDA error: an illegal memory access was encountered
          current device: 0, in function ggml_cuda_op_mul_mat at .../ggml-cuda.cu:1234
          cudaFuncSetAttribute(...)

    A CUDA error is sticky: it is reported by whichever later call checks first,
    so the function and line of that check are innocent and kept out of the key;
    the pair (error message, API call) is the signature.
``sanitizer_report``
    compute-sanitizer's first report header (``Invalid __global__ read of size 4
    bytes``, ``Program hit cudaError...``) and the kernel or API call it names;
    a bare ``ERROR SUMMARY: n errors`` with n > 0 gives the tool name.
``timeout``
    the test or program that ran out of time.
``output_mismatch``
    a diverged greedy comparison: group, model, prompt, candidate and reference.
``placement``, ``pinning``, ``warning``
    a failed ``expectations`` step (harness.stages.checks.expectations): configuration and model
    and the rule's stable finding (``expert tensors of layers 0-7 in CPU, expected
    CUDA_Host``, ``pinned fraction below 1``, ``unexpected warning partial-pin``), without
    byte counts; the summary has them.
``reload``
    a failed ``reloads`` step (harness.stages.checks.reloads): configuration, model and the rule's stable
    finding (``freed: page-locked bytes left in freed host buffers``, ``grant: a later load was granted
    less than the first``), without byte counts or the load's number; the summary has them.
``speed_regression``
    a speed rule that found a slowdown (harness.stages.speed.speed): group, model, candidate, metric
    (pp or tg) and reference; the numbers are in the summary only.
``other``
    a failure none of the rules recognise; the key is the normalised detail.

:func:`classify_run` writes ``signatures.json`` into the run directory so later
runs are matched against stored keys even when the old logs are gone.

Longer than 400 lines: one classifier per kind of step (build, test, generate, the checks, speed), each
reading that step's logs and records; the rules that read any text, the ranking and the key normalisation they
share are harness.triage.text_rules.
"""

from __future__ import annotations

import re
import shlex
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..stages.native_tests.native_tests import WRAPPER_DID_NOT_RUN
from ..stages.outputs.sanitized_generation import CRASH_LABEL, CRASH_TOOL, sanitized_stem
from ..stages.shape import Signs
from ..stages.table import step_spec
from ..record.bench import RuleStep, parse_rule_step, parse_step, read_bench, rule_ratio
from ..record.expectations import FINDING_FAILED, read_expectations
from ..record.reloads import read_reload_check
from ..record.loads import read_load_command
from ..record.native_tests import read_sanitizer, read_test_run
from ..record.upstream_tests import REGRESSED, read_suite
from ..record.json_files import load_records, write_json
from ..record.layout import BUILD_FILES, LOAD_FILES, TESTS_FILES, RunLayout
from ..record.records import ComparisonRecord, Failure, RecordError, StepRecord
from ..common.statuses import CRASHED, DIVERGED, STEP, STEP_FAILED, TIMEOUT
from ..record.signatures import read_signatures
from .text_rules import (EXPECTATION_KINDS, KIND_RANK, KINDS, SUMMARY_MAX_CHARS, Signature, _clip, _line_at, _sanitizer,
                         _sig, _signal_in_text, classify_text, normalise, relative_path, signal_from_exit,
                         signal_signature, strip_ansi)


# --------------------------------------------------------------------------- build steps

_CMAKE_ERROR = re.compile(r"^CMake Error(?: at (?P<file>.+?)(?::\d+)? \((?P<cmd>\w+)\))?:?\s*(?P<rest>.*)$")
_GCC_ERROR = re.compile(r"^(?P<file>(?:[A-Za-z]:)?[^\s:][^:\n]*?):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: (?P<msg>.+)$")
_NVCC_ERROR = re.compile(r"^(?P<file>(?:[A-Za-z]:)?[^\s(][^(\n]*?)\((?P<line>\d+)(?:,\s*\d+)?\)\s*:\s*"
                         r"(?:fatal |catastrophic )?error(?: (?P<code>#?[A-Z]*\d+(?:-[A-Z])?))?\s*:\s*(?P<msg>.+)$")
_LINK_RULES = [
    re.compile(r"undefined reference to [`'‘](?P<sym>[^'’]+)['’]"),
    re.compile(r"undefined symbol: (?P<sym>.+)$"),
    re.compile(r"multiple definition of [`'‘](?P<sym>[^'’]+)['’]"),
    re.compile(r"error LNK\d+: .*?symbol (?P<sym>\S+)"),
    re.compile(r"ld(?:\.\w+)?: (?:error: )?cannot find (?P<sym>-l\S+)"),
    re.compile(r"error LNK\d+: (?P<sym>.+)$"),
    re.compile(r"(?P<sym>collect2|ld(?:\.\w+)?): error: ld returned \d+ exit status"),
]
_NINJA_FAILED = re.compile(r"^FAILED: (?:\[code=\d+\] )?(?P<out>\S+)")


def _read(path: Path) -> str:
    try:
        return strip_ansi(path.read_bytes().decode("utf-8", "replace"))
    except OSError:
        return ""


def _rc(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _roots_from_logs(*texts: str) -> list[str]:
    roots: list[str] = []
    for text in texts:
        first = text.split("\n", 1)[0]
        if not first.startswith("$ "):
            continue
        try:  # the log's command line (harness.common.proc.command_line), shell-quoted
            words = shlex.split(first[2:])
        except ValueError:  # not a shell line
            continue
        roots += [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-S", "-B", "--build")]
    return roots


def _configure_error(text: str, roots: Sequence[str]) -> Signature | None:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _CMAKE_ERROR.match(line)
        if not m:
            continue
        message = m.group("rest").strip()
        evidence = [line]
        for follow in lines[i + 1:i + 4]:
            if not message and follow.strip():
                message = follow.strip()
            if follow.strip():
                evidence.append(follow)
                if len(evidence) >= 3:
                    break
        where = ""
        if m.group("file"):
            where = f"{relative_path(m.group('file'), roots)} ({m.group('cmd')})"
        key = f"{where}: {normalise(message, roots)}" if where else normalise(message, roots)
        return _sig("configure_error", key, f"CMake Error{' at ' + where if where else ''}: {message}", evidence)
    return None


def _link_error(text: str, roots: Sequence[str]) -> Signature | None:
    lines = text.splitlines()
    for rule in _LINK_RULES:
        for index, line in enumerate(lines):
            m = rule.search(line)
            if not m:
                continue
            target = ""
            for prev in lines[:index]:
                f = _NINJA_FAILED.match(prev)
                if f:
                    target = relative_path(f.group("out"), roots)
            what = normalise(m.group(0).strip(), roots)
            key = what + (f" linking {target}" if target else "")
            return _sig("link_error", key, f"link error: {what}" + (f" (linking {target})" if target else ""),
                        [line])
    return None


def _compile_error(text: str, roots: Sequence[str]) -> Signature | None:
    for line in text.splitlines():
        m = _GCC_ERROR.match(line.strip()) or _NVCC_ERROR.match(line.strip())
        if not m:
            continue
        file = relative_path(m.group("file"), roots)
        msg = m.group("msg").strip()
        code = m.groupdict().get("code") or ""
        key = f"{file}: error{' ' + code if code else ''}: {normalise(msg, roots)}"
        return _sig("compile_error", key, f"compile error in {file}:{m.group('line')}: {msg}", [line])
    return None


#: The first line of harness.stages.building.patches.PatchApplyError's message (see patches._apply_failure), after the
#: ``PatchApplyError: `` prefix the pipeline writes into the step detail and error.log.
_PATCH_APPLY = re.compile(r"^(?:PatchApplyError: )?(?P<path>[^\n]*?): patch (?P<index>\d+) of (?P<total>\d+) "
                          r"\((?P<subject>[^\n]*)\) does not apply on (?P<base>[0-9a-f]+) "
                          r"\+ (?P<earlier>\d+) earlier patch\(es\)", re.M)
#: Lines of a PatchApplyError worth keeping as evidence: where git am --3way left conflicts (its
#: ``CONFLICT (content)`` lines) and git apply's ``patch failed`` lines naming the upstream file.
_PATCH_APPLY_EVIDENCE = re.compile(r"^(?:Conflicts git am --3way left in .*|error: patch failed: .*|"
                                   r"CONFLICT \(.*)$", re.M)


def _patch_apply(text: str) -> Signature | None:
    """The ``patch_apply`` signature of a PatchApplyError message in ``text``, or None.

    The key is ``patch <file name> does not apply``: the file name identifies the patch in
    ``patches/series``; its directory, the base commit and its position (``patch 2 of 3``)
    change between machines and series edits, so they stay in the summary only.
    """
    m = _PATCH_APPLY.search(text)
    if not m:
        return None
    name = re.split(r"[\\/]", m.group("path"))[-1]
    evidence = [_line_at(text, m.start())] + [e.group(0) for e in _PATCH_APPLY_EVIDENCE.finditer(text)]
    return _sig("patch_apply", f"patch {name} does not apply",
                f"patch {m.group('index')} of {m.group('total')}, {name} ({m.group('subject')}), does not apply "
                f"on {m.group('base')} + {m.group('earlier')} earlier patch(es)", evidence)


def _build_logs(run_dir: Path, step: StepRecord) -> Path:
    """The directory of the logs of a step whose evidence is ``build-logs`` or ``compile-logs``."""
    layout = RunLayout(run_dir)
    spec = step_spec(step.step)
    compiled = spec is not None and spec.evidence == "compile-logs"
    return (layout.compile_logs if compiled else layout.build_logs)(step.platform, step.config)


def _classify_build(run_dir: Path, step: StepRecord) -> Signature:
    logs = _build_logs(run_dir, step)
    # the step's failure facts are this run's own record, while configure/build logs may be
    # left from an earlier attempt of a continued run: read them first
    for fact in step.failures:
        if fact.kind == "patch":
            return _patch_apply(fact.message) or _sig("patch_apply", f"patch {fact.patch} does not apply",
                                                     f"patch {fact.patch} does not apply", [fact.message])
    if not any(f.kind == "exception" for f in step.failures):
        found = _patch_apply(step.detail or _read(logs / BUILD_FILES["error"]))  # a record without facts
        if found:
            return found
    configure, build = _read(logs / BUILD_FILES["configure"]), _read(logs / BUILD_FILES["build"])
    roots = _roots_from_logs(configure, build)
    configure_rc, build_rc = (_rc((logs / BUILD_FILES[name]).with_suffix(".rc")) for name in ("configure", "build"))
    if configure_rc not in (None, 0) or (configure and not build and "CMake Error" in configure):
        found = _configure_error(configure, roots)
        if found:
            return found
        return _sig("configure_error", f"cmake exit {configure_rc}", f"configure failed (exit {configure_rc})",
                    configure.splitlines()[-3:])
    if build:
        for rule in (_link_error, _compile_error):
            found = rule(build, roots)
            if found:
                return found
    error_log = _read(logs / BUILD_FILES["error"]).strip()
    detail = step.detail or error_log or f"build exit {build_rc}"
    return _other(detail, roots, error_log.splitlines()[:3] or [detail])


def _other(detail: str, roots: Sequence[str], evidence: Iterable[str]) -> Signature:
    return _sig("other", normalise(detail, roots) or STEP_FAILED, detail.split("\n", 1)[0], evidence)


# --------------------------------------------------------------------------- test steps

_CTEST_RESULT = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (?P<name>\S+) \.*\s*(?P<status>.*?)\s+[\d.]+ sec\s*$")
_CTEST_START = re.compile(r"^\s*(?:Start\s+\d+: |\d+/\d+ Test\s+#\d+: |\d+% tests passed)")
_CTEST_FAILED_ITEM = re.compile(r"^\s*\d+ - (?P<name>\S+) \((?P<why>[^)]+)\)")
_EXIT_MESSAGE = re.compile(r"exit (-?\d+)")


def _ctest_blocks(text: str) -> dict[str, str]:
    """Per test name, ctest's result line plus the output --output-on-failure printed after it."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        m = _CTEST_RESULT.match(line)
        if m:
            current = blocks.setdefault(m.group("name"), [])
            current.append(line)
            continue
        if _CTEST_START.match(line) or line.startswith("The following tests"):
            current = None
            continue
        if current is not None:
            current.append(line)
    return {k: "\n".join(v) for k, v in blocks.items()}


def _failed_tests(test_dir: Path) -> list[tuple[str, str]]:
    """(name, message) of the failed tests, from tests.json, else junit.xml, else ctest.log."""
    try:
        return [(c.name, c.message) for c in read_test_run(test_dir / TESTS_FILES["run"]).failed()]
    except (OSError, RecordError):
        pass
    try:
        root = ET.parse(test_dir / TESTS_FILES["junit"]).getroot()
        out = []
        for tc in root.iter("testcase"):
            node = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
            if node is not None:
                out.append((tc.get("name", "?"), node.get("message") or ""))
        return out
    except (OSError, ET.ParseError):
        pass
    return [(m.group("name"), m.group("why")) for m in _CTEST_FAILED_ITEM.finditer(_read(test_dir / TESTS_FILES["log"]))]


def _regressed_upstream(run_dir: Path, step: StepRecord) -> set[str] | None:
    """The tests of upstream's suite that regressed in ``step`` (harness.record.upstream_tests), None where its pair
    record cannot be read (every failed test of the fork's side then counts)."""
    try:
        return {p.name for p in read_suite(RunLayout(run_dir).upstream_file(step.platform, "pairs")).of(REGRESSED)}
    except (OSError, RecordError):
        return None


def _classify_test(run_dir: Path, step: StepRecord) -> Signature:
    if step.step == RunLayout.UPSTREAM_STEP:  # upstream's suite: the fork's side, its regressed tests only
        test_dir = RunLayout(run_dir).upstream_tests(step.platform, "fork")
        only = _regressed_upstream(run_dir, step)
    else:
        test_dir, only = RunLayout(run_dir).tests(step.platform, step.step), None
    ctest_log = _read(test_dir / TESTS_FILES["log"])
    try:
        tool = read_sanitizer(test_dir / TESTS_FILES["sanitizer"]).tool
    except (OSError, RecordError):
        tool = ""
    blocks = _ctest_blocks(ctest_log)
    why = {m.group("name"): m.group("why") for m in _CTEST_FAILED_ITEM.finditer(ctest_log)}
    candidates: list[Signature] = []
    for name, message in _failed_tests(test_dir):
        if only is not None and name not in only:
            continue  # fails on base too: upstream's or the environment's, never the fork's regression
        if (message or "").startswith(WRAPPER_DID_NOT_RUN):
            candidates.append(_sig("sanitizer_report", f"{name}: {tool or 'compute-sanitizer'} did not run the test",
                                   f"{name}: {message}", [message]))
            continue
        own_log = test_dir / f"{name}.log"
        text = _read(own_log) if own_log.exists() else blocks.get(name, "")
        found = classify_text(text, name, tool=tool)
        if not found:
            code = _EXIT_MESSAGE.search(message or "")
            sig_name = signal_from_exit(int(code.group(1))) if code else None
            reason = (why.get(name, "") + " " + (message or "")).strip()
            named = _signal_in_text(reason)
            if sig_name:
                found = signal_signature(sig_name, name, message)
            elif "timeout" in reason.lower():
                found = _sig("timeout", f"timeout in {name}", f"{name} timed out", [reason])
            elif named:
                found = signal_signature(named[0], name, reason)
            else:
                tail = [ln for ln in text.splitlines() if ln.strip()][-3:]
                found = _sig("other", f"{name} failed", f"{name} failed" + (f": {message}" if message else ""),
                             tail or [message])
        candidates.append(found)
    if tool and not candidates:
        found = _sanitizer(ctest_log, "", (), tool)
        if found:
            candidates.append(found)
    if candidates:
        best = min(candidates, key=lambda s: KIND_RANK.get(s.kind, 99))
        if len(candidates) > 1:
            best = Signature(best.kind, best.key,
                             _clip(f"{best.summary} (+{len(candidates) - 1} more failing test(s))", SUMMARY_MAX_CHARS),
                             best.evidence)
        return best
    return _other(step.detail or "tests failed", (), ctest_log.splitlines()[-3:])


# --------------------------------------------------------------------------- generate steps

def _gen_roots(cmd_files: Iterable[Path]) -> list[str]:
    roots = []
    for cmd in cmd_files:
        try:
            binary = read_load_command(cmd).program
        except (OSError, RecordError):
            continue
        if binary.parent.name == "bin":
            roots.append(str(binary.parent.parent))
        break
    return roots


def _program_name(cmd_files: Sequence[Path]) -> str:
    for cmd in cmd_files:
        try:
            name = read_load_command(cmd).program.name
        except (OSError, RecordError):
            continue
        return name[:-4] if name.endswith(".exe") else name
    return "llama-completion"


def _classify_generate(run_dir: Path, step: StepRecord) -> Signature:
    candidates = generate_signatures(run_dir, step)
    if candidates:
        return min(candidates, key=lambda s: KIND_RANK.get(s.kind, 99))
    cmd_files = RunLayout(run_dir).generation_files(step.platform, step.config, LOAD_FILES["cmd"])
    return _other(step.detail or "generation failed", _gen_roots(cmd_files), [step.detail])


def _with_crash_memcheck(layout: RunLayout, step: StepRecord, fact: Failure, found: Signature | None) -> Signature | None:
    """``found`` (the crash's signature from its logs, or None) with the first error of the crash's run once more under
    memcheck (harness.stages.outputs.sanitized_generation) joined to its key and summary; ``found`` unchanged where
    that run reported nothing or did not run."""
    stem = sanitized_stem(layout.config(step.platform, step.config), fact.model, fact.prompt, CRASH_LABEL)
    san = _sanitizer(_read(stem.with_name(stem.name + ".sanitizer.log")), "", (), CRASH_TOOL)
    if san is None:
        return found
    if found is None:
        return san
    return _sig(found.kind, f"{found.key}; {san.key}", f"{found.summary}; {san.summary}",
                [*found.evidence.splitlines(), *san.evidence.splitlines()])


def generate_signatures(run_dir: Path, step: StepRecord) -> list[Signature]:
    """One signature per failure fact of a failed ``generate`` step (every failing model and
    generation, none dropped), in fact order, duplicates (same kind and key) removed."""
    layout = RunLayout(run_dir)
    cmd_files = layout.generation_files(step.platform, step.config, LOAD_FILES["cmd"])
    roots = _gen_roots(cmd_files)
    program = _program_name(cmd_files)
    candidates: list[Signature] = []
    for fact in step.failures:
        if fact.kind != "generation":
            candidates.append(_other(fact.text(), roots, [fact.text()]))
            continue
        text = fact.text()
        found = None
        for path in _generation_logs(layout, step, fact):
            found = classify_text(_read(path), program, roots)
            if found:
                break
        if fact.status == CRASHED:
            found = _with_crash_memcheck(layout, step, fact, found)
        if not found and fact.status == TIMEOUT:
            found = _sig("timeout", f"timeout in {program}", f"{program} timed out ({fact.model}/{fact.prompt})",
                         [text])
        if not found and fact.signal:
            found = signal_signature(fact.signal, program, text)
        if not found and fact.error_line:
            code = re.search(r"exit code (-?\d+)", fact.error_line)
            sig_name = signal_from_exit(int(code.group(1))) if code else None
            found = signal_signature(sig_name, program, text) if sig_name else _other(fact.error_line, roots, [text])
        candidates.append(found or _other(text, roots, [text]))
    if not candidates:
        for path in layout.generation_files(step.platform, step.config, ".stderr"):
            found = classify_text(_read(path), program, roots)
            if found:
                candidates.append(found)
                break
    return list({(c.kind, c.key): c for c in candidates}.values())


def _generation_logs(layout: RunLayout, step: StepRecord, fact: Failure) -> list[Path]:
    """The .stderr files of the generation a fact names: its own log, else every repeat's."""
    if fact.log and (layout.dir / fact.log).is_file():
        return [layout.dir / fact.log]
    return layout.generation_files(step.platform, step.config, ".stderr", fact.model, fact.prompt)


# --------------------------------------------------------------------------- steps and runs

def classify_step(run_dir: Path, step: StepRecord) -> Signature | None:
    """The signature of one step record of ``run_dir``'s summary, or None when it did not fail.

    ``step`` is a step record of the run (harness.record.summary.read_run reads entries of older record formats
    too).  Steps named
    ``build`` are read from the step's patch fact, else ``<platform>/build-<config>/``
    (``compile``: ``<platform>/compile-<config>/``)
    (configure.log, build.log, their .rc files, error.log); ``test`` and ``test-<tool>``
    from ``<platform>/tests[-<tool>]/`` (tests.json, junit.xml, ctest.log, per-test logs,
    sanitizer.json); ``generate`` from the step's failure facts and the .stderr/.cmd files
    they name under ``<platform>/<config>/gen/``.  A step with several failures gets the
    most specific one (:data:`KIND_RANK`).  Missing logs give an ``other`` signature from
    the facts or the detail; this never raises for absent or unreadable logs.
    """
    if not STEP.is_failure(step.status):
        return None
    spec = step_spec(step.step)
    if spec is not None and spec.signs is not None:
        found = _signed_by_its_stage(run_dir, step, spec.signs)
    else:
        reader = _READERS.get(spec.evidence) if spec is not None else None
        found = reader(run_dir, step) if reader is not None else None
    return found or _from_detail(step)


def _signed_by_its_stage(run_dir: Path, step: StepRecord, signs: Signs) -> Signature | None:
    """The signature a stage's own reader (harness.stages.shape.StepSpec.signs) reads of ``step``, clipped like
    every other; None where it reads none.  Raises ValueError for a kind outside :data:`KINDS`."""
    own = signs(run_dir, step)
    if own is None:
        return None
    if own.kind not in KINDS:
        raise ValueError(f"step {step.step}: its stage signs it as kind {own.kind!r}, not one of {KINDS}")
    return _sig(own.kind, own.key, own.summary, own.evidence)


def _from_detail(step: StepRecord) -> Signature:
    """The signature of a failed step from its failure facts and detail alone (evidence ``detail``)."""
    detail = "; ".join(f.text() for f in step.failures) or step.detail or f"{step.step} {step.status}"
    found = classify_text(detail)
    return found or _other(detail, (), [detail])


def _sanitizer_step(run_dir: Path, step: StepRecord) -> Signature | None:
    """The first report of the compute-sanitizer log a ``generate-<tool>`` or crash-memcheck step names."""
    text = _read(run_dir / step.log) if step.log else ""
    return _sanitizer(text, step.config, (), step.step.split("-", 1)[1] if step.step != CRASH_LABEL else CRASH_TOOL)


def _speed_step(run_dir: Path, step: StepRecord) -> Signature | None:
    """A failed speed rule's signature (an errored one is read from its detail)."""
    return speed_signature(run_dir, step) if step.status == STEP_FAILED and parse_step(step.step) else None


def _first(signatures: Callable[[Path, StepRecord], list[Signature]]) -> Callable[[Path, StepRecord], Signature | None]:
    return lambda run_dir, step: next(iter(signatures(run_dir, step)), None)


#: How a failed step's signature is read, by the evidence its stage declares for it (harness.stages.shape
#: .EVIDENCE, every kind but ``detail``, which :func:`_from_detail` reads; tests/test_stage_meaning.py holds
#: them equal).  A reader's None falls back to the detail.  A step whose stage signs it itself
#: (harness.stages.shape.StepSpec.signs) needs no reader here.
_READERS: dict[str, Callable[[Path, StepRecord], Signature | None]] = {
    "build-logs": _classify_build,
    "compile-logs": _classify_build,
    "test-logs": lambda run_dir, step: _classify_test(run_dir, step),
    "upstream-suite": lambda run_dir, step: _classify_test(run_dir, step),
    "generations": lambda run_dir, step: _classify_generate(run_dir, step),
    "sanitizer-log": _sanitizer_step,
    "expectations": _first(lambda run_dir, step: expectation_signatures(run_dir, step)),
    "reloads": _first(lambda run_dir, step: reload_signatures(run_dir, step)),
    "speed-rule": _speed_step,
}


def evidence_read() -> frozenset[str]:
    """The evidence kinds this module reads a signature from (those of :data:`_READERS`, and ``detail``)."""
    return frozenset(_READERS) | {"detail"}


def reload_signatures(run_dir: Path, step: StepRecord) -> list[Signature]:
    """The ``reload`` signatures of a failed ``reloads`` step, one per failed rule and model, keyed by the
    findings' stable keys in ``<platform>/<config>/reloads.json`` (the failure's normalised message where that
    record is missing or unreadable)."""
    try:
        keys = read_reload_check(RunLayout(run_dir).reloads_json(step.platform, step.config)).failed_keys()
    except (OSError, RecordError):
        keys = {}
    out = []
    for fact in step.failures:
        stable = keys.get((fact.model, fact.status, fact.message)) or normalise(fact.message)
        where = f"{step.config}/{fact.model}"
        out.append(_sig("reload", f"reloads: {where}: {fact.status}: {stable}",
                        f"reloads: {where}: {fact.status}: {fact.message}", [fact.message]))
    return out


def expectation_signatures(run_dir: Path, step: StepRecord) -> list[Signature]:
    """The signatures of a failed ``expectations`` step, most specific first (:data:`KIND_RANK`): one per
    failed rule and model.  Keys come from ``<platform>/<config>/expectations.json`` (the findings'
    stable keys); where it is missing or unreadable, from the step's failure facts, normalised."""
    record = read_expectations(RunLayout(run_dir).expectations_json(step.platform, step.config))
    keys: dict[tuple[str, str, str], str] = {}
    for load in record.loads if record is not None else ():
        for f in load.findings:
            if f.status == FINDING_FAILED:
                keys.setdefault((load.model, f.rule, f.message), f.key)
    out = []
    for fact in step.failures:
        if fact.kind != "expectation":
            continue
        stable = keys.get((fact.model, fact.status, fact.message)) or normalise(fact.message)
        kind = "pinning" if fact.status == "claims" and stable.startswith("pinning") else \
            EXPECTATION_KINDS.get(fact.status, "other")
        where = f"{step.config}/{fact.model}"
        out.append(_sig(kind, f"{fact.status}: {where}: {stable}", f"{fact.status}: {where}: {fact.message}",
                        [fact.message]))
    return sorted(out, key=lambda s: KIND_RANK[s.kind])


def speed_signature(run_dir: Path, step: StepRecord) -> Signature:
    """The ``speed_regression`` signature of a failed speed rule step (``speed:<group>:<metric>``, with
    ``:vs-<reference>`` for a rule's own reference), from the rule's record in
    ``<platform>/speed/bench.json`` (its ``step`` and candidate; records written before rules named a
    step: its group, candidate and metric); without that record, from the step alone."""
    parsed = parse_rule_step(step.step) or RuleStep("?", "?")
    group, metric = parsed.group, parsed.metric
    bench = read_bench(run_dir, step.platform) or {}
    rules = [r for r in bench.get("rules", []) if r.get("candidate") == step.config]
    rule: dict[str, Any] = next((r for r in rules if r.get("step") == step.step), {}) or \
        next((r for r in rules if "step" not in r and (r.get("group"), r.get("metric")) == (group, metric)), {})
    reference, model = rule.get("reference", parsed.reference or "?"), rule.get("model", "?")
    key = f"{group}/{model}: {step.config} vs {reference} {metric}"
    judged = rule_ratio(rule)
    if judged:
        want = "no slowdown" if rule.get("min_ratio") == 1.0 else f"at least {rule.get('min_ratio'):g}x"
        summary = (f"speed {key}: {judged.text()} ({rule['candidate_spread']['median']:.1f} vs "
                   f"{rule['reference_spread']['median']:.1f} tok/s, Mann-Whitney p {rule['p_value']:.2g}), {want} asked")
    else:
        summary = f"speed {key}: {step.detail}"
    return _sig("speed_regression", key, summary, [step.detail])


def comparison_signature(c: ComparisonRecord) -> Signature | None:
    """The ``output_mismatch`` signature of a diverged comparison record, else None.

    The key names the comparison (group/model/prompt, candidate vs reference), not the
    token index: a divergence that moves is the same failure; triage reports the move.
    """
    if c.status != DIVERGED:
        return None
    where = f"{c.group}/{c.model}/{c.prompt}: {c.candidate} vs {c.reference}"
    div = c.first_divergence or {}
    if div:
        ref, cand = div.get("reference") or {}, div.get("candidate") or {}
        at = (f"token {div.get('index')}: {ref.get('piece', 'end of output')!r} vs "
              f"{cand.get('piece', 'end of output')!r}")
    else:
        at = c.detail or DIVERGED
    return _sig("output_mismatch", where, f"{where} diverged at {at}", [c.detail or at])


def step_logs(run_dir: Path, step: StepRecord) -> list[Path]:
    """The log files that show why ``step`` failed (existing files only, most telling first).

    build: build.log when the build ran (else configure.log) and error.log; test: the
    per-test logs of failed tests, then ctest.log; generate: the .stderr files of the
    generations its failure facts name (all .stderr files when they name none); expectations:
    its log, then the stderr of each load a rule failed on.
    """
    layout = RunLayout(run_dir)
    found: list[Path] = []
    spec = step_spec(step.step)
    evidence = spec.evidence if spec is not None else "detail"
    if evidence in ("build-logs", "compile-logs"):
        logs = _build_logs(run_dir, step)
        if _rc((logs / BUILD_FILES["configure"]).with_suffix(".rc")) not in (None, 0) \
                or not (logs / BUILD_FILES["build"]).exists():
            found.append(logs / BUILD_FILES["configure"])
        else:
            found.append(logs / BUILD_FILES["build"])
        found.append(logs / BUILD_FILES["error"])
    elif evidence == "test-logs":
        test_dir = layout.tests(step.platform, step.step)
        found += [test_dir / f"{n}.log" for n, _ in _failed_tests(test_dir)]
        found.append(test_dir / TESTS_FILES["log"])
    elif evidence == "upstream-suite":
        found.append(layout.upstream_file(step.platform, "log", "fork"))
    elif evidence == "generations":
        for fact in step.failures:
            if fact.kind == "generation":
                found += _generation_logs(layout, step, fact)
        if not found:
            found += layout.generation_files(step.platform, step.config, ".stderr")
    if step.log:
        found.append(run_dir / step.log)
    if evidence == "expectations":  # the stderr of each load a rule failed on, where the buffer lines are
        found += [run_dir / f.log for f in step.failures if f.kind == "expectation" and f.log]
    seen: list[Path] = []
    for path in found:
        if path.is_file() and path not in seen and path.suffix != ".xml":
            seen.append(path)
    return seen


#: Every signature of a failed step whose failures are several (one per generation, per rule and model), by its
#: evidence: classify_run keeps the others beside the first.
_EVERY: dict[str, Callable[[Path, StepRecord], list[Signature]]] = {
    "generations": generate_signatures,
    "expectations": expectation_signatures,
}


def classify_run(run_dir: Path, *, write: bool = True) -> list[dict]:
    """Classify every failed step and diverged comparison of the run in ``run_dir``.

    Returns a list of ``{platform, config, step, signature: {kind, key, summary, evidence}}``
    (a generate step with several distinct failures also has ``other_signatures``, the
    rest of them; comparisons have step ``compare``, config = the candidate, and also group, model,
    prompt, reference) in summary order, and writes it to ``run_dir/signatures.json``
    unless ``write`` is False.  Raises FileNotFoundError when there is no summary.json
    and harness.record.records.RecordError (a ValueError) when it cannot be read.
    """
    steps, comparisons, _ = load_records(run_dir)
    entries: list[dict[str, Any]] = []
    for step in steps:
        sig = classify_step(run_dir, step)
        if sig:
            entry: dict[str, Any] = {"platform": step.platform, "config": step.config, "step": step.step,
                                     "signature": asdict(sig)}
            spec = step_spec(step.step)
            every_of = _EVERY.get(spec.evidence) if spec is not None else None
            if every_of is not None:
                every = every_of(run_dir, step)
                others = [asdict(s) for s in every if (s.kind, s.key) != (sig.kind, sig.key)]
                if others:
                    entry["other_signatures"] = others  # every failing model's and generation's error is kept
            entries.append(entry)
    for cmp in comparisons:
        sig = comparison_signature(cmp)
        if sig:
            entries.append({"platform": cmp.platform, "config": cmp.candidate, "step": "compare",
                            "group": cmp.group, "model": cmp.model, "prompt": cmp.prompt,
                            "reference": cmp.reference, "signature": asdict(sig)})
    if write:
        write_json(RunLayout(run_dir).signatures_json, entries)
    return entries


def load_signatures(run_dir: Path) -> list[dict]:
    """The run's signatures: ``signatures.json`` when the run has one, else computed (not written).

    Same shape as :func:`classify_run`; an unreadable signatures.json is recomputed.
    """
    try:
        return [e.to_json() for e in read_signatures(RunLayout(run_dir).signatures_json)]
    except (OSError, RecordError):
        return classify_run(run_dir, write=False)
