"""Failure signatures that tell failures apart: colour codes, test-backend-ops cases, versioned
CUB/Thrust namespaces, long keys, and a compute-sanitizer that did not run the test."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from fake_upstream import make_fake_project
from harness.triage.text_rules import KEY_MAX_CHARS, classify_text, clip_key, strip_templates

REPO_ROOT = Path(__file__).resolve().parents[1]

RED, GREEN, RESET = "\x1b[1;31m", "\x1b[1;32m", "\x1b[0m"


def backend_ops_log(failing: list[str]) -> str:
    """test-backend-ops output as it reaches a log: OK/FAIL in colour, one line per case."""
    cases = {"CPY(type_src=f32,type_dst=f16,ne=[256,4,4,4],permute=[0,0,0,0])": "CPY",
             "MUL_MAT(type_a=f16,type_b=f32,m=16,n=1,k=256,bs=[1,1],nr=[1,1],per=[0,1,2,3],v=0,o=1)": "MUL_MAT",
             "SOFT_MAX(type=f32,ne=[16,16,1,1],mask=0,m_prec=f32,scale=1.000000,max_bias=0.000000)": "SOFT_MAX"}
    lines = ["Testing 2 devices", "", "Backend 1/2: CUDA0", "  Device description: NVIDIA H200"]
    for case, op in cases.items():
        if op in failing:
            lines.append(f"  {case}: [{op}] NMSE = 0.012345678 > 0.000000500 {RED}FAIL{RESET}")
        else:
            lines.append(f"  {case}: {GREEN}OK{RESET}")
    lines += ["  1/3 tests passed", f"  Backend CUDA0: {RED}FAIL{RESET}", "Backend 2/2: CPU", "  Skipping",
              "1/2 backends passed", f"{RED}FAIL{RESET}"]
    return "\n".join(lines) + "\n"


def test_test_backend_ops_failures_are_keyed_by_the_failing_op_and_its_parameters():
    cpy = classify_text(backend_ops_log(["CPY"]), "test-backend-ops")
    mul_mat = classify_text(backend_ops_log(["MUL_MAT"]), "test-backend-ops")
    both = classify_text(backend_ops_log(["CPY", "MUL_MAT"]), "test-backend-ops")
    assert cpy.key == ("test-backend-ops: FAIL CPY(type_src=f32,type_dst=f16,ne=[256,4,4,4],permute=[0,0,0,0]) "
                       "on CUDA0")
    assert mul_mat.key.startswith("test-backend-ops: FAIL MUL_MAT(type_a=f16,type_b=f32,m=16,")
    assert len({cpy.key, mul_mat.key, both.key}) == 3  # a new MUL_MAT failure is not the known CPY one
    assert "\x1b" not in cpy.key + cpy.summary + cpy.evidence and "NMSE" not in cpy.key
    assert both.summary.endswith("(+1 more failing case(s))")


def test_colour_codes_do_not_hide_a_fail_line():
    sig = classify_text(f"running case 3\n{RED}[  FAILED  ]{RESET} sampler chain keeps top-k\n", "test-sampling")
    assert sig.kind == "test_assertion" and sig.key == "test-sampling: FAIL sampler chain keeps top-k"


def sanitizer_log(ns: str, line: int, address: str) -> str:
    kernel = (f"void cub::{ns}::DeviceRadixSortOnesweepKernel<cub::{ns}::DeviceRadixSortPolicy<int, "
              f"cub::{ns}::NullType, unsigned int>::Policy900, false, int, cub::{ns}::NullType, unsigned int, "
              f"int, int, cub::{ns}::detail::identity_decomposer_t>(int *, int *, int *, const int *, int *, "
              f"const cub::{ns}::NullType *, cub::{ns}::NullType *, int, int, int, "
              f"cub::{ns}::detail::identity_decomposer_t)")
    return ("========= COMPUTE-SANITIZER\n"
            "========= Invalid __global__ read of size 4 bytes\n"
            f"=========     at {kernel}+0x{line:x} in /usr/include/cub/agent/agent_radix_sort_onesweep.cuh:{line}\n"
            f"=========     by thread (0,0,0) in block (1,0,0)\n"
            f"=========     Address {address} is out of bounds\n"
            "========= ERROR SUMMARY: 1 error\n")


def test_sanitizer_keys_do_not_depend_on_the_cccl_version_or_the_gpu_and_are_not_cut_mid_token():
    sm90 = classify_text(sanitizer_log("CUB_200200_900_NS", 412, "0x7f0000001000"), "test-cuda-pin-ladder",
                         tool="memcheck")
    sm89 = classify_text(sanitizer_log("CUB_200200_890_NS", 418, "0x7f00deadbeef"), "test-cuda-pin-ladder",
                         tool="memcheck")
    assert sm90.kind == "sanitizer_report"
    assert sm90.key == sm89.key
    full = ("test-cuda-pin-ladder: memcheck: Invalid __global__ read of size 4 bytes in "
            "void cub::CUB_NS::DeviceRadixSortOnesweepKernel<…>(int *, int *, int *, const int *, "
            "int *, const cub::CUB_NS::NullType *, cub::CUB_NS::NullType *, int, int, int, "
            "cub::CUB_NS::detail::identity_decomposer_t)")
    assert len(full) > KEY_MAX_CHARS and len(sm90.key) <= KEY_MAX_CHARS
    assert sm90.key.endswith(", int, int,…") and full.startswith(sm90.key[:-1])  # cut between two arguments


def test_clip_key_cuts_at_a_token_boundary():
    key = "memcheck: Invalid read in " + ", ".join(f"argument_number_{i}" for i in range(40))
    cut = clip_key(key, 100)
    assert len(cut) <= 100 and cut.endswith("…")
    assert cut[:-1] == key[:len(cut) - 1]
    assert cut[:-1].endswith(",") and key[len(cut) - 1] == " "  # the cut falls between two arguments
    assert strip_templates("a<b<c>, d>::e<f> x << 2, operator<(y)") == "a<…>::e<…> x << 2, operator<(y)"


FAKE_SANITIZER = """#!{python}
import subprocess, sys
args = sys.argv[1:]
program = args[args.index("--require-cuda-init") + 2:]
print("========= COMPUTE-SANITIZER", flush=True)
rc = {run}
print("========= ERROR SUMMARY: 0 errors", flush=True)
sys.exit(rc)
"""


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
@pytest.mark.parametrize("honest", [True, False])
def test_a_sanitizer_that_did_not_run_the_test_fails_with_its_own_signature(tmp_path, honest, monkeypatch, capsys):
    """The fake project's CPU platform, its kind given NVIDIA's sanitizer declaration (a CPU kind has none: its
    --sanitize steps are skipped), run in this process so that the kind is the one declared here."""
    from dataclasses import replace
    from harness import cli
    from harness.kinds import registry
    from harness.kinds.nvidia import NVIDIA
    project = make_fake_project(tmp_path)
    bin_dir = tmp_path / "sanitizer-bin"
    bin_dir.mkdir()
    tool = bin_dir / "compute-sanitizer"
    tool.write_text(FAKE_SANITIZER.format(python=sys.executable,
                                          run="subprocess.call(program)" if honest else "0"))
    tool.chmod(0o755)
    for key, value in project.env(PATH=f"{bin_dir}{os.pathsep}{project.env()['PATH']}").items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("HARNESS_RUN_ID", raising=False)
    monkeypatch.setitem(registry.GPUS, "none", replace(registry.GPUS["none"], sanitizer=NVIDIA.sanitizer,
                                                      sanitizer_args=NVIDIA.sanitizer_args))
    code = cli.main(project.argv("build", "test", extra=("--sanitize", "memcheck"))[3:])
    shown = capsys.readouterr()
    run = project.results / "latest"
    steps = {c["step"]: c for c in json.loads((run / "summary.json").read_text())["configurations"]}
    assert steps["test"]["status"] == "passed"
    if honest:
        assert code == 0, shown.out + shown.err
        assert steps["test-memcheck"]["status"] == "passed"
        return
    assert code == 1, shown.out + shown.err
    assert steps["test-memcheck"]["status"] == "failed"
    sig = next(e["signature"] for e in json.loads((run / "signatures.json").read_text())
               if e["step"] == "test-memcheck")
    assert (sig["kind"], sig["key"]) == ("sanitizer_report", "test-fake: memcheck did not run the test")
    assert "the plain run printed 1 line(s) (first: 'test-fake: 3 checks passed')" in sig["summary"] + sig["evidence"]
