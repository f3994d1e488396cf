"""test-backend-ops on base and fork (``test --upstream-tests`` on a platform whose programs run on a GPU and that
declares ``backend_ops`` in matrix.yaml): upstream's check of each ggml op on the GPU against the CPU, and its
time per op.

Both builds get the ``test-backend-ops`` target (harness.stages.building.builds.Builds.build_more); each runs
``test-backend-ops test -o <ops> [-b <backend>] --output sql`` (step ``backend-ops-test``) and, where ``perf`` ops
are declared, ``test-backend-ops perf -o <op> [-b <backend>] --output sql`` one op at a time, base and fork in turn
(step ``backend-ops-perf``).  Upstream's SQL output is its own record of every case (backend, op, parameters,
supported, passed, time per run, FLOPS, bandwidth): the statements are loaded into SQLite (Python's sqlite3), never
parsed by hand.  Each mode has a budget for both builds (matrix.yaml ``backend_ops.budget_s``): a mode that runs
past it is stopped, keeps what it measured and records its step ``incomplete``.

The test mode's pairs are classified as upstream's suite is (harness.record.upstream_tests.classify); a case the
backend supports on neither side is ``unsupported``.  Step ``backend-ops-test`` of config ``fork`` fails where a
case passes on base and fails on the fork.  The perf mode is information beside the speed stage, judged by no
rule: ``backend-ops-perf.sqlite`` holds both builds' rows, ``build_commit`` set to ``base`` and ``fork`` (upstream
writes ggml's commit there, which the series does not change), so that upstream's own
``scripts/compare-llama-bench.py -t test-backend-ops -i backend-ops-perf.sqlite -b base -c fork`` prints the fork
against base; ``backend-ops-perf.json`` holds the same pairs for the report.
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
from ...record.upstream_tests import CLASSES, REGRESSED, UNSUPPORTED, classify
from ..shape import Context
from ...common.statuses import STEP_INCOMPLETE
from ...record.native_tests import CASE_FAILED, CASE_PASSED, CASE_SKIPPED

#: The target and program of upstream's op check.
TARGET = "test-backend-ops"

#: The variants compared, fork first.
VARIANTS = ("fork", "base")


@dataclass(frozen=True)
class OpCase:
    """One case of test-backend-ops' SQL output: the backend, op and parameters, whether the backend supports it,
    whether it passed (test mode), its time per run in microseconds, FLOPS (floating-point operations per second)
    and bandwidth in GB/s (perf mode; 0 where the mode or op gives none)."""

    backend: str
    op: str
    params: str
    supported: bool
    passed: bool
    time_us: float
    flops: float = 0.0
    bandwidth_gb_s: float = 0.0


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
        rows = db.execute("SELECT backend_name, op_name, op_params, supported, passed, time_us, flops, bandwidth_gb_s "
                          "FROM test_backend_ops")
        return [OpCase(str(b), str(o), str(pa), bool(int(s)), bool(int(ok)), float(t or 0.0), float(f or 0.0),
                       float(bw or 0.0)) for b, o, pa, s, ok, t, f, bw in rows]
    finally:
        db.close()


def case_outcome(c: OpCase) -> str:
    """A case's outcome as a ctest side's: skipped where the backend does not support it, else passed or failed."""
    return CASE_SKIPPED if not c.supported else CASE_PASSED if c.passed else CASE_FAILED


def case_class(base: OpCase | None, fork: OpCase | None) -> str:
    """The class of a case's pair (None: the side did not report it): :data:`UNSUPPORTED` where neither side's
    backend supports it, else :func:`classify` of the two outcomes (a case base passes and the fork no longer
    supports is a regression)."""
    if base is not None and fork is not None and not base.supported and not fork.supported:
        return UNSUPPORTED
    return classify(case_outcome(base) if base else "absent", case_outcome(fork) if fork else "absent")


class OverBudget(Exception):
    """A mode of test-backend-ops ran past its budget (matrix.yaml ``backend_ops.budget_s``)."""


def _run_mode(ctx: Context, p: Platform, variant: str, mode: str, ops: tuple[str, ...], deadline: float) \
        -> tuple[list[OpCase], str, str]:
    """Run ``test-backend-ops <mode> -o <ops> [-b <backend>] [-p <perf_params>] --output sql`` of ``variant``, stopped at ``deadline``
    (time.monotonic()); (its cases, its SQL as printed, why it could not run or "").  The SQL is appended to the
    variant's ``backend-ops.sql`` of the mode.  Raises :class:`OverBudget` when the deadline stopped it."""
    assert p.backend_ops is not None
    layout = ctx.run.layout
    built = ctx.build_variant(p, variant)
    if built.status != STEP_PASSED:
        return [], "", f"{variant} build {built.status}: {built.detail}"
    where = layout.upstream_tests(p.name, f"backend-ops-{mode}-{variant}")
    rc, _ = ctx.builds.build_more(p, variant, [TARGET], layout.upstream_file(p.name, "build", where.name))
    if rc != 0:
        return [], "", f"{variant}: building {TARGET} failed (exit {rc})"
    backend = ["-b", p.backend_ops.backend] if p.backend_ops.backend else []
    params = ["-p", p.backend_ops.perf_params] if mode == "perf" and p.backend_ops.perf_params else []
    argv = [str(built.bin_dir / (TARGET + executable_suffix(p))), mode, "-o", ",".join(ops), *backend, *params,
            "--output", "sql"]
    left = deadline - time.monotonic()
    if left <= 0:
        raise OverBudget(f"{variant} {','.join(ops)} not started")
    done, out, err = proc.run_capture(argv, timeout_s=left)
    where.mkdir(parents=True, exist_ok=True)
    with open(layout.upstream_file(p.name, "sql", where.name), "ab") as fh:
        fh.write(out)
    with open(layout.upstream_file(p.name, "log", where.name), "ab") as fh:
        fh.write(err)
    if done.timed_out:  # the budget ran out while it ran: its half-written output is kept in the log, not judged
        raise OverBudget(f"{variant} {','.join(ops)} stopped after {left:.0f} s")
    text = out.decode("utf-8", "replace")
    try:
        cases = read_cases(text)
    except sqlite3.Error as exc:
        return [], "", f"{variant}: {TARGET} {mode} wrote no readable SQL ({exc}; exit {done.returncode})"
    if not cases:
        return [], "", f"{variant}: {TARGET} {mode} reported no case (exit {done.returncode})"
    return cases, sql_statements(text), ""


