"""test-backend-ops on base and fork (``test --upstream-tests`` on a platform whose programs run on a GPU and that
declares ``backend_ops`` in matrix.yaml): upstream's check of each ggml op on the GPU against the CPU.

Both builds get the ``test-backend-ops`` target (harness.stages.building.builds.Builds.build_more); each runs
``test-backend-ops test -o <ops> --output sql`` and, where ``perf`` ops are declared,
``test-backend-ops perf -o <ops> --output sql``.  Upstream's SQL output is its own record of every case (backend,
op, parameters, supported, passed, time per run): the statements are loaded into an in-memory SQLite database
(Python's sqlite3), never parsed by hand.  Each case's pair of outcomes is classified as upstream's suite is
(harness.record.upstream_tests.classify): step ``backend-ops-test`` of config ``fork`` fails where a case passes on
base and fails on the fork.  The perf mode is information beside the speed stage (the fork's time per run against
base's, case by case, in ``backend-ops-perf.json``): it records no step, since no rule judges it.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from ...common import proc
from ...matrix.config import Platform
from ...matrix.platforms import executable_suffix
from ...record.records import Failure, StepRecord
from ...record.json_files import write_json
from ...common.statuses import STEP_ERROR, STEP_FAILED, STEP_PASSED
from ...record.upstream_tests import CLASSES, REGRESSED, classify
from ..shape import Context
from ...record.native_tests import CASE_FAILED, CASE_PASSED, CASE_SKIPPED

#: The target and program of upstream's op check.
TARGET = "test-backend-ops"

#: Seconds one mode of test-backend-ops may run per build (the declared ops on an H200 take a few minutes).
TIMEOUT_S = 1800

#: The variants compared, fork first.
VARIANTS = ("fork", "base")


@dataclass(frozen=True)
class OpCase:
    """One case of test-backend-ops' SQL output: the backend, op and parameters, whether the backend supports it,
    whether it passed (test mode) and its time per run in microseconds (perf mode)."""

    backend: str
    op: str
    params: str
    supported: bool
    passed: bool
    time_us: float


def sql_statements(text: str) -> str:
    """The SQL of test-backend-ops' ``--output sql`` in ``text`` (its stdout): the CREATE TABLE statement and every
    INSERT, each line as printed; other lines a backend prints are left out."""
    out, in_create = [], False
    for line in text.splitlines():
        if line.startswith("CREATE TABLE"):
            in_create = True
        if in_create or line.startswith("INSERT INTO "):
            out.append(line)
        if in_create and line.strip() == ");":
            in_create = False
    return "\n".join(out)


def read_cases(text: str) -> list[OpCase]:
    """The cases of test-backend-ops' SQL output ``text``, loaded into an in-memory SQLite database.  Raises
    sqlite3.Error for output that is not upstream's SQL."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(sql_statements(text))
        rows = db.execute("SELECT backend_name, op_name, op_params, supported, passed, time_us FROM test_backend_ops")
        return [OpCase(str(b), str(o), str(pa), bool(int(s)), bool(int(ok)), float(t or 0.0))
                for b, o, pa, s, ok, t in rows]
    finally:
        db.close()


def case_outcome(c: OpCase) -> str:
    """A case's outcome as a ctest side's: skipped where the backend does not support it, else passed or failed."""
    return CASE_SKIPPED if not c.supported else CASE_PASSED if c.passed else CASE_FAILED


def _run_mode(ctx: Context, p: Platform, variant: str, mode: str, ops: tuple[str, ...]) -> tuple[list[OpCase], str]:
    """Run ``test-backend-ops <mode> -o <ops> --output sql`` of ``variant``; (its cases, why it could not run or "")."""
    layout = ctx.run.layout
    built = ctx.build_variant(p, variant)
    if built.status != STEP_PASSED:
        return [], f"{variant} build {built.status}: {built.detail}"
    where = layout.upstream_tests(p.name, f"backend-ops-{mode}-{variant}")
    rc, _ = ctx.builds.build_more(p, variant, [TARGET], layout.upstream_file(p.name, "build", where.name))
    if rc != 0:
        return [], f"{variant}: building {TARGET} failed (exit {rc})"
    argv = [str(built.bin_dir / (TARGET + executable_suffix(p))), mode, "-o", ",".join(ops), "--output", "sql"]
    done, out, err = proc.run_capture(argv, timeout_s=TIMEOUT_S)
    where.mkdir(parents=True, exist_ok=True)
    layout.upstream_file(p.name, "sql", where.name).write_bytes(out)
    layout.upstream_file(p.name, "log", where.name).write_bytes(err)
    try:
        cases = read_cases(out.decode("utf-8", "replace"))
    except sqlite3.Error as exc:
        return [], f"{variant}: {TARGET} {mode} wrote no readable SQL ({exc}; exit {done.returncode})"
    if not cases:
        return [], f"{variant}: {TARGET} {mode} reported no case (exit {done.returncode})"
    return cases, ""


