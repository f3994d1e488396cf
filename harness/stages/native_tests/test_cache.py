"""Reusing native test results whose inputs are byte-identical to a passed run (docs/cache.md).

The unit is one ctest label.  Its key holds, for each of the label's selected tests,
the command ctest runs and its properties (``ctest --show-only=json-v1``: working
directory, environment, labels, timeout) with the build and source paths replaced
by placeholders, and the content of every file the command names (the test
executable with its build name zeroed, harness.record.cache.normalized_image, and
any data file); then every shared library of the build, the environment added by
the harness (the emulator's), the emulator's version, the wrapper
(compute-sanitizer), the machine and the inherited variables that reach the
programs (harness.stages.outputs.generation_cache), and this module's and
``native_tests.py``'s code.

A label whose key is stored is *reused*: its test cases come from the run that
passed them (JUnit XML, each case with a ``cached`` property naming that run),
its ctest output is appended to ``ctest.log`` under a header saying so, and the
step shows ``reused``, never ``passed``.  The other labels run through ctest as
before.  Only labels whose every test passed are stored.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...common import proc
from ...common.fs import sha256_files
from ...kinds.cpu import CPU
from ...kinds.shape import GpuKind
from ...record.cache import ResultCache, abstract_paths, identity_key, image_digest, images_digest
from ...record.layout import TESTS_FILES
from ..building.build import find_tool
from ..building.binaries import build_labels, emulator_version, inherited_environment, machine_facts, shared_libraries
from ...record.native_tests import CASE_FAILED, CASE_PASSED, TestCase, TestRun
from .native_tests import run_ctest
from ...common.statuses import STEP_PASSED, STEP_SKIPPED

#: The entry kind of a ctest label's result in the store.
KIND = "tests"

#: Format of the stored value; a change makes every older entry miss.
FORMAT = 1

#: Variables of the harness's environment that only say how many tests run at once (the run's jobserver pool,
#: harness.common.jobserver): left out of a label's identity, as ``--parallel`` is.
SCHEDULING_ENV = frozenset({"MAKEFLAGS", "CMAKE_BUILD_PARALLEL_LEVEL"})


def harness_digest() -> str:
    """sha256 over this module and native_tests.py (harness.common.fs.sha256_files: names and bytes)."""
    here = Path(__file__).resolve().parent
    return sha256_files(here / n for n in ("native_tests.py", "test_cache.py"))


def show_tests(build_dir: Path, label: str) -> list[dict[str, Any]]:
    """ctest's description of the tests of ``build_dir`` labelled ``label`` (``--show-only=json-v1``)."""
    ctest = find_tool("ctest") or "ctest"
    done, out, _ = proc.run_capture([ctest, "--test-dir", str(build_dir), "--show-only=json-v1",
                                     "-L", f"^{re.escape(label)}$"], timeout_s=300)
    if done.returncode != 0:
        raise OSError(f"ctest --show-only failed in {build_dir} (exit {done.returncode})")
    return list(json.loads(out.decode("utf-8", "replace")).get("tests", []))


def label_identity(build_dir: Path, source_dir: Path | None, label: str, tests: Sequence[dict[str, Any]],
                   env: Mapping[str, str], emulator_argv: Sequence[str], wrapper: Sequence[str],
                   gpu: GpuKind) -> dict[str, Any]:
    """The identity of running ``tests`` (ctest's descriptions) of ``label`` in ``build_dir`` (see the module
    docstring).  Raises OSError when a file the tests name cannot be read."""
    labels = build_labels(build_dir)
    paths = {str(build_dir): "<build>"}
    if source_dir is not None:
        paths[str(source_dir)] = "<source>"
    described = []
    for t in sorted(tests, key=lambda t: t.get("name", "")):
        files = {}
        for arg in t.get("command") or []:
            p = Path(arg)
            if p.is_absolute() and p.is_file():
                files[abstract_paths(arg, paths)] = image_digest(p, labels)
        described.append({"name": t.get("name"), "command": abstract_paths(t.get("command"), paths),
                          "properties": abstract_paths(t.get("properties"), paths), "files": files})
    facts: dict[str, Any] = {"format": FORMAT, "harness": harness_digest(), "label": label, "tests": described,
                             "libraries": images_digest(shared_libraries(build_dir / "bin"), labels),
                             "env": {k: v for k, v in env.items() if k not in SCHEDULING_ENV}, "wrapper": list(wrapper), "machine": machine_facts(gpu, build_dir / "CMakeCache.txt"),
                             "inherited_env": inherited_environment()}
    if emulator_argv:
        facts["emulator"] = {"program": Path(emulator_argv[0]).name, "version": emulator_version(emulator_argv, env)}
    return facts