def judge_test_mode(base: list[OpCase], fork: list[OpCase]) -> tuple[str, str, list[str]]:
    """(status, detail, regressed case names) of the test mode's pairs: each (backend, op, params) classified; the
    step fails where a case passes on base and fails on the fork."""
    b = {(c.backend, c.op, c.params): c for c in base}
    f = {(c.backend, c.op, c.params): c for c in fork}
    classes: dict[str, list[str]] = {}
    for key in list(dict.fromkeys([*f, *b])):
        cls = case_class(b.get(key), f.get(key))
        classes.setdefault(cls, []).append(f"{key[1]}({key[2]}) on {key[0]}")
    regressed = classes.get(REGRESSED, [])
    parts = [f"{len(v)} {CLASSES[c]}" for c, v in classes.items() if c != REGRESSED]
    if regressed:
        parts.insert(0, f"{len(regressed)} regressed (pass on base, fail on the fork): {'; '.join(regressed[:5])}"
                        + (f" (+{len(regressed) - 5} more)" if len(regressed) > 5 else ""))
    return (STEP_FAILED if regressed else STEP_PASSED), "; ".join(parts), regressed


def run_backend_ops(ctx: Context, p: Platform) -> None:
    """Record step ``backend-ops-test`` of ``p`` and, where perf ops are declared, step ``backend-ops-perf`` (see the
    module docstring)."""
    assert p.backend_ops is not None
    step = "backend-ops-test"
    start = time.monotonic()
    deadline = start + p.backend_ops.budget("test")
    with ctx.doing(p.name, "fork", step), ctx.console.step(f"[{p.name}] {step}", total=len(VARIANTS)) as shown:
        got: dict[str, list[OpCase]] = {}
        why = ""
        try:
            for variant in VARIANTS:
                got[variant], _, why = _run_mode(ctx, p, variant, "test", p.backend_ops.test, deadline)
                ctx.console.advance(shown, what=variant)
                if why:
                    break
        except OverBudget as exc:
            why = f"ran past its budget of {p.backend_ops.budget('test'):.0f} s ({exc}; matrix.yaml backend_ops.budget_s)"
            record = StepRecord(p.name, "fork", step, STEP_INCOMPLETE, round(time.monotonic() - start, 1), why)
        else:
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
        ctx.run.record_step(_perf(ctx, p))