def judge_test_mode(base: list[OpCase], fork: list[OpCase]) -> tuple[str, str, list[str]]:
    """(status, detail, regressed case names) of the test mode's pairs: each (backend, op, params) classified; the
    step fails where a case passes on base and fails on the fork."""
    b = {(c.backend, c.op, c.params): case_outcome(c) for c in base}
    f = {(c.backend, c.op, c.params): case_outcome(c) for c in fork}
    classes: dict[str, list[str]] = {}
    for key in list(dict.fromkeys([*f, *b])):
        cls = classify(b.get(key, "absent"), f.get(key, "absent"))
        classes.setdefault(cls, []).append(f"{key[1]}({key[2]}) on {key[0]}")
    regressed = classes.get(REGRESSED, [])
    parts = [f"{len(v)} {CLASSES[c]}" for c, v in classes.items() if c != REGRESSED]
    if regressed:
        parts.insert(0, f"{len(regressed)} regressed (pass on base, fail on the fork): {'; '.join(regressed[:5])}"
                        + (f" (+{len(regressed) - 5} more)" if len(regressed) > 5 else ""))
    return (STEP_FAILED if regressed else STEP_PASSED), "; ".join(parts), regressed


def run_backend_ops(ctx: Context, p: Platform) -> None:
    """Record step ``backend-ops-test`` of ``p`` and write the perf mode's information (see the module docstring)."""
    assert p.backend_ops is not None
    step = "backend-ops-test"
    start = time.monotonic()
    with ctx.doing(p.name, "fork", step), ctx.console.step(f"[{p.name}] {step}") as shown:
        got: dict[str, list[OpCase]] = {}
        why = ""
        for variant in VARIANTS:
            got[variant], why = _run_mode(ctx, p, variant, "test", p.backend_ops.test)
            if why:
                break
        if why:
            record = StepRecord(p.name, "fork", step, STEP_ERROR, round(time.monotonic() - start, 1), why,
                                failures=[Failure("exception", message=why)])
        else:
            status, detail, regressed = judge_test_mode(got["base"], got["fork"])
            record = StepRecord(p.name, "fork", step, status, round(time.monotonic() - start, 1), detail,
                                failures=[Failure("upstream-test", message=f"{TARGET}: {r} (passes on base)")
                                          for r in regressed])
        shown.finish(record.status, record.detail, "")
    ctx.run.record_step(record)
    if p.backend_ops.perf:
        _perf(ctx, p)


def _perf(ctx: Context, p: Platform) -> None:
    """The perf mode on both builds: each case's time per run, fork against base, into backend-ops-perf.json."""
    assert p.backend_ops is not None
    got: dict[str, list[OpCase]] = {}
    for variant in VARIANTS:
        got[variant], why = _run_mode(ctx, p, variant, "perf", p.backend_ops.perf)
        if why:
            ctx.say(f"[{p.name}] {TARGET} perf: not measured: {why}")
            return
    base = {(c.backend, c.op, c.params): c.time_us for c in got["base"] if c.supported and c.time_us}
    rows = [{"backend": c.backend, "op": c.op, "params": c.params, "base_us": base[(c.backend, c.op, c.params)],
             "fork_us": c.time_us, "ratio": round(c.time_us / base[(c.backend, c.op, c.params)], 4)}
            for c in got["fork"] if c.supported and c.time_us and (c.backend, c.op, c.params) in base]
    path: Path = ctx.run.layout.upstream_file(p.name, "perf")
    write_json(path, {"ops": list(p.backend_ops.perf), "cases": rows})
    if rows:
        ratios = sorted(float(r["ratio"]) for r in rows)  # type: ignore[arg-type]  # a row's ratio is a float
        ctx.say(f"[{p.name}] {TARGET} perf (information): {len(rows)} cases, fork/base time per run median "
                f"{ratios[len(ratios) // 2]:.3f} (min {ratios[0]:.3f}, max {ratios[-1]:.3f}); "
                f"{ctx.run.layout.relative(path)}")

