"""Stage 4: run the fork's native test binaries through ctest, by label.

ctest is asked for the platform's labels (``-L``) restricted to the test
targets that were built (``-R``), writes JUnit XML (``--output-junit``), and
the XML is read back into one record per test binary.  Test targets the
platform lists but ctest does not know (e.g. a CUDA test in a CPU build) are
recorded as skipped with that reason.
"""

from __future__ import annotations

import re
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Mapping, Sequence

from ...common import proc
from ...record.native_tests import CASE_FAILED, CASE_PASSED, CASE_SKIPPED, TestCase, TestRun
from ...record.layout import TESTS_FILES
from ..building.build import find_tool
from ...common.statuses import STEP_ERROR, STEP_FAILED, STEP_PASSED, STEP_SKIPPED


def parse_junit(path: Path) -> list[TestCase]:
    """Read ctest's JUnit XML at ``path`` into TestCase records (testcase elements, any nesting).

    Raises ET.ParseError for malformed XML.
    """
    root = ET.parse(path).getroot()
    cases = []
    for tc in root.iter("testcase"):
        name = tc.get("name", "?")
        seconds = float(tc.get("time") or 0.0)
        status, message = CASE_PASSED, ""
        if tc.find("failure") is not None or tc.find("error") is not None:
            node = tc.find("failure")
            if node is None:
                node = tc.find("error")
            status, message = CASE_FAILED, ((node.get("message") if node is not None else None) or "").strip()
        elif tc.find("skipped") is not None or tc.get("status") in ("notrun", "disabled"):
            node = tc.find("skipped")
            status = CASE_SKIPPED
            message = ((node.get("message") if node is not None else None) or tc.get("status") or "").strip()
        cases.append(TestCase(name, status, seconds, message))
    return cases


def list_tests(build_dir: Path, labels: Sequence[str]) -> list[str]:
    """Names of ctest tests in ``build_dir`` carrying any of ``labels`` (``ctest -N``)."""
    ctest = find_tool("ctest") or "ctest"
    argv = [ctest, "--test-dir", str(build_dir), "-N"]
    if labels:
        argv += ["-L", "|".join(f"^{re.escape(lab)}$" for lab in labels)]
    _, out, _ = proc.run_capture(argv, timeout_s=300)
    return re.findall(r"^\s*Test\s+#\d+:\s+(\S+)", out.decode(errors="replace"), flags=re.M)


def run_ctest(build_dir: Path, labels: Sequence[str], targets: Sequence[str], out_dir: Path, *,
              timeout_s: float = 900, env: Mapping[str, str] | None = None,
              wrapper: Sequence[str] = (), reference_junit: Path | None = None, exe_suffix: str = "", jobs: int = 1,
              repeat: str = "") -> TestRun:
    """Run the tests of ``build_dir`` with any of ``labels`` whose names are in ``targets``.

    Writes ``out_dir/ctest.log`` and ``out_dir/junit.xml``.  ``wrapper`` (e.g.
    compute-sanitizer's argv) is prefixed to each test command by running the
    test binaries directly instead of through ctest.  Returns a TestRun whose
    status is passed (all passed or skipped, at least one passed), failed, or
    skipped (nothing to run); per-test ``timeout_s`` seconds.  With a ``wrapper``,
    ``reference_junit`` (the plain run's JUnit) is used to check that the wrapper really ran
    each test (see :func:`wrapper_skipped_test`); ``exe_suffix``: the file name suffix of the platform's
    executables (harness.kinds.shape.OsKind.executable_suffix), for the binaries a wrapper runs.  ``jobs``: tests at once (ctest ``--parallel``; where
    ``env`` names a GNU make jobserver, ctest 3.29+ also takes one of its tokens for each test it starts).
    ``repeat``: ctest's ``--repeat`` mode (``after-timeout:2``: a test that ran out of time runs once more; "" none).
    """
    out_dir = out_dir.resolve()  # ctest resolves relative paths against --test-dir
    out_dir.mkdir(parents=True, exist_ok=True)
    log, junit = out_dir / TESTS_FILES["log"], out_dir / TESTS_FILES["junit"]
    known = list_tests(build_dir, labels)
    selected = [t for t in targets if t in known]
    missing = [t for t in targets if t not in known]
    run = TestRun(status=STEP_SKIPPED, junit=junit, log=log)
    for name in missing:
        # the platform builds this test target, so a missing registration is a broken series or matrix
        run.cases.append(TestCase(name, CASE_FAILED, 0.0, "built but not registered with ctest under the labels "
                                                      f"{', '.join(labels)}"))
    if not selected:
        run.status = STEP_FAILED if missing else STEP_SKIPPED
        run.detail = (f"not registered with ctest: {', '.join(missing)}" if missing else "no test selected")
        log.write_text(run.detail + "\n")
        return run
    ctest = find_tool("ctest") or "ctest"
    argv = [ctest, "--test-dir", str(build_dir), "--output-on-failure", "--no-tests=error",
            "--timeout", str(int(timeout_s)), "--output-junit", str(junit),
            "-L", "|".join(f"^{re.escape(lab)}$" for lab in labels),
            "-R", "^(" + "|".join(re.escape(t) for t in selected) + ")$"]
    if jobs > 1:
        argv += ["--parallel", str(jobs)]
    if repeat:
        argv += ["--repeat", repeat]
    start = time.monotonic()
    if wrapper:
        return _run_wrapped(build_dir, selected, wrapper, out_dir, run, timeout_s, env, reference_junit, exe_suffix)
    with open(log, "wb") as fh:
        fh.write(("$ " + proc.command_line(argv, env) + "\n").encode())
        fh.flush()
        done = proc.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
    run.seconds = time.monotonic() - start
    returncode = done.returncode if done.returncode is not None else -1
    (out_dir / "ctest.rc").write_text(f"{returncode}\n")
    try:
        run.cases += parse_junit(junit)
    except (OSError, ET.ParseError) as exc:
        run.status, run.detail = STEP_ERROR, f"ctest wrote no readable JUnit XML ({exc}); exit {returncode}"
        return run
    counts = run.counts()
    if missing or counts[CASE_FAILED] or returncode != 0:
        run.status = STEP_FAILED
        failed = [c.name for c in run.cases if c.status == CASE_FAILED]
        run.detail = f"failed: {', '.join(failed)}" if failed else f"ctest exit {returncode}"
    elif counts[CASE_PASSED]:
        run.status = STEP_PASSED
        run.detail = f"{counts[CASE_PASSED]} passed, {counts[CASE_SKIPPED]} skipped"
    else:
        run.detail = "every test skipped"
    return run