def perf_pairs(base: list[OpCase], fork: list[OpCase]) -> list[dict]:
    """The perf mode's cases that both builds support and measured, in the fork's order: backend, op, params, each
    side's time per run (us), FLOPS and GB/s, and ``ratio`` (fork time / base time: above 1 the fork is slower)."""
    b = {(c.backend, c.op, c.params): c for c in base if c.supported and c.time_us}
    rows = []
    for c in fork:
        other = b.get((c.backend, c.op, c.params))
        if not c.supported or not c.time_us or other is None:
            continue
        rows.append({"backend": c.backend, "op": c.op, "params": c.params, "base_us": other.time_us,
                     "fork_us": c.time_us, "base_flops": other.flops, "fork_flops": c.flops,
                     "base_gb_s": other.bandwidth_gb_s, "fork_gb_s": c.bandwidth_gb_s,
                     "ratio": round(c.time_us / other.time_us, 4)})
    return rows


def write_perf_database(path: Path, sql: dict[str, str]) -> None:
    """Write the SQLite database ``path`` from each variant's SQL (variant -> statements as test-backend-ops printed
    them), each variant's rows with ``build_commit`` set to its name (``base``, ``fork``): the input of upstream's
    ``scripts/compare-llama-bench.py -t test-backend-ops -i PATH -b base -c fork``."""
    path.unlink(missing_ok=True)
    db = sqlite3.connect(path)
    try:
        for variant, text in sql.items():
            db.executescript(text)
            db.execute("UPDATE test_backend_ops SET build_commit = ? WHERE build_commit NOT IN (%s)"
                       % ",".join("?" * len(sql)), (variant, *sql))
        db.commit()
    finally:
        db.close()


def _perf(ctx: Context, p: Platform) -> StepRecord:
    """Step ``backend-ops-perf``: each perf op on base then fork, within the mode's budget; the pairs into
    ``backend-ops-perf.json`` and ``backend-ops-perf.sqlite`` (see the module docstring)."""
    assert p.backend_ops is not None
    step, ops = "backend-ops-perf", p.backend_ops.perf
    start = time.monotonic()
    deadline = start + p.backend_ops.budget("perf")
    got: dict[str, list[OpCase]] = {v: [] for v in VARIANTS}
    sql: dict[str, str] = {v: "" for v in ("base", "fork")}
    stopped = why = ""
    with ctx.doing(p.name, "fork", step), \
            ctx.console.step(f"[{p.name}] {step}", total=len(ops) * len(VARIANTS)) as shown:
        try:
            for op in ops:
                for variant in ("base", "fork"):
                    cases, text, why = _run_mode(ctx, p, variant, "perf", (op,), deadline)
                    if why:
                        break
                    got[variant] += cases
                    sql[variant] += text + "\n"
                    ctx.console.advance(shown, what=f"{variant} {op}")
                if why:
                    break
        except OverBudget as exc:
            stopped = f"{exc}"
        layout = ctx.run.layout
        rows = perf_pairs(got["base"], got["fork"])
        path: Path = layout.upstream_file(p.name, "perf")
        database = path.with_suffix(".sqlite")
        write_json(path, {"ops": list(ops), "backend": p.backend_ops.backend, "cases": rows,
                          "database": database.name, "stopped": stopped})
        if all(sql.values()):
            write_perf_database(database, sql)
        measured = f"{len(rows)} cases of {', '.join(ops)} measured on both"
        if rows:
            ratios = sorted(r["ratio"] for r in rows)
            measured += (f"; fork/base time per run median {ratios[len(ratios) // 2]:.3f} (min {ratios[0]:.3f}, "
                         f"max {ratios[-1]:.3f}); information, no rule; compare-llama-bench.py -t test-backend-ops "
                         f"-i {layout.relative(database)} -b base -c fork")
        seconds = round(time.monotonic() - start, 1)
        if why:
            record = StepRecord(p.name, "fork", step, STEP_ERROR, seconds, why, failures=[Failure("exception", message=why)])
        elif stopped:
            record = StepRecord(p.name, "fork", step, STEP_INCOMPLETE, seconds,
                                f"ran past its budget of {p.backend_ops.budget('perf'):.0f} s ({stopped}; matrix.yaml "
                                f"backend_ops.budget_s); {measured}", layout.relative(path))
        else:
            record = StepRecord(p.name, "fork", step, STEP_PASSED, seconds, measured, layout.relative(path))
        shown.finish(record.status, record.detail, record.log if record.status != STEP_PASSED else "")
    return record