def source_dir(build_dir: Path) -> Path | None:
    """The source tree ``build_dir`` was configured from (CMakeCache.txt's CMAKE_HOME_DIRECTORY); None when the
    cache cannot be read or names none."""
    try:
        for line in (build_dir / "CMakeCache.txt").read_text().splitlines():
            if line.startswith("CMAKE_HOME_DIRECTORY:"):
                return Path(line.split("=", 1)[1])
    except OSError:
        pass
    return None


@dataclass
class Reuse:
    """What :func:`run_tests_reusing` reused: label -> the run id its result came from."""

    labels: dict[str, str] = field(default_factory=dict)

    @property
    def run_ids(self) -> list[str]:
        """The distinct runs reused from, in label order."""
        return list(dict.fromkeys(self.labels.values()))


def _case_xml(junit: Path, names: set[str]) -> dict[str, bytes]:
    """Test name -> its ``<testcase>`` element's XML from ``junit``, for ``names``."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return {}
    return {tc.get("name", ""): ET.tostring(tc) for tc in root.iter("testcase") if tc.get("name") in names}


def run_tests_reusing(cache: ResultCache | None, run_id: str, build_dir: Path, labels: Sequence[str],
                      targets: Sequence[str], out_dir: Path, *, env: Mapping[str, str] | None = None,
                      emulator_argv: Sequence[str] = (), wrapper: Sequence[str] = (),
                      reference_junit: Path | None = None, gpu: GpuKind = CPU,
                      exe_suffix: str = "", timeout_s: float = 900, jobs: int = 1,
                      repeat: str = "") -> tuple[TestRun, Reuse]:
    """Run the tests of ``labels`` like harness.stages.native_tests.native_tests.run_ctest, reusing each label stored
    in ``cache`` with the same identity (None: run them all).

    ``timeout_s`` (per test), ``jobs`` (tests at once) and ``repeat`` as run_ctest takes them.  Returns the TestRun (reused cases included, ``junit.xml`` and ``ctest.log`` written as one run) and what
    was reused.  A label that cannot be described (ctest refusing ``--show-only``) just runs.  Labels
    whose every test passed are stored for ``run_id``.
    """
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(env or {})
    reuse = Reuse()
    if cache is None:
        return run_ctest(build_dir, labels, targets, out_dir, env=env, wrapper=wrapper,
                         reference_junit=reference_junit, exe_suffix=exe_suffix,
                         timeout_s=timeout_s, jobs=jobs, repeat=repeat), reuse
    source = source_dir(build_dir)
    identities: dict[str, dict] = {}
    tests_of: dict[str, list[str]] = {}
    for label in labels:
        try:
            tests = [t for t in show_tests(build_dir, label) if t.get("name") in targets]
            identities[label] = label_identity(build_dir, source, label, tests, env, emulator_argv, wrapper, gpu)
            tests_of[label] = [str(t["name"]) for t in tests]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    hits = {}
    for label, identity in identities.items():
        if not tests_of[label]:
            continue  # nothing selected: run_ctest says so
        hit = cache.get(KIND, identity_key(identity))
        if hit is not None and set(hit.meta.get("tests", [])) == set(tests_of[label]):
            hits[label] = hit
    if any(t not in {n for names in tests_of.values() for n in names} for t in targets):
        hits = {}  # a target no label holds: ctest must run to report it, as in a fresh run
    run_labels = [lab for lab in labels if lab not in hits]
    reused_names = {n for lab in hits for n in tests_of[lab]}
    if run_labels:
        # a test of a label that runs is run, even when another label holding it was reused
        run_targets = [t for t in targets if t not in reused_names or any(t in tests_of.get(lab, [t])
                                                                          for lab in run_labels)]
        tr = run_ctest(build_dir, run_labels, run_targets, out_dir, env=env, wrapper=wrapper,
                       reference_junit=reference_junit, exe_suffix=exe_suffix,
                       timeout_s=timeout_s, jobs=jobs, repeat=repeat)
    else:
        tr = TestRun(status=STEP_PASSED, junit=out_dir / TESTS_FILES["junit"], log=out_dir / TESTS_FILES["log"])
        (out_dir / TESTS_FILES["log"]).write_bytes(b"")
    ran = {c.name for c in tr.cases}
    _store_passed(cache, run_id, tr, identities, tests_of, [lab for lab in run_labels if lab in identities])
    _merge_reused(tr, hits, tests_of, ran, out_dir, reuse)
    return tr, reuse


def _store_passed(cache: ResultCache, run_id: str, tr: TestRun, identities: Mapping[str, dict],
                  tests_of: Mapping[str, list[str]], labels: Sequence[str]) -> None:
    """Store each of ``labels`` whose every test passed in ``tr``."""
    status = {c.name: c.status for c in tr.cases}
    if tr.junit is None or not tr.junit.exists():
        return
    log = tr.log.read_bytes() if tr.log and tr.log.exists() else b""
    for label in labels:
        names = tests_of[label]
        if not names or any(status.get(n) != CASE_PASSED for n in names):
            continue
        cases = _case_xml(tr.junit, set(names))
        if set(cases) != set(names):
            continue
        files = {f"{n}.xml": xml for n, xml in cases.items()} | {TESTS_FILES["log"]: log}
        try:
            cache.put(KIND, identity_key(identities[label]), run_id, identities[label],
                      {"tests": names, "seconds": {c.name: c.seconds for c in tr.cases if c.name in names}}, files)
        except OSError:
            pass


def _merge_reused(tr: TestRun, hits: Mapping[str, Any], tests_of: Mapping[str, list[str]], ran: set[str],
                  out_dir: Path, reuse: Reuse) -> None:
    """Add the reused labels' cases to ``tr``, its JUnit file and ctest.log, each marked with its run."""
    if not hits:
        return
    junit = out_dir / TESTS_FILES["junit"]
    try:
        root = ET.parse(junit).getroot() if junit.exists() and ran else ET.Element("testsuites")
    except ET.ParseError:
        root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name="native-tests-reused")
    with open(out_dir / TESTS_FILES["log"], "ab") as log:
        for label, hit in hits.items():
            reuse.labels[label] = hit.run_id
            fresh = [n for n in tests_of[label] if n not in ran]
            log.write(f"\n=== label {label}: reused from run {hit.run_id} (tests {', '.join(tests_of[label])}: "
                      f"binaries, libraries and environment byte-identical); its ctest output follows ===\n".encode())
            log.write(hit.files.get(TESTS_FILES["log"], b""))
            for name in fresh:
                tc = ET.fromstring(hit.files[f"{name}.xml"])
                props = tc.find("properties")
                if props is None:
                    props = ET.SubElement(tc, "properties")
                ET.SubElement(props, "property", name="cached", value=hit.run_id)
                suite.append(tc)
                ran.add(name)
                tr.cases.append(TestCase(name, CASE_PASSED, float(hit.meta.get("seconds", {}).get(name, 0.0)),
                                         f"reused from run {hit.run_id}"))
    suite.set("tests", str(len(suite)))
    ET.ElementTree(root).write(junit, encoding="utf-8", xml_declaration=True)
    counts = tr.counts()
    if not counts[CASE_FAILED] and tr.status in (STEP_PASSED, STEP_SKIPPED) and counts[CASE_PASSED]:
        tr.status = STEP_PASSED
    reused = sum(1 for c in tr.cases if c.message.startswith("reused from run"))
    ids = ", ".join(reuse.run_ids)
    what = f"{reused} reused from run {ids} (labels {', '.join(reuse.labels)})"
    tr.detail = what if reused == len(tr.cases) else f"{tr.detail}; {what}" if tr.detail else what

