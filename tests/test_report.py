"""The HTML report and the Markdown summary of a synthetic run."""

from __future__ import annotations

import json
import re
import struct
import subprocess
from pathlib import Path

import pytest

from harness import cli
from harness.views import report
from harness.views.report import align_divergence, markdown_summary, write_report
from harness.views.pin_chart import pin_chart_svg
from harness.record.json_files import write_json
from harness.record.records import ComparisonRecord, StepRecord
from harness.record.run import Run
from harness.triage.signatures import classify_run

CPU, CUDA = "linux-x86_64-cpu", "linux-x86_64-cuda"
GIB = 2**30

REF_TEXT = (" there lived an old fisherman named Tomas. Every morning he walked down to the harbour, "
            "checked his nets and talked to the gulls.")
CAND_TEXT = (" there lived an old woman who kept bees. Every morning she walked along the cliffs "
             "and counted the boats <b>coming</b> home.")
#: Token 4 is the first divergent token: " there"," lived"," an"," old" are shared.
DIVERGENCE = {"index": 4, "near_tie": True, "near_tie_margin": 0.1,
              "reference": {"id": 31962, "piece": " fisherman", "margin": 0.02, "eog": False},
              "candidate": {"id": 5765, "piece": " woman", "margin": 1.5, "eog": False}}


