"""Upstream's suite in whole runs on the real CPU build: tests/plants/llama-vocab-falcon-digits-split-in-pairs.patch
on top of the series breaks one tokenizer test that only upstream's suite runs.  With ``--upstream-tests`` the run
fails on that test, attributed to the fork (it passes on base); every comparison stays identical and the fork's own
tests pass, so the same patch without the suite passes; ``bisect`` with no argument names the plant in the run's own
verdict text, and the series without it (the point with every patch but the plant) passes as a whole run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fake_upstream import make_fake_project
from harness.record.summary import read_run

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "plants"))
from series_with import series_with  # noqa: E402

PLANT = "llama-vocab-falcon-digits-split-in-pairs.patch"
NETWORK = {"test-download-model", "test-arg-parser", "test-thread-safety", "test-tokenizers-ggml-vocabs"}


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
def test_the_fake_suite_pairs_base_and_fork_and_a_test_broken_on_the_fork_fails_the_run_and_triage(tmp_path):
    project = make_fake_project(tmp_path)
    clean = subprocess.run(project.argv("build", "test", extra=("--upstream-tests",)), cwd=ROOT, env=project.env(),
                           capture_output=True, text=True)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    clean_run = (project.results / "latest").resolve()
    step = {(s["config"], s["step"]): s for s in json.loads((clean_run / "summary.json").read_text())["configurations"]}
    suite = step[("fork", "upstream-tests")]
    assert suite["status"] == "passed"
    assert suite["detail"] == "2 pass on both; 1 skipped by declaration (needs the network): test-fake-net"
    pairs = clean_run / "linux-x86_64-cpu" / "upstream-tests"
    assert (pairs / "base" / "junit.xml").exists() and (pairs / "fork" / "junit.xml").exists()
    assert "test-fake" in (pairs / "base" / "build-tests.log").read_text()  # the target test-fake-vocab starts

    # a name the suite does not hold is an error naming it, never a suite that passes by running nothing
    typo = subprocess.run(project.argv("test", extra=("--upstream-tests", "--upstream-test", "test-fake-vocb")),
                          cwd=ROOT, env=project.env(), capture_output=True, text=True)
    assert typo.returncode == 1, typo.stdout + typo.stderr
    step = {(s["config"], s["step"]): s for s in
            json.loads((project.results / "latest" / "summary.json").read_text())["configurations"]}
    assert step[("fork", "upstream-tests")]["status"] == "error"
    assert step[("fork", "upstream-tests")]["detail"] == ("--upstream-test test-fake-vocb: no such test in label main "
                                                         "of linux-x86_64-cpu, on base or fork")

    broken = subprocess.run(project.argv("test", extra=("--upstream-tests",)), cwd=ROOT,
                            env=project.env(FAKE_BREAK_FORK_VOCAB="1"), capture_output=True, text=True)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    run = (project.results / "latest").resolve()
    step = {(s["config"], s["step"]): s for s in json.loads((run / "summary.json").read_text())["configurations"]}
    suite = step[("fork", "upstream-tests")]
    assert suite["status"] == "failed" and step[("fork", "test")]["status"] == "passed"
    assert suite["detail"].startswith("1 regressed (pass on base, fail on the fork): test-fake-vocab")
    signatures = json.loads((run / "signatures.json").read_text())
    found = [e["signature"]["summary"] for e in signatures if e["step"] == "upstream-tests"]
    assert len(found) == 1 and found[0].startswith("test-fake-vocab"), found
    triage = subprocess.run([sys.executable, "-m", "harness", "triage", str(clean_run), str(run)], cwd=ROOT,
                            env=project.env(), capture_output=True, text=True)
    assert triage.returncode == 1, triage.stdout + triage.stderr
    assert "fork upstream-tests: passed -> failed" in triage.stdout
    assert "upstream test test-fake-vocab: passed-both -> regressed" in triage.stdout


def _harness(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_RUN_ID"}
    return subprocess.run([sys.executable, "-m", "harness", *argv], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU platform is Linux")
def test_a_broken_tokenizer_fails_the_suite_on_its_test_only_and_bisect_names_the_plant(tmp_path, plant_work_dir):
    series = series_with(tmp_path / "series", [ROOT / "tests" / "plants" / PLANT])
    common = ["--platform", "linux-x86_64-cpu", "-j", "2", "--patches-dir", str(series),
              "--work-dir", str(plant_work_dir)]
    run = _harness("build", "test", "compare-outputs", "--upstream-tests", "--group", "base-vs-fork", "--model",
                   "moe-small", "--n-predict", "8", "--no-bench", "--results-dir", str(tmp_path / "results"), *common)
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-4000:]
    summary = json.loads((tmp_path / "results" / "latest" / "summary.json").read_text())
    steps = {(s["config"], s["step"]): s for s in summary["configurations"]}
    assert [c["status"] for c in summary["comparisons"]] == ["identical"] * len(summary["comparisons"])
    assert steps[("fork", "test")]["status"] == "passed"  # the fork's own tests see nothing
    suite = steps[("fork", "upstream-tests")]
    assert suite["status"] == "failed"
    assert suite["detail"].startswith("1 regressed (pass on base, fail on the fork): test-tokenizer-0-falcon")
    assert [f["kind"] for f in suite["failures"]] == ["upstream-test"]
    pairs = json.loads((tmp_path / "results" / "latest" / "linux-x86_64-cpu" / "upstream-tests" / "pairs.json")
                       .read_text())["pairs"]
    outcome = {p["name"]: p["outcome"] for p in pairs}
    assert {n for n, o in outcome.items() if o == "declared"} == NETWORK
    assert [n for n, o in outcome.items() if o == "regressed"] == ["test-tokenizer-0-falcon"]
    assert sum(o == "passed-both" for o in outcome.values()) == len(outcome) - len(NETWORK) - 1
    signatures = json.loads((tmp_path / "results" / "latest" / "signatures.json").read_text())
    assert any(e["step"] == "upstream-tests" and "test-tokenizer-0-falcon" in e["signature"]["summary"]
               for e in signatures)

    # bisect with no argument: every failing row of the newest run, here the one test of the suite
    row = "linux-x86_64-cpu fork upstream-tests: test-tokenizer-0-falcon"
    bisect = _harness("bisect", "--results-dir", str(tmp_path / "results"))
    n = len([ln for ln in (series / "series").read_text().splitlines() if ln.strip() and not ln.startswith("#")])
    assert bisect.returncode == 0, bisect.stdout[-3000:] + bisect.stderr[-3000:]
    assert f"{row}: first bad patch {n} {PLANT}" in bisect.stdout
    rec = json.loads((tmp_path / "results" / "latest" / "bisect.json").read_text())
    [found] = rec["rows"]
    assert (found["id"], found["outcome"], found["first_bad"]["name"], found["last_good"]) == (row, "found", PLANT, n - 1)
    # the run's own verdict text at the plant; the series without it judged good, and its whole run passed
    assert found["at_first_bad"] == found["points"][-1]["text"] == f"fails: {suite['why']}"
    assert suite["why"].startswith("fork upstream-tests: test-tokenizer-0-falcon")
    without = next(p for p in found["points"] if p["k"] == n - 1)
    assert without["outcome"] == "good"
    assert read_run(Path(without["run"])).overall == "passed"


def _add_vocabularies(project) -> str:
    """A commit on the fake upstream that gives it two vocabularies under models/, each with its .inp and .out, and
    a test per vocabulary that names its file in its arguments (as upstream's test-tokenizer-0-* do) and fails where
    it cannot open it; the matrix pinned to that commit.  Returns the commit."""
    from fake_upstream import _git
    repo = project.repo
    (repo / "models").mkdir()
    for name in ("fake", "other"):
        (repo / "models" / f"ggml-vocab-{name}.gguf").write_bytes(f"vocab {name}".encode())
        (repo / "models" / f"ggml-vocab-{name}.gguf.inp").write_text("one two\n")
        (repo / "models" / f"ggml-vocab-{name}.gguf.out").write_text("1 2\n")
    with (repo / "CMakeLists.txt").open("a") as f:
        for name in ("fake", "other"):
            f.write(f"add_test(NAME test-fake-tok-{name} COMMAND $<TARGET_FILE:test-fake> "
                    f"${{CMAKE_SOURCE_DIR}}/models/ggml-vocab-{name}.gguf)\n"
                    f"set_tests_properties(test-fake-tok-{name} PROPERTIES LABELS main)\n")
    test_py = (repo / "fake_test.py").read_text()
    (repo / "fake_test.py").write_text(test_py.replace('print("test-fake: 3 checks passed")', '''for arg in sys.argv[1:]:
    if arg.endswith(".gguf") and not os.path.exists(arg):
        print(f"gguf_init_from_file: failed to open GGUF file '{arg}'")
        sys.exit(1)
print("test-fake: 3 checks passed")'''))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "fake upstream: vocabularies")
    commit = _git(repo, "rev-parse", "HEAD")
    old = _git(repo, "rev-parse", "HEAD~1")
    project.matrix.write_text(project.matrix.read_text().replace(old, commit))
    return commit


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
def test_a_vocabulary_left_out_of_the_mirror_skips_its_test_by_name_and_the_headline_counts_it(tmp_path):
    from harness.matrix.config import load_matrix
    from harness.stages.building.source import export_data, export_mirror, obtain_base
    project = make_fake_project(tmp_path)
    _add_vocabularies(project)
    base = obtain_base(load_matrix(project.matrix), tmp_path / "cache-export")
    mirror, _ = export_mirror(base, tmp_path / "mirror" / "fake.tar.gz")
    local = f"    - kind: local\n      path: {project.repo}\n"
    text = project.matrix.read_text()
    assert local in text
    project.matrix.write_text(text.replace(local, f"    - kind: archive\n      path: {mirror}\n"
                                                  f"      sha256_file: {mirror}.sha256\n"))

    def suite_of_a_run(env) -> tuple[dict, dict, str]:
        done = subprocess.run(project.argv("build", "test", extra=("--upstream-tests",)), cwd=ROOT, env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        run = (project.results / "latest").resolve()
        steps = {(s["config"], s["step"]): s for s in json.loads((run / "summary.json").read_text())["configurations"]}
        pairs = json.loads((run / "linux-x86_64-cpu" / "upstream-tests" / "pairs.json").read_text())
        results = [line for line in done.stdout.splitlines() if line.startswith("results: ")]
        return steps[("fork", "upstream-tests")], pairs, (run / "summary.md").read_text().splitlines()[0] + "\n" \
            + results[-1] + "\n" + (run / "report.html").read_text()

    # the data archive whole: every test that reads a vocabulary runs on both sides
    export_data(base, mirror)
    step, pairs, shown = suite_of_a_run(project.env())
    assert step["status"] == "passed" and step["unproven"] == "" and "Not proven" not in shown
    assert step["detail"] == "4 pass on both; 1 skipped by declaration (needs the network): test-fake-net"

    # one vocabulary left out of it, as a mirror written without it would: its test is skipped naming the file
    export_data(base, mirror, leave_out={"models/ggml-vocab-fake.gguf"})
    step, pairs, shown = suite_of_a_run(project.env())
    assert step["status"] == "passed"
    assert step["detail"] == ("3 pass on both; 1 skipped by declaration (needs the network): test-fake-net; "
                              "1 skipped for missing data (not run): test-fake-tok-fake (models/ggml-vocab-fake.gguf)")
    pair = {p["name"]: p for p in pairs["pairs"]}["test-fake-tok-fake"]
    assert (pair["base"], pair["fork"], pair["outcome"]) == ("missing", "missing", "missing-data")
    assert pairs["glance"]["missing_data"] == {"test-fake-tok-fake": "models/ggml-vocab-fake.gguf"}
    assert pairs["glance"]["failed_both"] == 0 and pairs["glance"]["passed_both"] == 3
    headline = ("upstream suite on linux-x86_64-cpu: 3 pass on both; 1 skipped for missing data (not run): "
                "test-fake-tok-fake")
    assert step["unproven"] == headline
    md, console, html = shown.split("\n", 2)
    assert md.startswith("# Run ") and f"passed ({headline})" in md, md  # summary.md's headline
    assert f"passed ({headline})" in console, console  # the console's last line
    assert f"<b>Not proven:</b> {headline}" in html