#: Lines compute-sanitizer itself prints (its banner, reports and summary) start with this.
SANITIZER_PREFIX = "========="
#: A test's own count of its cases ("12/12 tests passed", test-backend-ops and others).
_TEST_COUNT = re.compile(r"\b\d+/\d+ tests passed\b")
#: The message of a wrapped test case whose wrapper did not run it (harness.triage.signatures keys on it).
WRAPPER_DID_NOT_RUN = "compute-sanitizer did not run the test"


def junit_outputs(junit: Path) -> dict[str, str]:
    """Test name -> the ``<system-out>`` text ctest recorded for it in ``junit`` ({} when unreadable)."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return {}
    return {tc.get("name", ""): (tc.findtext("system-out") or "") for tc in root.iter("testcase")}


def wrapper_skipped_test(own_output: str, plain_output: str) -> str | None:
    """Why a test run under compute-sanitizer was evidently not run, or None when it was.

    ``own_output``: what the wrapped run printed; ``plain_output``: what the same test
    printed without the wrapper.  Evidence of a run is the test's own output (any line
    not starting with :data:`SANITIZER_PREFIX`) when the plain run printed any, and the
    same ``N/M tests passed`` count when the plain run printed one.  A wrapper that
    prints a clean summary and exits 0 without starting the test fails both.
    """
    own = [ln for ln in own_output.splitlines() if ln.strip() and not ln.startswith(SANITIZER_PREFIX)]
    plain = [ln for ln in plain_output.splitlines() if ln.strip()]
    if plain and not own:
        return (f"{WRAPPER_DID_NOT_RUN}: its output holds only compute-sanitizer's lines, while the plain run "
                f"printed {len(plain)} line(s) (first: {plain[0].strip()[:120]!r})")
    count = _TEST_COUNT.search(plain_output)
    if count and count.group(0) not in own_output:
        found = _TEST_COUNT.search(own_output)
        return (f"{WRAPPER_DID_NOT_RUN} as the plain run did: the plain run reports '{count.group(0)}', "
                f"under compute-sanitizer {repr(found.group(0)) if found else 'no count'}")
    return None


def _run_wrapped(build_dir: Path, selected: Sequence[str], wrapper: Sequence[str], out_dir: Path,
                 run: TestRun, timeout_s: float, env: Mapping[str, str] | None,
                 reference_junit: Path | None = None, exe: str = "") -> TestRun:
    """Run each selected test binary under ``wrapper`` and write a JUnit file of our own; a test the
    wrapper evidently did not run (checked against ``reference_junit``) fails; ``exe``: the executables' suffix."""
    reference = junit_outputs(reference_junit) if reference_junit else {}
    suite = ET.Element("testsuite", name="native-tests-wrapped")
    start_all = time.monotonic()
    with open(out_dir / TESTS_FILES["log"], "wb") as fh:
        for name in selected:
            argv = [*wrapper, str(build_dir / "bin" / (name + exe))]
            fh.write(("$ " + proc.command_line(argv, env) + "\n").encode())
            fh.flush()
            start = time.monotonic()
            done, output, _ = proc.run_capture(argv, env=env, timeout_s=timeout_s, merge_stderr=True)
            rc = done.returncode
            secs = time.monotonic() - start
            fh.write(output)
            (out_dir / f"{name}.log").write_bytes(output)
            tc = ET.SubElement(suite, "testcase", name=name, time=f"{secs:.3f}")
            skipped_by_wrapper = wrapper_skipped_test(output.decode("utf-8", "replace"), reference[name]) \
                if rc == 0 and name in reference else None
            if skipped_by_wrapper:
                ET.SubElement(tc, "failure", message=skipped_by_wrapper)
                run.cases.append(TestCase(name, CASE_FAILED, secs, skipped_by_wrapper))
            elif rc == 0:
                run.cases.append(TestCase(name, CASE_PASSED, secs))
            elif rc == 77:
                ET.SubElement(tc, "skipped", message="exit 77")
                run.cases.append(TestCase(name, CASE_SKIPPED, secs, "exit 77"))
            else:
                msg = "timeout" if rc is None else f"exit {rc}"
                ET.SubElement(tc, "failure", message=msg)
                run.cases.append(TestCase(name, CASE_FAILED, secs, msg))
    ET.ElementTree(suite).write(out_dir / TESTS_FILES["junit"], encoding="utf-8", xml_declaration=True)
    run.seconds = time.monotonic() - start_all
    counts = run.counts()
    run.status = STEP_FAILED if counts[CASE_FAILED] else (STEP_PASSED if counts[CASE_PASSED] else STEP_SKIPPED)
    run.detail = f"{counts[CASE_PASSED]} passed, {counts[CASE_FAILED]} failed, {counts[CASE_SKIPPED]} skipped"
    return run