def _ladder(rows: list[tuple[int, int, str]]) -> list[dict]:
    out = []
    for requested, granted, kind in rows:
        rec = {"kind": kind, "requested": requested, "granted": granted, "segments": max(1, granted // (512 << 20)),
               "seconds": 0.25, "line": f"pin ladder: requested={requested} granted={granted}"}
        if granted < requested:
            rec["error"] = "cudaErrorMemoryAllocation"
        out.append(rec)
    return out


def make_run(root: Path, run_id: str, *, broken: bool = True) -> Run:
    """A run with a failed fork build, a divergence, a CUDA crash and pin-ladder files."""
    run = Run.open(root, run_id)
    cpu = run.platform_dir(CPU)
    write_json(cpu / "environment.json", {"os": "Linux-6.1-x86_64", "cpu": "AMD EPYC 9654", "gpus": [],
                                          "base_commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
                                          "patches": [{"name": "a.patch", "sha256": "0" * 64}]})
    run.record_step(StepRecord(CPU, "base", "build", "passed", 412.3, "built in 412 s (key 1234)",
                               f"{CPU}/build-base/build.log"))
    logs = cpu / "build-fork"
    logs.mkdir(parents=True)
    lines = [f"[{i}/100] Building CXX object src/CMakeFiles/llama.dir/L{i:03d}.cpp.o" for i in range(1, 96)]
    lines += ["FAILED: src/CMakeFiles/llama.dir/llama-model.cpp.o",
              "/work/.harness/fork/llama.cpp/src/llama-model.cpp:812:9: error: 'n_pinned' was not declared in this scope",
              "  812 |         n_pinned += 1; // <script>alert(1)</script>",
              "ninja: build stopped: subcommand failed."]
    (logs / "configure.log").write_text("$ cmake -S /work/.harness/fork/llama.cpp -B /work/.harness/fork/build-x\n")
    (logs / "configure.rc").write_text("0\n")
    (logs / "build.log").write_text("$ cmake --build /work/.harness/fork/build-x\n" + "\n".join(lines) + "\n")
    (logs / "build.rc").write_text("1\n" if broken else "0\n")
    run.record_step(StepRecord(CPU, "fork", "build", "failed" if broken else "passed", 77.0,
                               "build failed: " + lines[96] if broken else "built", f"{CPU}/build-fork/build.log"))
    run.record_step(StepRecord(CPU, "fork", "test", "skipped", 0.0, "fork build failed"))
    for config in ("base", "fork"):
        write_json(cpu / config / "config.json", {"name": config, "build": config, "args": [], "env": {},
                                                  "description": f"the {config} build"})
        run.record_step(StepRecord(CPU, config, "generate", "passed", detail="all generations ran"))
    run.record_comparisons([
        ComparisonRecord(CPU, "base-vs-fork", "gemma3-270m", "story", "base", "fork", "diverged", DIVERGENCE,
                         "diverged at token 4: ' fisherman' (id 31962) vs ' woman' (id 5765)"),
        ComparisonRecord(CPU, "base-vs-fork", "gemma3-270m", "code", "base", "fork", "identical", None, "identical"),
    ])
    write_json(cpu / "fork" / "compare.json", [
        {"prompt_id": "code", "reference": "base", "candidate": "fork", "status": "identical",
         "first_divergence": None, "detail": "identical", "nondeterministic": [], "reference_text": "x",
         "candidate_text": "x", "group": "base-vs-fork", "model": "gemma3-270m"},
        {"prompt_id": "story", "reference": "base", "candidate": "fork", "status": "diverged",
         "first_divergence": DIVERGENCE, "detail": "diverged at token 4", "nondeterministic": [],
         "reference_text": REF_TEXT, "candidate_text": CAND_TEXT, "group": "base-vs-fork", "model": "gemma3-270m"},
    ])

    cuda = run.platform_dir(CUDA)
    for config, rows in (("cuda-pin-all", [(4 * GIB, 4 * GIB, "ladder"), (3 * GIB, 3 * GIB, "ladder"),
                                           (1 * GIB, 1 * GIB, "ladder")]),
                         ("cuda-sim-partial", [(4 * GIB, 2 * GIB, "partial"), (4 * GIB, 2 * GIB, "ladder"),
                                               (3 * GIB, 0, "ladder"), (1 * GIB, 1 * GIB, "ladder")])):
        gen = cuda / config / "gen" / "moe-large"
        gen.mkdir(parents=True)
        for prompt in ("long-prefill", "story"):
            (gen / f"{prompt}.r1.stdout").write_text("out\n\n")
            (gen / f"{prompt}.r1.cmd").write_text(json.dumps({"argv": ["/b/bin/llama-completion"], "env": {}}))
            write_json(gen / f"{prompt}.r1.pin-ladder.json", _ladder(rows))
            (gen / f"{prompt}.r1.stderr").write_text("load: ok\n")
    (cuda / "cuda-sim-partial" / "gen" / "moe-large" / "long-prefill.r1.stderr").write_text(
        "CUDA error: an illegal memory access was encountered\n"
        "  current device: 0, in function ggml_cuda_op_mul_mat at /w/ggml/src/ggml-cuda/ggml-cuda.cu:1755\n"
        "  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, nbytes)\n"
        "/w/ggml/src/ggml-cuda/ggml-cuda.cu:88: CUDA error\nAborted (core dumped)\n")
    run.record_step(StepRecord(CUDA, "cuda-pin-all", "generate", "passed", detail="all generations ran"))
    run.record_step(StepRecord(CUDA, "cuda-sim-partial", "generate", "failed",
                               detail="moe-large/long-prefill: crashed SIGABRT CUDA error"))
    run.record_comparisons([ComparisonRecord(CUDA, "cuda-pin-limits", "moe-large", "long-prefill", "cuda-pin-all",
                                             "cuda-sim-partial", "crashed", None,
                                             "candidate crashed: SIGABRT: CUDA error")])
    return run


# --------------------------------------------------------------------------- alignment


def test_align_divergence_marks_the_first_divergent_token():
    al = align_divergence(REF_TEXT, CAND_TEXT, DIVERGENCE)
    assert al.exact and al.index == 4
    assert al.prefix == " there lived an old"
    assert (al.reference_token, al.candidate_token) == (" fisherman", " woman")
    assert al.reference_rest.startswith(" named Tomas") and al.candidate_rest.startswith(" who kept bees")


def test_align_divergence_backs_up_to_the_token_start_and_handles_an_ended_side():
    # both pieces start with " t": the characters differ only after the token began
    al = align_divergence("a b these", "a b those", {"index": 2, "reference": {"id": 1, "piece": " these"},
                                                      "candidate": {"id": 2, "piece": " those"}})
    assert (al.prefix, al.reference_token, al.candidate_token) == ("a b", " these", " those")
    al = align_divergence("one two", "one", {"index": 1, "reference": {"id": 7, "piece": " two"}, "candidate": None})
    assert (al.prefix, al.reference_token, al.candidate_token, al.exact) == ("one", " two", None, True)
    al = align_divergence("abcX", "abcY", {"index": 3, "reference": {"id": 1, "piece": "\ufffd"},
                                           "candidate": {"id": 2, "piece": "Q"}})
    assert (al.prefix, al.reference_token, al.candidate_token, al.exact) == ("abc", "X", "Y", False)


def test_pin_chart_draws_one_pair_of_bars_per_allocation():
    svg = pin_chart_svg(_ladder([(4 * GIB, 2 * GIB, "partial"), (4 * GIB, 2 * GIB, "ladder"),
                                 (2 * GIB, 2 * GIB, "ladder")]), "t")
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count('class="req"') == 2 + 1  # two allocations (the WARN line is left out) + the legend
    assert svg.count('class="short"') == 1 + 1 and svg.count('class="grant"') == 1 + 1
    assert "2.00 GiB of 4.00 GiB" in svg


# --------------------------------------------------------------------------- report


def test_report_is_one_self_contained_file(tmp_path):
    run = make_run(tmp_path / "results", "20260102T000000Z-bbbb")
    classify_run(run.dir)
    out = write_report(run.dir)
    assert out == run.dir / "report.html"
    html = out.read_text(encoding="utf-8")
    # nothing fetched from anywhere: no external src/href, stylesheet, import or url()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, re.I)
    assert "<link" not in html and "@import" not in html and "url(" not in html
    assert "<style>" in html and "<script>" in html
    # the summary table, with the failing step and its signature
    assert '<table class="steps">' in html and '<table class="comparisons">' in html
    assert "compile_error" in html and "cuda_error" in html
    # the divergence view: shared prefix, then the marked tokens, escaped text on both sides
    assert ('<span class="common"> there lived an old</span><mark class="ref" title="first divergent token"> '
            'fisherman</mark>') in html
    assert '<mark class="cand" title="first divergent token"> woman</mark>' in html
    assert "&lt;b&gt;coming&lt;/b&gt;" in html and "<b>coming</b>" not in html
    # the failing log: its last 40 lines, escaped
    assert "L095.cpp.o" in html and "L060.cpp.o" in html and "L059.cpp.o" not in html  # 1 + 95 + 4 lines
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert" not in html
    # the pin ladder chart: one SVG per platform/config/model
    assert html.count("<svg") == 2
    assert "cuda-sim-partial · moe-large" in html


def test_markdown_summary_names_failures_signatures_and_divergences(tmp_path):
    run = make_run(tmp_path / "results", "r2")
    md = markdown_summary(run.dir)
    assert md.startswith("## ❌ Run r2: failed")
    assert ("**Steps:** 2 fail, 1 not run, 4 pass · **comparisons:** 2 fail, 1 passes (1 crashed, 1 diverged, "
            "1 identical)") in md
    assert f"| {CPU} | fork | build | failed | `compile_error` compile error in src/llama-model.cpp:812" in md
    assert "`cuda_error` CUDA error: an illegal memory access was encountered at cudaFuncSetAttribute" in md
    assert "first divergent token #4 (near tie): ' fisherman' (id 31962, margin 0.02) vs ' woman' (id 5765, margin 1.5)" in md


def test_markdown_against_a_baseline_lists_the_regressions(tmp_path):
    root = tmp_path / "results"
    good = make_run(root, "20260101T000000Z-aaaa", broken=False)
    bad = make_run(root, "20260102T000000Z-bbbb")
    md = markdown_summary(bad.dir, good.dir)
    assert "### Against 20260101T000000Z-aaaa: 1 regression(s), 0 suspect speed change(s), 0 fix(es)" in md
    assert f"- **regression** {CPU} fork build: passed → failed — `compile_error`" in md


def test_report_command(tmp_path, capsys):
    root = tmp_path / "results"
    make_run(root, "20260101T000000Z-aaaa", broken=False)
    run = make_run(root, "20260102T000000Z-bbbb")
    assert report.main(["--results-dir", str(root)]) == 0
    assert capsys.readouterr().out.strip() == str(run.dir.resolve() / "report.html")
    assert report.main([run.id, "--results-dir", str(root), "--markdown", "--against", "previous"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("## ❌ Run 20260102T000000Z-bbbb") and "1 regression(s)" in captured.out
    assert "report.html" in captured.err
    assert "Changes since 20260101T000000Z-aaaa" in (run.dir / "report.html").read_text()
    assert cli.main(["report", "nope", "--results-dir", str(root)]) == 2
    assert "unknown run 'nope'" in capsys.readouterr().err


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.debian
@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is not installed")
def test_report_renders_in_headless_chromium(tmp_path):
    run = make_run(tmp_path / "results", "20260102T000000Z-bbbb")
    html = write_report(run.dir)
    png = tmp_path / "report.png"
    profile = tmp_path / "profile"
    proc = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           "--no-first-run", f"--user-data-dir={profile}", f"--screenshot={png}",
                           "--window-size=1280,2000", html.resolve().as_uri()],
                          capture_output=True, text=True, timeout=180)
    assert png.is_file(), proc.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1280, 2000)
    assert len(data) > 50_000  # a blank page compresses to a few KiB; this one has tables, text and charts
