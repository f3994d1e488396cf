"""The ``upstream-tests`` step (``test --upstream-tests``): upstream's own ctest suite on base and fork, side by side.

For each selected platform that sets ``upstream_tests: true`` (matrix.yaml), and where its programs run:

1. both builds (fork first: a broken series fails fast) are built as the build stage builds them, then the test
   targets of the suite's ctest label, asked of that build's own ctest (``--show-only=json-v1``: the executables
   its tests start), with ``cmake --build`` under the run's one job budget (harness.common.jobserver); ccache, based
   at the work directory, compiles each unit once for both trees;
2. ctest runs the label in each build (``--parallel`` as many as the budget's slots, and a member of its pool, so
   the tests never run more at once than the builds could), the tests that matrix.yaml's ``upstream_tests.needs``
   names left out where this machine lacks what they need: declared, skipped with the reason, never passed; so are
   the tests whose own arguments (or declared ``data`` need) name a file of the source tree that is not there
   (:func:`missing_data`: the suite's data left out of the offline mirror), each skipped naming the file;
3. each test's pair of outcomes is classified (harness.record.upstream_tests.classify) and written to
   ``<platform>/upstream-tests/pairs.json``; the step fails only where a test fails on the fork and not on base.

On a platform whose programs run on a GPU and that declares ``backend_ops``, test-backend-ops runs too
(harness.stages.native_tests.backend_ops).  A label whose tests, libraries and environment are byte-identical to a
passed run is reused from the result cache (harness.stages.native_tests.test_cache), per side.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from ...common import proc
from ...kinds.registry import gpu_of
from ...matrix.config import Platform, UpstreamTests
from ...matrix.platforms import cannot_run, executable_suffix
from ...record.native_tests import TestRun
from ...record.records import Failure, StepRecord
from ...record.layout import RunLayout
from ...record.json_files import write_json
from ...common.statuses import STEP_ERROR, STEP_FAILED, STEP_INCOMPLETE, STEP_PASSED, STEP_SKIPPED
from ...record.upstream_tests import ABSENT, CLASSES, DECLARED, DECLARED_SKIP, FAILED_BOTH, FIXED, MISSING, \
    MISSING_DATA, MISSING_PREFIX, REGRESSED, SuiteRecord, TestPair, classify, write_suite
from ..building.build import find_tool
from ..shape import Context, Stage, StepSpec
from .backend_ops import run_backend_ops
from .native_tests import list_tests
from .test_cache import run_tests_reusing, source_dir as source_tree

#: Seconds each test of the suite may run (ctest --timeout): ctest's own default (DART_TESTING_TIMEOUT), which
#: upstream's CI keeps.  test-recurrent-state-rollback and test-save-load-state, which load every architecture's
#: model, take well under a minute on a quiet 2-core machine and ran past 600 s each on the shared one at a load
#: average of 16 (2026-12-05): a timeout there is the machine's, and upstream's limit leaves room for it.
TEST_TIMEOUT_S = 1500

#: ctest's ``--repeat`` for the suite: a test that ran out of time runs once more, on either side, before its
#: outcome counts (a real failure is never repeated).  On the shared machine at a load average of 16,
#: test-recurrent-state-rollback passed on base in 285 s and ran out of 600 s on the fork: one timeout is the
#: machine's as often as the fork's.
REPEAT = "after-timeout:2"

#: The variants a pair compares, in the order they build and run: the fork first, so a broken series fails fast.
VARIANTS = ("fork", "base")


def lacked_needs(suite: UpstreamTests, p: Platform) -> dict[str, str]:
    """Test name -> why it is skipped on ``p``: each test of ``suite.needs`` whose need this machine lacks.

    ``network``: no machine the harness runs on gives its tests one (the harness works offline: docs/platforms.md);
    ``gpu``: a platform whose kind has no device (harness.kinds).  Rule from matrix.yaml ``upstream_tests.needs``."""
    out = {}
    for name, need in suite.needs.items():
        if need.needs == "network" or (need.needs == "gpu" and not gpu_of(p).has_device):
            out[name] = f"needs the {need.needs}: {need.reason}"
    return out


#: The CMake script that reads a build's CTestTestfile.cmake tree: each test's command, or the tests again started
#: through an emulator (its header says how).
CTEST_FILE = Path(__file__).resolve().parent / "ctest_file.cmake"


def ctest_commands(build_dir: Path) -> dict[str, list[str]]:
    """Test name -> its command (argv) as ``build_dir``'s CTestTestfile.cmake declares it, read by CMake itself
    (:data:`CTEST_FILE`): ctest's JSON leaves out the command of a test whose executable is not built yet.  Raises
    OSError when CMake cannot read the tree."""
    done, _, err = proc.run_capture([find_tool("cmake") or "cmake", f"-DBUILD_DIR={build_dir}", "-P", str(CTEST_FILE)],
                                    timeout_s=120)
    if done.returncode != 0:
        raise OSError(f"cmake -P {CTEST_FILE.name} cannot read the tests of {build_dir} (exit {done.returncode}): "
                      + err.decode(errors="replace")[-300:])
    out = {}
    for line in err.decode("utf-8", "replace").splitlines():
        name, *argv = line.split("\t")
        out[name] = argv
    return out


def emulated_tests(build_dir: Path, emulator: Sequence[str], out_dir: Path) -> Path:
    """Write ``out_dir``/CTestTestfile.cmake: every test of ``build_dir`` again, its command started through
    ``emulator`` (its argv) (:data:`CTEST_FILE`), for a cross build whose tests name their executables as upstream does
    (``$<TARGET_FILE:...>``, which CMake never starts through CMAKE_CROSSCOMPILING_EMULATOR; the fork's series
    names the target instead).  Returns ``out_dir`` for ``ctest --test-dir``.  Raises OSError when CMake fails."""
    out_dir.mkdir(parents=True, exist_ok=True)
    done, _, err = proc.run_capture([find_tool("cmake") or "cmake", f"-DBUILD_DIR={build_dir}", f"-DEMULATOR={';'.join(emulator)}",
                                     f"-DOUT={out_dir / 'CTestTestfile.cmake'}", "-P", str(CTEST_FILE)], timeout_s=120)
    if done.returncode != 0:
        raise OSError(f"cmake -P {CTEST_FILE.name} cannot rewrite the tests of {build_dir} (exit {done.returncode}): "
                      + err.decode(errors="replace")[-300:])
    return out_dir


def suite_targets(commands: Sequence[Sequence[str]], build_dir: Path, exe_suffix: str = "") -> list[str]:
    """The executable targets that the tests' ``commands`` start: in each command, the first argument that is a
    file of ``build_dir``'s ``bin/`` (after an emulator, where a cross build names one), its name without
    ``exe_suffix``; in order, each once.  A test that runs a tool outside the build (``cmake -P``) needs none."""
    bin_dir = (build_dir / "bin").resolve()
    out: list[str] = []
    for argv in commands:
        for arg in argv:
            p = Path(arg)
            if p.is_absolute() and p.resolve().parent == bin_dir:
                name = p.name[:-len(exe_suffix)] if exe_suffix and p.name.endswith(exe_suffix) else p.name
                if name not in out:
                    out.append(name)
                break
    return out


def missing_data(commands: dict[str, Sequence[str]], source_dir: Path, suite: UpstreamTests) -> dict[str, str]:
    """Test name -> the first file of ``source_dir`` (a source tree) that the test reads and that is not there, as a
    path relative to the tree: an argument of the test's own command (argv, :func:`ctest_commands`) that is a path
    inside the tree (``models/ggml-vocab-falcon.gguf`` of test-tokenizer-0-falcon), or the ``path`` of a ``data``
    need that ``suite.needs`` declares for a test that reads the file without naming it (test-chat reads
    ``models/templates/`` from its working directory).  A path under the build directory is the tests' own output
    and never missing data."""
    root = source_dir.resolve()
    out: dict[str, str] = {}
    for name, argv in commands.items():
        need = suite.needs.get(name)
        named = [str(root / need.path)] if need is not None and need.needs == "data" and need.path else []
        for arg in [*argv, *named]:
            path = Path(arg)
            if not path.is_absolute():
                continue
            try:
                rel = path.resolve().relative_to(root)
            except ValueError:
                continue
            if not path.exists():
                out[name] = rel.as_posix()
                break
    return out


def outcomes(run: TestRun, known: Sequence[str], missing: dict[str, str] | None = None) \
        -> dict[str, tuple[str, str, float]]:
    """Test name -> (outcome, message, seconds) of one side: ctest's outcome of each test in ``run``, ``missing`` for
    a test of ``missing`` (name -> the absent file, :func:`missing_data`), ``absent`` for one of ``known`` (the
    suite's names across both sides) that this side's ctest does not know."""
    got = {c.name: (c.status, c.message, c.seconds) for c in run.cases}
    got.update({n: (MISSING, MISSING_PREFIX + f, 0.0) for n, f in (missing or {}).items()})
    return {n: got.get(n, (ABSENT, "not registered with ctest in this build", 0.0)) for n in known}


def pair_up(names: Sequence[str], base: dict[str, tuple[str, str, float]], fork: dict[str, tuple[str, str, float]],
            declared: dict[str, str]) -> list[TestPair]:
    """The pairs of ``names`` from each side's :func:`outcomes`; a test of ``declared`` (name -> reason) is
    skipped on both with its reason."""
    pairs = []
    for n in names:
        if n in declared:
            pairs.append(TestPair(n, DECLARED_SKIP, DECLARED_SKIP, DECLARED, need=declared[n]))
            continue
        (b, bm, bs), (f, fm, fs) = base[n], fork[n]
        cls = classify(b, f)
        need = (bm if b == MISSING else fm) if cls == MISSING_DATA else ""
        pairs.append(TestPair(n, b, f, cls, bm, fm, round(bs, 3), round(fs, 3), need))
    return pairs


def describe(record: SuiteRecord) -> str:
    """The step's detail: the count of each class present, regressions first and named, then the tests failing on
    both and those declared, each with its reason."""
    counts = record.counts()
    parts = []
    regressed = record.of(REGRESSED)
    if regressed:
        parts.append(f"{len(regressed)} regressed (pass on base, fail on the fork): "
                     + "; ".join(f"{p.name}: {p.fork_message or p.fork}" for p in regressed))
    for c in CLASSES:
        if c == REGRESSED or not counts[c]:
            continue
        words = CLASSES[c]
        if c in (FAILED_BOTH, FIXED):
            words += ": " + ", ".join(p.name for p in record.of(c))
        if c == MISSING_DATA:
            words += ": " + ", ".join(f"{n} ({f})" for n, f in record.missing_data().items())
        if c == DECLARED:
            needs = sorted({p.need.split(":", 1)[0] for p in record.of(c)})
            words += f" ({', '.join(needs)}): " + ", ".join(p.name for p in record.of(c))
        parts.append(f"{counts[c]} {words}")
    return "; ".join(parts) or "no test"


def _side(ctx: Context, p: Platform, variant: str, suite: UpstreamTests, declared: dict[str, str]) \
        -> tuple[TestRun | None, list[str], dict[str, str], float, str]:
    """Build ``variant``'s suite targets and run its label: (the TestRun or None, the label's test names in ctest's
    order, the tests left out for missing data (:func:`missing_data`), seconds building, why it could not run or
    "")."""
    layout = ctx.run.layout
    built = ctx.build_variant(p, variant)
    if built.status != STEP_PASSED:
        return None, [], {}, 0.0, f"{variant} build {built.status}: {built.detail}"
    out = layout.upstream_tests(p.name, variant)
    out.mkdir(parents=True, exist_ok=True)
    try:
        names = list_tests(built.build_dir, [suite.label])
        if ctx.opts.upstream_only:  # --upstream-test: only those are built and run
            names = [n for n in names if n in ctx.opts.upstream_only]
        commands = ctest_commands(built.build_dir)
    except OSError as exc:
        return None, [], {}, 0.0, f"{variant}: the tests of label {suite.label} cannot be listed: {exc}"
    source_dir = source_tree(built.build_dir)
    missing = {n: f for n, f in missing_data({n: commands.get(n, []) for n in names}, source_dir, suite).items()
               if n not in declared} if source_dir else {}
    left_out = {**declared, **missing}
    suffix = executable_suffix(p)
    targets = suite_targets([commands.get(n, []) for n in names if n not in left_out], built.build_dir, suffix)
    rc, seconds = ctx.builds.build_more(p, variant, targets, layout.upstream_file(p.name, "build", variant))
    if rc != 0:
        return None, names, missing, seconds, (f"{variant}: building the suite's {len(targets)} test targets failed (exit {rc}; "
                                      f"log {layout.relative(layout.upstream_file(p.name, 'build', variant))})")
    emulator = ctx.emulator(p)
    test_dir = built.build_dir
    if emulator and suffix and any(c and c[0].endswith(suffix) for c in commands.values()):
        try:  # upstream's tests start the executables themselves: ctest would never start them through Wine
            test_dir = emulated_tests(built.build_dir, emulator.argv, out / "emulated")
        except OSError as exc:
            return None, names, missing, seconds, f"{variant}: {exc}"
    budget = ctx.builds.job_budget()
    env = {**(emulator.env if emulator else {}), **budget.env()}
    run, _ = run_tests_reusing(ctx.results_cache, ctx.run.id, test_dir, [suite.label],
                               [n for n in names if n not in left_out], out, env=env,
                               emulator_argv=emulator.argv if emulator else (), gpu=gpu_of(p),
                               timeout_s=TEST_TIMEOUT_S, jobs=budget.slots, repeat=REPEAT)
    write_json(layout.upstream_file(p.name, "run", variant), run)
    return run, names, missing, seconds, ""


def run_suite(ctx: Context, p: Platform) -> StepRecord:
    """Upstream's suite on ``p``'s base and fork (see the module docstring); the ``upstream-tests`` step of config
    ``fork``."""
    suite = ctx.matrix.upstream_tests
    declared = lacked_needs(suite, p)
    start = time.monotonic()
    runs: dict[str, TestRun] = {}
    missing: dict[str, dict[str, str]] = {}
    names: list[str] = []
    record = SuiteRecord(suite.label)
    for variant in VARIANTS:
        run, listed, missing[variant], build_s, why = _side(ctx, p, variant, suite, declared)
        record.build_seconds[variant] = round(build_s, 1)
        if run is None:
            return StepRecord(p.name, "fork", RunLayout.UPSTREAM_STEP, STEP_ERROR, round(time.monotonic() - start, 1),
                              why, failures=[Failure("blocked", build=variant, message=why)
                                             if "build" in why.split(":")[0] else Failure("exception", message=why)])
        runs[variant] = run
        record.seconds[variant] = round(run.seconds, 1)
        names += [n for n in listed if n not in names]
    unknown = [n for n in ctx.opts.upstream_only if n not in names]
    if unknown:
        why = (f"--upstream-test {', '.join(unknown)}: no such test in label {suite.label} of {p.name}, on base or "
               "fork")
        return StepRecord(p.name, "fork", RunLayout.UPSTREAM_STEP, STEP_ERROR, round(time.monotonic() - start, 1),
                          why, failures=[Failure("exception", message=why)])
    record.pairs = pair_up(names, outcomes(runs["base"], names, missing["base"]),
                           outcomes(runs["fork"], names, missing["fork"]), declared)
    layout = ctx.run.layout
    write_suite(layout.upstream_file(p.name, "pairs"), record)
    regressed = record.of(REGRESSED)
    fork_log = layout.relative(layout.upstream_file(p.name, "log", "fork"))
    status = STEP_FAILED if regressed else STEP_PASSED
    detail = describe(record)
    if ctx.opts.upstream_only:
        detail = f"only {', '.join(ctx.opts.upstream_only)} (--upstream-test): {detail}"
    return StepRecord(p.name, "fork", RunLayout.UPSTREAM_STEP, status, round(time.monotonic() - start, 1),
                      detail, layout.relative(layout.upstream_file(p.name, "junit", "fork")),
                      [Failure("upstream-test", message=f"{t.name}: {t.fork_message or t.fork} (passes on base)",
                               log=fork_log) for t in regressed],
                      unproven=f"upstream suite on {p.name}: {record.unproven()}" if record.unproven() else "")


def run_upstream_tests(ctx: Context) -> None:
    """Record the ``upstream-tests`` step of each selected platform that sets ``upstream_tests`` and whose programs
    run here (only with ``--upstream-tests``; the test stage records the platforms that cannot run), and
    test-backend-ops where the platform declares it."""
    if not ctx.opts.upstream_tests:
        return
    for name in ctx.selection.platform_names():
        p = ctx.matrix.platform(name)
        if not p.upstream_tests or cannot_run(p):
            continue
        with ctx.doing(p.name, "fork", RunLayout.UPSTREAM_STEP), \
                ctx.console.step(f"[{p.name}] {RunLayout.UPSTREAM_STEP}",
                                 watch=ctx.run.layout.upstream_file(p.name, "build", "fork")) as shown:
            try:
                step = run_suite(ctx, p)
            except RuntimeError as exc:  # the emulator missing or its prefix not made
                step = StepRecord(p.name, "fork", RunLayout.UPSTREAM_STEP, STEP_ERROR, detail=str(exc),
                                  failures=[Failure("exception", message=str(exc))])
            shown.finish(step.status, step.detail, ctx.run.layout.upstream_file(p.name, "log", "fork")
                         if step.status != STEP_PASSED else "")
        ctx.run.record_step(step)
        if p.backend_ops is not None:
            run_backend_ops(ctx, p)


#: The names of the steps this stage may record: the suite's, and test-backend-ops' (``backend-ops-<mode>``).
STEP_NAMES = (RunLayout.UPSTREAM_STEP, "backend-ops-")
_STATUSES = (STEP_PASSED, STEP_FAILED, STEP_ERROR, STEP_SKIPPED)

STAGE = Stage("upstream-tests", command="test", role="native_tests", reads=("matrix", "builds"), writes=("builds", "steps", "files"),
              steps=(StepSpec(RunLayout.UPSTREAM_STEP, _STATUSES, "upstream-suite"),
                     StepSpec("backend-ops-", (*_STATUSES, STEP_INCOMPLETE))),  # incomplete: a mode past its budget
              run=run_upstream_tests)
