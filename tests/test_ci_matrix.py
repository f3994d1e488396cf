"""The CI matrix from matrix.yaml and the GitHub Actions workflow that consumes it."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.tools import ci_matrix as ci
from harness.matrix.config import MatrixError, load_matrix
from workflow_checks import NOX_SESSIONS, matrix_entries, matrix_keys_used, strings

ROOT = Path(__file__).resolve().parents[1]
MATRIX_PATH = ROOT / "matrix.yaml"
WORKFLOW_PATH = ROOT / ".github" / "workflows" / "harness.yml"
@pytest.fixture(scope="module")
def matrix():
    return load_matrix(MATRIX_PATH)


@pytest.fixture(scope="module")
def workflow():
    return yaml.safe_load(WORKFLOW_PATH.read_text(encoding="utf-8"))


def run_main(capsys, *argv):
    rc = ci.main(["--matrix", str(MATRIX_PATH), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def platform_steps(workflow):
    return {s.get("id") or s.get("name"): s for s in workflow["jobs"]["platform"]["steps"]}


# ----- the JSON ------------------------------------------------------------------------------

def test_one_entry_per_platform_with_the_windows_self_hosted_labels(matrix, capsys):
    rc, out, err = run_main(capsys, "--self-hosted", "true")
    assert rc == 0
    doc = json.loads(out)
    assert list(doc) == ["include"]
    entries = {e["platform"]: e for e in doc["include"]}
    assert list(entries) == [n for n, p in matrix.platforms.items() if p.ci is not None]
    assert set(entries) == set(matrix.platforms)  # every shipped platform runs in CI
    for name, e in entries.items():
        p = matrix.platforms[name]
        assert e["runs_on"] == list(p.ci.runs_on)
        assert e["steps"] == list(p.ci.steps) and e["gpu_steps"] == list(p.ci.gpu_steps)
        assert e["needs_gpu"] is bool(p.ci.gpu_steps)
        assert e["gpu"] == p.gpu
        assert e["shell"] == {"linux": "bash", "windows": "pwsh"}[e["runner_os"]]
        assert e["base_commit"] == matrix.base_commit
    win = entries["windows-x86_64-cuda"]
    assert win["runs_on"][0] == "self-hosted" and {"windows", "cuda"} <= set(win["runs_on"])
    assert win["shell"] == "pwsh" and win["runner_os"] == "windows"
    assert entries["linux-x86_64-cuda"]["needs_gpu"] is True
    assert entries["linux-x86_64-cuda"]["steps"] == ["build"]
    assert entries["linux-x86_64-cpu"]["needs_gpu"] is False
    # Windows CPU: a hosted ubuntu runner cross-builds it and runs it under Wine, in bash
    wine = entries["windows-x86_64-cpu"]
    assert wine["runner_os"] == "linux" and wine["shell"] == "bash"
    assert wine["debian_packages"] == ["g++-mingw-w64-x86-64-posix", "wine64"]
    assert wine["runs_on"] == ["ubuntu-24.04"] and wine["steps"] == ["build", "test", "compare-outputs"]
    # the self-hosted Windows runner's layout was measured against MAX_PATH
    assert re.search(r"path budget: windows-x86_64-cuda: longest path \d+ of 260 characters: C:\\", err)


def test_without_self_hosted_runners_gpu_jobs_are_not_queued_and_the_summary_says_why(tmp_path, monkeypatch,
                                                                                       capsys):
    out_file, summary = tmp_path / "out", tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_OUTPUT", str(out_file))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    rc, out, err = run_main(capsys, "--github-output")  # the repository variable is unset
    assert rc == 0
    entries = {e["platform"]: e for e in json.loads(out)["include"]}
    assert "windows-x86_64-cuda" not in entries
    assert not any("self-hosted" in e["runs_on"] for e in entries.values())
    # the CUDA platform still compiles on a hosted runner, without its GPU steps
    cuda = entries["linux-x86_64-cuda"]
    assert cuda["runs_on"] == ["ubuntu-24.04"] and cuda["steps"] == ["build"]
    assert cuda["gpu_steps"] == [] and cuda["needs_gpu"] is False
    text = summary.read_text()
    assert "`windows-x86_64-cuda`: needs a self-hosted runner" in text
    assert "HARNESS_SELF_HOSTED_RUNNERS" in text
    assert "`linux-x86_64-cuda`: test, compare-outputs not queued" in text
    assert "path budget" not in err  # no Windows runner left, so no base tree was needed


def test_more_jobs_than_github_runs_are_refused(tmp_path):
    doc = yaml.safe_load(MATRIX_PATH.read_text())
    plat = doc["platforms"]["linux-x86_64-cpu"]
    doc["platforms"] = {"linux-x86_64-cpu": plat, **{f"linux-{i:03d}": plat for i in range(ci.MAX_JOBS)}}
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(MatrixError, match=r"257 CI jobs; GitHub Actions runs at most 256 jobs"):
        ci.ci_matrix(load_matrix(path))
    doc["platforms"] = {"linux-x86_64-cpu": plat, **{f"linux-{i:03d}": plat for i in range(ci.MAX_JOBS - 1)}}
    path.write_text(yaml.safe_dump(doc))
    assert len(ci.ci_matrix(load_matrix(path))["include"]) == ci.MAX_JOBS


def test_a_path_past_max_path_on_a_windows_runner_is_named(matrix):
    long_file = "tools/" + "x" * 200 + ".svelte"

    def files():
        return ["README.md", long_file], ["tests/test-cuda-pin-ladder.cpp"]

    with pytest.raises(MatrixError) as err:
        ci.ci_matrix(matrix, self_hosted=True, layout_files=files, repo="llama.cpp")
    [problem] = err.value.problems
    assert "windows-x86_64-cuda" in problem and "MAX_PATH of 260" in problem
    assert problem.endswith("\\" + "x" * 200 + ".svelte")
    assert "C:\\actions-runner\\_work\\llama.cpp\\llama.cpp\\" in problem
    ok = ci.ci_plan(matrix, self_hosted=True, layout_files=lambda: (["README.md"], []), repo="llama.cpp")
    [budget] = ok.budgets
    assert budget.platform == "windows-x86_64-cuda" and budget.length <= 260


def test_long_paths_on_the_runner_allow_a_long_layout(tmp_path):
    doc = yaml.safe_load(MATRIX_PATH.read_text())
    doc["platforms"]["windows-x86_64-cuda"]["ci"]["long_paths"] = True
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(doc))
    plan = ci.ci_plan(load_matrix(path), self_hosted=True, layout_files=lambda: (["a/" + "y" * 300], []), repo="r")
    assert plan.budgets[0].over and plan.budgets[0].length > 300


def test_the_shipped_layout_fits_max_path_with_the_real_base_tree(matrix):
    base_files, fork_files = ci.base_layout_files(matrix, ROOT / "patches")
    assert len(base_files) > 1000 and "tests/test-cuda-pin-ladder.cpp" in fork_files
    plan = ci.ci_plan(matrix, self_hosted=True, layout_files=lambda: (base_files, fork_files),
                      repo="llama-fork-harness")
    [budget] = plan.budgets
    # the longest upstream file is 161 characters; the cache dir once had the 40-hex commit in it
    assert 200 < budget.length <= 260, budget.longest


def test_every_value_is_plain_json_for_fromjson(matrix):
    for entry in ci.ci_matrix(matrix)["include"]:
        for key, value in entry.items():
            assert isinstance(value, (str, bool, list)), key
            if isinstance(value, list):
                assert all(isinstance(v, str) for v in value), key
    compact = json.dumps(ci.ci_matrix(matrix), separators=(",", ":"))
    assert "\n" not in compact and json.loads(compact) == ci.ci_matrix(matrix)


def test_the_module_prints_nothing_but_the_json():
    proc = subprocess.run([sys.executable, "-m", "harness.tools.ci_matrix", "--matrix", str(MATRIX_PATH),
                           "--self-hosted", "true"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert [e["platform"] for e in json.loads(proc.stdout)["include"]] == list(load_matrix(MATRIX_PATH).platforms)


def test_models_digest_follows_the_model_definitions_only(tmp_path, matrix):
    text = MATRIX_PATH.read_text(encoding="utf-8")
    (tmp_path / "prompt.yaml").write_text(text.replace("in a small village", "in a large village"), encoding="utf-8")
    (tmp_path / "model.yaml").write_text(text.replace("n_ff_exp: 512, seed: 1234", "n_ff_exp: 512, seed: 99"),
                                         encoding="utf-8")
    assert ci.models_digest(load_matrix(tmp_path / "prompt.yaml")) == ci.models_digest(matrix)
    assert ci.models_digest(load_matrix(tmp_path / "model.yaml")) != ci.models_digest(matrix)
    assert re.fullmatch(r"[0-9a-f]{64}", ci.models_digest(matrix))


# ----- selection and errors ------------------------------------------------------------------

def test_platform_filter_keeps_matrix_order(capsys):
    rc, out, _ = run_main(capsys, "--platform", "windows-x86_64-cuda", "--self-hosted", "true")
    assert rc == 0 and [e["platform"] for e in json.loads(out)["include"]] == ["windows-x86_64-cuda"]
    rc, out, err = run_main(capsys, "--platform", "windows-x86_64-cuda")
    assert rc == 2 and "would be empty (windows-x86_64-cuda: needs a self-hosted runner" in err
    rc, out, _ = run_main(capsys, "--platform", "windows-x86_64-cuda,linux-x86_64-cpu", "--platform", "linux-x86_64-cpu",
                          "--self-hosted", "true")
    assert rc == 0
    assert [e["platform"] for e in json.loads(out)["include"]] == ["linux-x86_64-cpu", "windows-x86_64-cuda"]


def test_unknown_platform_is_a_clear_error(matrix, capsys):
    rc, out, err = run_main(capsys, "--platform", "linux-x86_64-cpu", "--platform", "macos-arm64")
    assert rc == 2 and out == ""
    assert "unknown platform 'macos-arm64'" in err and "windows-x86_64-cuda" in err and str(MATRIX_PATH) in err
    with pytest.raises(MatrixError, match="macos-arm64"):
        ci.ci_matrix(matrix, ["macos-arm64"])


def test_platform_without_ci_section(tmp_path, capsys):
    text = MATRIX_PATH.read_text(encoding="utf-8")
    cpu_ci = "    ci: {runs_on: [ubuntu-24.04], steps: [build, test, compare-outputs]}\n"
    assert cpu_ci in text
    path = tmp_path / "matrix.yaml"
    path.write_text(text.replace(cpu_ci, ""), encoding="utf-8")
    m = load_matrix(path)
    listed = ci.ci_matrix(m, self_hosted=True, layout_files=lambda: (["README.md"], []))["include"]
    assert [e["platform"] for e in listed] == ["linux-x86_64-cuda", "windows-x86_64-cuda"]
    with pytest.raises(MatrixError, match="'linux-x86_64-cpu' has no ci section"):
        ci.ci_matrix(m, ["linux-x86_64-cpu"])
    # no platform left at all: GitHub rejects an empty include, so this is an error too
    none_left = re.sub(r"(?m)^    ci: .*\n", "", text)
    path.write_text(none_left, encoding="utf-8")
    rc = ci.main(["--matrix", str(path)])
    assert rc == 2 and "no platform has a ci section" in capsys.readouterr().err


def test_bad_matrix_file_is_reported(tmp_path, capsys):
    rc = ci.main(["--matrix", str(tmp_path / "missing.yaml")])
    assert rc == 2 and "missing.yaml" in capsys.readouterr().err


# ----- $GITHUB_OUTPUT ------------------------------------------------------------------------

def test_github_output_gets_one_matrix_line(tmp_path, monkeypatch, capsys):
    out_file = tmp_path / "github_output"
    out_file.write_text("earlier=1\n", encoding="utf-8")
    monkeypatch.setenv("GITHUB_OUTPUT", str(out_file))
    monkeypatch.chdir(ROOT)
    assert ci.main(["--github-output"]) == 0
    printed = json.loads(capsys.readouterr().out)
    lines = out_file.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "earlier=1" and len(lines) == 2
    name, _, value = lines[1].partition("=")
    assert name == "matrix" and json.loads(value) == printed


def test_github_output_without_the_variable(monkeypatch, capsys):
    monkeypatch.delenv("GITHUB_OUTPUT", raising=False)
    rc, out, err = run_main(capsys, "--github-output")
    assert rc == 2 and "GITHUB_OUTPUT" in err and out == ""


# ----- the workflow --------------------------------------------------------------------------

def test_workflow_reads_only_keys_every_entry_has_and_uses_them_all(workflow, matrix):
    used = matrix_keys_used(workflow["jobs"]["platform"])
    assert {"platform", "runs_on", "steps", "gpu_steps", "needs_gpu", "shell", "environment"} <= used
    for entry in matrix_entries(matrix):
        assert used <= set(entry), f"{entry['platform']}: the workflow reads missing keys {used - set(entry)}"
        assert set(entry) <= used, f"keys no job reads: {set(entry) - used}"
    for name, job in workflow["jobs"].items():
        if name != "platform":
            assert not matrix_keys_used(job), f"job {name} reads matrix values but has no matrix"


def test_workflow_takes_its_platforms_from_the_matrix_job(workflow, matrix):
    jobs = workflow["jobs"]
    plat = jobs["platform"]
    assert plat["needs"] == "matrix"
    assert plat["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.matrix) }}"
    assert plat["strategy"]["fail-fast"] is False
    assert plat["runs-on"] == "${{ matrix.runs_on }}"
    assert plat["defaults"]["run"]["shell"] == "${{ matrix.shell }}"
    output = jobs["matrix"]["outputs"]["matrix"]
    step_id = re.fullmatch(r"\$\{\{ steps\.([\w-]+)\.outputs\.matrix \}\}", output).group(1)
    [step] = [s for s in jobs["matrix"]["steps"] if s.get("id") == step_id]
    assert "nox -s ci-matrix" in step["run"] and "--github-output" in step["run"]
    text = WORKFLOW_PATH.read_text(encoding="utf-8")
    for name in matrix.platforms:
        assert name not in text, f"the workflow names platform {name}; matrix.yaml is the only list"


def test_results_are_kept_even_when_a_step_fails(workflow):
    steps = workflow["jobs"]["platform"]["steps"]
    upload = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert len(upload) == 1 and upload[0]["if"] == "always()"
    assert "results/" in upload[0]["with"]["path"].split()
    summary = [s for s in steps if "GITHUB_STEP_SUMMARY" in s.get("run", "")]
    assert len(summary) == 1 and summary[0]["if"] == "always()"
    gpu = [s for s in steps if "matrix.gpu_steps" in s.get("env", {}).get("SESSIONS", "")]
    assert len(gpu) == 1 and "matrix.needs_gpu" in gpu[0]["if"]


def test_no_run_script_interpolates_an_expression(workflow):
    for job_name, job in workflow["jobs"].items():
        for step in job["steps"]:
            assert "${{" not in step.get("run", ""), f"{job_name}: {step.get('name')}: pass values through env:"


def test_every_nox_session_the_ci_runs_exists(workflow, matrix):
    named = set()
    for _, text in strings(workflow):
        for group in NOX_SESSIONS.findall(text):
            named.update(group.split())
    for p in matrix.platforms.values():
        named.update(p.ci.steps + p.ci.gpu_steps)
    assert {"ci-matrix", "patches", "check-windows", "build"} <= named
    env = {**os.environ, "HARNESS_RUN_ID": "listing"}
    proc = subprocess.run([sys.executable, "-m", "nox", "--list", "--json", "-s", *sorted(named)],
                          cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert {s["name"] for s in json.loads(proc.stdout)} == named


# ----- the workflow's Python steps, run as GitHub would ---------------------------------------

def run_step(step, tmp_path, env, cwd):
    """Run a ``shell: python`` step's script with GitHub's files in ``tmp_path``; return (rc, stdout, files)."""
    assert step["shell"] == "python"
    script = tmp_path / "step.py"
    script.write_text(step["run"], encoding="utf-8")
    files = {k: tmp_path / k.lower() for k in ("GITHUB_ENV", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY")}
    for f in files.values():
        f.write_text("", encoding="utf-8")
    full_env = {**os.environ, "GITHUB_WORKSPACE": str(ROOT), **{k: str(v) for k, v in files.items()}, **env}
    proc = subprocess.run([sys.executable, str(script)], cwd=cwd, env=full_env, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, {k: v.read_text(encoding="utf-8") for k, v in files.items()}


def test_prepare_step_starts_a_run_and_falls_back_to_an_arch_without_gpu(workflow, tmp_path, monkeypatch):
    step = platform_steps(workflow)["prepare"]
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: a runner without a GPU
    rc, out, files = run_step(step, tmp_path, {"PLATFORM": "p", "GPU": "nvidia", "GPU_STEPS": "test, compare-outputs",
                                               "CUDA_ARCH_WITHOUT_GPU": "75-virtual"}, ROOT)
    assert rc == 0, out
    assert re.fullmatch(r"HARNESS_RUN_ID=\d{8}T\d{6}Z-[0-9a-f]{4}\n", files["GITHUB_ENV"])
    assert files["GITHUB_OUTPUT"] == "gpu_present=false\ncuda_arch=75-virtual\n"
    assert "::notice title=p::no GPU on this runner, so test, compare-outputs did not run" in out
    rc, out, files = run_step(step, tmp_path, {"PLATFORM": "p", "GPU": "none", "GPU_STEPS": "",
                                               "CUDA_ARCH_WITHOUT_GPU": "75-virtual"}, ROOT)
    assert rc == 0 and files["GITHUB_OUTPUT"] == "gpu_present=false\ncuda_arch=\n" and "::notice" not in out


@pytest.mark.parametrize("which", ["steps", "gpu_steps"])
def test_session_steps_pass_values_as_single_arguments(workflow, tmp_path, which):
    [step] = [s for s in workflow["jobs"]["platform"]["steps"]
              if s.get("env", {}).get("SESSIONS") == f"${{{{ toJSON(matrix.{which}) }}}}"]
    fake = tmp_path / "fake" / "nox"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("", encoding="utf-8")
    (fake / "__main__.py").write_text(
        "import json, os, sys\n"
        "open(os.environ['NOX_ARGV'], 'w').write(json.dumps(sys.argv[1:]))\n"
        "sys.exit(3)\n", encoding="utf-8")
    argv_file = tmp_path / "argv.json"
    env = {"PYTHONPATH": str(tmp_path / "fake"), "NOX_ARGV": str(argv_file),
           "PLATFORM": "odd platform; $(x)", "SESSIONS": json.dumps(["build", "test"]), "CUDA_ARCH": "75-virtual"}
    rc, out, _ = run_step(step, tmp_path, env, tmp_path)
    assert rc == 3, out  # nox's exit status is the step's
    assert json.loads(argv_file.read_text()) == ["-s", "build", "test", "--", "--platform", "odd platform; $(x)",
                                                 "--upstream-tests", "--cuda-arch", "75-virtual"]
    rc, out, _ = run_step(step, tmp_path, {**env, "SESSIONS": "[]", "NOX_ARGV": str(tmp_path / "unused")}, tmp_path)
    assert rc == 0 and not (tmp_path / "unused").exists()


def test_summary_step_appends_the_run_summary(workflow, tmp_path):
    [step] = [s for s in workflow["jobs"]["platform"]["steps"] if "GITHUB_STEP_SUMMARY" in s.get("run", "")]
    run_dir = tmp_path / "results" / "20260101T000000Z-abcd"
    run_dir.mkdir(parents=True)
    (run_dir / "summary.md").write_text("# Run 20260101T000000Z-abcd: ✅ passed\n", encoding="utf-8")
    env = {"PLATFORM": "linux-test", "HARNESS_RUN_ID": run_dir.name}
    rc, out, files = run_step(step, tmp_path, env, tmp_path)
    assert rc == 0, out
    assert files["GITHUB_STEP_SUMMARY"] == "## linux-test\n\n# Run 20260101T000000Z-abcd: ✅ passed\n\n"
    rc, out, files = run_step(step, tmp_path, {**env, "HARNESS_RUN_ID": "never-started"}, tmp_path)
    assert rc == 0 and "results/never-started/summary.md was not written" in files["GITHUB_STEP_SUMMARY"]


# ----- which runs may use self-hosted runners -------------------------------------------------

@pytest.mark.parametrize("event, ref, allowed, environment, why", [
    ("push", "refs/heads/main", True, "", "a push to the default branch main"),
    ("push", "refs/heads/feature", False, "", "a push to refs/heads/feature, not to the default branch main"),
    ("schedule", "refs/heads/main", True, "", "a scheduled run"),
    ("workflow_dispatch", "refs/heads/main", True, "", "a manual run of the default branch main"),
    ("workflow_dispatch", "refs/heads/feature", True, "self-hosted-runners", "a manual run of refs/heads/feature: "
                                                                           "its self-hosted jobs wait"),
    ("pull_request", "refs/pull/7/merge", True, "self-hosted-runners", "wait in the protected environment"),
    ("pull_request_target", "refs/heads/main", False, "", "a pull_request_target event, which may not use"),
])
def test_self_hosted_runners_only_for_trusted_events_or_approved_pull_requests(event, ref, allowed, environment, why):
    gate = ci.self_hosted_gate("true", event, ref, "main")
    assert (gate.allowed, gate.environment) == (allowed, environment) and why in gate.why
    assert not ci.self_hosted_gate("false", event, ref, "main").allowed
    assert not ci.self_hosted_gate("", event, ref, "main").allowed


def test_a_pull_request_queues_self_hosted_jobs_in_the_approval_environment(tmp_path, monkeypatch, capsys):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    rc, out, err = run_main(capsys, "--github-output", "--self-hosted", "true", "--event", "pull_request",
                            "--ref", "refs/pull/7/merge", "--default-branch", "main", "--platform",
                            "linux-x86_64-cpu,linux-x86_64-cuda")
    assert rc == 0, err
    entries = {e["platform"]: e for e in json.loads(out)["include"]}
    assert entries["linux-x86_64-cuda"]["environment"] == "self-hosted-runners"
    assert entries["linux-x86_64-cuda"]["runs_on"][0] == "self-hosted"
    assert entries["linux-x86_64-cpu"]["environment"] == ""  # hosted jobs do not wait
    assert "## Self-hosted runners\n\nUsed: a pull request: its self-hosted jobs wait in the protected " \
           "environment self-hosted-runners until a reviewer approves them.\n" in summary.read_text()


def test_a_push_to_another_branch_leaves_the_self_hosted_jobs_out_saying_why(tmp_path, monkeypatch, capsys):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    rc, out, err = run_main(capsys, "--github-output", "--self-hosted", "true", "--event", "push",
                            "--ref", "refs/heads/feature", "--default-branch", "main")
    assert rc == 0, err
    entries = {e["platform"]: e for e in json.loads(out)["include"]}
    assert "windows-x86_64-cuda" not in entries and entries["linux-x86_64-cuda"]["runs_on"] == ["ubuntu-24.04"]
    text = summary.read_text()
    assert "Not used: a push to refs/heads/feature, not to the default branch main." in text
    assert ("`windows-x86_64-cuda`: needs a self-hosted runner (self-hosted, windows, x64, cuda); a push to "
            "refs/heads/feature, not to the default branch main") in text
