"""A GPU kind that really runs, declared outside the stages: the fake HIP kind of tests/hip_kind.py takes the fake
project through build, test and compare-outputs, and its buffer types and page-locked bytes reach the
expectations, summary.json, summary.md and report.html.

The kind is its declaration (tests/hip_kind.py, as a module of harness/kinds would be), ``rocm`` added to a copy
of the schema's ``$defs.gpuKind`` and its platform in the fake project's matrix.yaml: nothing under
harness/stages names it.  The fake llama.cpp gets a HIP backend of its own (:data:`HIP_RUNTIME_PY`): its loads put
the expert tensors of a ``--cpu-moe`` load with mmap off into ``ROCm_Host`` and the other weights into ``ROCm0``,
and its engine reports the page-locked bytes of ``ROCm_Host`` only where the build was configured with the kind's
engine probe (the ``HARNESS_ENGINE_PROBE_*`` CMake variables, read by the fake project's CMakeLists.txt as the
engine's targets.cmake reads them).  A patch of the series that page-locks half of each pinned buffer keeps every
token and fails ``pinned`` through the probe alone.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import yaml

from fake_upstream import FakeProject, _git, make_fake_project
from harness.matrix import config
from harness.stages.building.build import find_tool
from harness.stages.building.patches import export_series

ROOT = Path(__file__).resolve().parents[1]
HIP_KIND = Path(__file__).resolve().parent / "hip_kind.py"
PLATFORM = "linux-x86_64-rocm"
#: Bytes of each layer's expert tensor in the fake MoE model (F32, 2 layers): 1 MiB.
EXPERT_BYTES = 2**20

#: The fake HIP runtime of the fake llama.cpp: where a load puts each tensor of the model and what the runtime
#: page-locks.  ``LOCKED_SHARE``: the share of a pinned host buffer the runtime grants page-locked, from its start.
HIP_RUNTIME_PY = '''"""The fake HIP backend: a load's buffers, as llama logs them and as the engine's probe reports
them."""
import os
import re
import sys

import gguf

LOCKED_SHARE = 1.0


def _mapped(args):
    return not ("--load-mode" in args and args[args.index("--load-mode") + 1] == "none")


def buffers(model, args):
    """[(buffer type, host, [(name, layer, type, bytes), ...])]: the experts of a --cpu-moe load in ROCm_Host
    (CPU_Mapped with mmap), every other tensor in ROCm0."""
    experts_home = ("CPU_Mapped" if _mapped(args) else "ROCm_Host") if "--cpu-moe" in args else "ROCm0"
    out = {"ROCm0": [], experts_home: []}
    for t in gguf.GGUFReader(model).tensors:
        m = re.match(r"blk\\.(\\d+)\\.", t.name)
        home = experts_home if "_exps" in t.name else "ROCm0"
        out[home].append((t.name, int(m.group(1)) if m else -1, t.tensor_type.name.lower(), int(t.n_bytes)))
    return [(bt, bt != "ROCm0", ws) for bt, ws in out.items() if ws]


def log_buffers(model, args):
    for bt, _, ws in buffers(model, args):
        sys.stderr.write("load_tensors: %12s model buffer size = %8.2f MiB\\n" % (bt, sum(w[3] for w in ws) / 2**20))
    sys.stderr.flush()


def probe_record(model, args, driver):
    """The engine's probe record (harness.record.probe): page-locked counts only with a driver."""
    mapped = _mapped(args)
    weights, bufs = [], []
    for i, (bt, host, ws) in enumerate(buffers(model, args)):
        size = sum(w[3] for w in ws)
        locked_end = int(size * LOCKED_SHARE) if bt == "ROCm_Host" else 0
        offset, buffer_locked = 0, 0
        for name, layer, typ, n in ws:
            locked = max(0, min(n, locked_end - offset)) if host else None
            backed = (n if mapped and bt == "CPU_Mapped" else 0) if host else None
            weights.append({"name": name, "layer": layer, "type": typ, "bytes": n, "buffer": i,
                            "page_locked": locked if driver else None, "file_backed": backed,
                            "file_pages": backed, "private_pages": 0 if host else None})
            buffer_locked += locked or 0
            offset += n
        backed = (size if mapped and bt == "CPU_Mapped" else 0) if host else None
        bufs.append({"name": bt, "buffer_type": bt, "bytes": size, "host": host,
                     "page_locked": buffer_locked if driver and host else None, "file_backed": backed,
                     "file_pages": backed, "private_pages": 0 if host else None})
    return {"weights": weights, "buffers": bufs, "driver": driver, "probe_ms": 1.0, "file_mappings": []}
'''

#: The fake engine on the HIP backend: tests/fake_engine.py's protocol, its load log and probe from the runtime.
HIP_ENGINE_PY = '''import json
import os
import sys

sys.path.insert(0, @TESTS@)
import fake_engine
import fake_hip_runtime

args = sys.argv[1:]
model = args[args.index("-m") + 1]
driver = os.environ.get("FAKE_PROBE_DRIVER") or None  # set by the launcher of a build with the kind's probe
fake_hip_runtime.log_buffers(model, args)
fake_engine.ready()
for line in sys.stdin:
    parts = line.rstrip("\\r\\n").split("\\t")
    if parts[0] == "probe":
        with open(bytes.fromhex(parts[1]).decode(), "w", encoding="utf-8") as f:
            json.dump(fake_hip_runtime.probe_record(model, args, driver), f)
        fake_engine.reply({"ok": True, "weights": 1, "buffers": 1, "probe_ms": 1.0})
    elif parts[0] == "reload":
        fake_engine.reply(fake_engine.reload(int(parts[1]), bytes.fromhex(parts[2]).decode(), "ROCm_Host", driver))
    elif not fake_engine.handle(parts):
        break
'''

#: The fake project's CMake reading the kind's engine probe as the engine's targets.cmake does: a build of the
#: backend the probe names gets the runtime's name, which the launcher passes to the fake engine.
PROBE_CMAKE = '''
if (HARNESS_ENGINE_PROBE_HEADER AND HARNESS_ENGINE_PROBE_BACKEND_OPTION)
    if (${HARNESS_ENGINE_PROBE_BACKEND_OPTION})
        if (NOT EXISTS "${HARNESS_ENGINE_PROBE_HEADER}")
            message(FATAL_ERROR "no engine probe header ${HARNESS_ENGINE_PROBE_HEADER}")
        endif()
        target_compile_definitions(llama-harness-engine PRIVATE
            "FAKE_PROBE_DRIVER=\\"${HARNESS_ENGINE_PROBE_DRIVER}\\"")
    endif()
endif()
'''

def hip_matrix(text: str, model: Path) -> str:
    """matrix.yaml of the fake project (``text``) with its platform made a ``gpu: rocm`` one, and ``model`` compared
    between base and fork with their experts in host memory and mmap off (the pinned case)."""
    data = yaml.safe_load(text)
    (cpu,) = data["platforms"].values()
    cpu.pop("upstream_tests")
    cpu["hardware"] = {"gpu": "rocm"}
    cpu["cmake"]["GGML_HIP"] = "ON"
    data.pop("upstream_tests")
    data["platforms"] = {PLATFORM: cpu}
    data["models"] = {"moe": {"kind": "file", "path": str(model)}}
    data["prompts"] = data["prompts"][:1]
    data["configs"] = {name: {"build": name, "args": ["--cpu-moe", "--load-mode", "none"]} for name in ("base", "fork")}
    data["groups"] = {"base-vs-fork": {"models": ["moe"], "reference": "base", "candidates": ["fork"]}}
    return yaml.safe_dump(data, sort_keys=False)


def write_moe_gguf(path: Path) -> Path:
    """A GGUF of two layers with one expert tensor of :data:`EXPERT_BYTES` each, and a token embedding."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_tensor("token_embd.weight", np.arange(16, dtype=np.float32).reshape(4, 4))
    for layer in range(2):
        w.add_tensor(f"blk.{layer}.ffn_up_exps.weight", np.full((2, 256, EXPERT_BYTES // 2048), layer, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def make_hip_project(root: Path) -> tuple[FakeProject, Path]:
    """The fake project on a fake HIP backend: upstream gets the backend (a commit on ``main``), the series is the
    fork's notes on top of it; returns the project and a second series with a planted patch that page-locks half
    of each pinned buffer."""
    project = make_fake_project(root)
    repo = project.repo
    _git(repo, "checkout", "-q", "main")
    old = _git(repo, "rev-parse", "HEAD")
    tests = repr(str(Path(__file__).resolve().parent))
    (repo / "fake_hip_runtime.py").write_text(HIP_RUNTIME_PY)
    (repo / "fake_harness-engine.py").write_text(HIP_ENGINE_PY.replace("@TESTS@", tests))
    completion = (repo / "fake_completion.py").read_text()
    completion = completion.replace('"-fa", "-ngl")', '"-fa", "-ngl", "--cpu-moe")')
    completion = completion.replace("log_buffers(args)\n", "import fake_hip_runtime\n"
                                    "fake_hip_runtime.log_buffers(args[args.index('-m') + 1], args)\n")
    (repo / "fake_completion.py").write_text(completion)
    launcher = (repo / "launcher.c").read_text()
    launcher = launcher.replace("#include <unistd.h>\n", "#include <stdlib.h>\n#include <unistd.h>\n")
    launcher = launcher.replace("    execv(", "#ifdef FAKE_PROBE_DRIVER\n"
                                "    setenv(\"FAKE_PROBE_DRIVER\", FAKE_PROBE_DRIVER, 1);\n#endif\n    execv(")
    (repo / "launcher.c").write_text(launcher)
    (repo / "CMakeLists.txt").write_text((repo / "CMakeLists.txt").read_text() + PROBE_CMAKE)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "fake upstream: a HIP backend")
    base = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-B", "fork-hip", base)
    (repo / "FORK.md").write_text("the fork's notes\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "Add the fork's notes\n\nThe fork documents itself.")
    export_series(repo, base, project.patches)
    runtime = (repo / "fake_hip_runtime.py").read_text()
    (repo / "fake_hip_runtime.py").write_text(runtime.replace("LOCKED_SHARE = 1.0", "LOCKED_SHARE = 0.5"))
    _git(repo, "commit", "-q", "-am", "Pin half of each host buffer\n\nThe second half stays pageable.")
    planted = root / "planted"
    export_series(repo, base, planted)
    _git(repo, "checkout", "-q", "main")
    model = write_moe_gguf(root / "moe.gguf")
    project.matrix.write_text(hip_matrix(project.matrix.read_text().replace(old, base), model))
    return project, planted


def _run(project: FakeProject, schema: Path, patches: Path, *stages: str) -> subprocess.CompletedProcess:
    """``tests/hip_kind.py SCHEMA STAGES ...`` on the HIP platform of ``project`` with the series ``patches``."""
    argv = [sys.executable, str(HIP_KIND), str(schema), *project.argv(*stages)[3:], "--no-bench"]
    argv[argv.index("--platform") + 1] = PLATFORM
    argv[argv.index("--patches-dir") + 1] = str(patches)
    return subprocess.run(argv, cwd=ROOT, env=project.env(HARNESS_TEST_HIPCXX=sys.executable),
                          capture_output=True, text=True)


def _schema(tmp_path: Path) -> Path:
    """matrix.schema.json with ``rocm`` in ``$defs.gpuKind``: the one line of the schema the kind adds."""
    schema = json.loads(config.SCHEMA_PATH.read_text(encoding="utf-8"))
    schema["$defs"]["gpuKind"]["enum"].append("rocm")
    path = tmp_path / "matrix.schema.json"
    path.write_text(json.dumps(schema), encoding="utf-8")
    return path


def _steps(run_dir: Path) -> dict[tuple[str, str], dict]:
    summary = json.loads((run_dir / "summary.json").read_text())
    return {(s["config"], s["step"]): s for s in summary["configurations"] if s["platform"] == PLATFORM}


def _engine_load(run_dir: Path, config_name: str) -> dict:
    record = json.loads((run_dir / PLATFORM / config_name / "expectations.json").read_text())
    return next(x for x in record["loads"] if x["load"] == "engine"), record["rules"]["moe"]


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler")
def test_the_hip_kind_runs_end_to_end_and_its_page_locked_bytes_reach_every_view(tmp_path):
    project, planted = make_hip_project(tmp_path)
    schema = _schema(tmp_path)
    clean = _run(project, schema, project.patches, "build", "test", "compare-outputs")
    assert clean.returncode == 0, clean.stdout[-4000:] + clean.stderr[-4000:]
    run_dir = (project.results / "latest").resolve()
    steps = _steps(run_dir)
    assert {k: s["status"] for k, s in steps.items() if k[1] in ("build", "test", "generate", "expectations",
                                                                "reloads")} == {
        ("base", "build"): "passed", ("fork", "build"): "passed", ("fork", "test"): "passed",
        ("base", "generate"): "passed", ("fork", "generate"): "passed",
        ("base", "expectations"): "passed", ("fork", "expectations"): "passed", ("fork", "reloads"): "passed"}
    assert "pinned" in steps[("fork", "expectations")]["detail"]

    # the rules come from the kind's declaration: its host buffer type, pinned whole on the fork
    load, rules = _engine_load(run_dir, "fork")
    assert rules["experts"] == [["0-", "ROCm_Host"]] and rules["pinned"] == "1"
    assert rules["origin"]["placement"] == "default: --cpu-moe, mmap off"
    # the page-locked bytes of the fake HIP runtime, through the probe the kind's CMake variables switched on
    assert load["facts"]["page_locked_bytes"] == 2 * EXPERT_BYTES and load["facts"]["pinned_fraction"] == 1.0
    assert load["facts"]["layers"] == {"ROCm_Host": [0, 1]}
    probe = json.loads((run_dir / PLATFORM / "fork" / "gen" / "moe" / "engine.probe.json").read_text())
    assert probe["driver"] == "hip"

    # the build is configured with the kind's CMake: its probe, and ccache launching its device language's compiler
    cache = (project.work / "fork" / f"build-{PLATFORM}" / "CMakeCache.txt").read_text()
    assert f"HARNESS_ENGINE_PROBE_HEADER:UNINITIALIZED={ROOT.as_posix()}/tests/data/hip_probe.h" in cache
    assert "CMAKE_CUDA_COMPILER_LAUNCHER" not in cache
    assert ("CMAKE_HIP_COMPILER_LAUNCHER" in cache) == bool(find_tool("ccache"))

    md = (run_dir / "summary.md").read_text()
    html = (run_dir / "report.html").read_text()
    for view in (md, html):
        assert "ROCm_Host" in view and "driver 2.00 MiB" in view
    assert "1.000; driver 2.00 MiB" in html  # the configuration's expectations table: fraction and driver's count

    # a patch that page-locks half of each pinned buffer: every token the same, pinned fails on the probe alone
    bad = _run(project, schema, planted, "build", "compare-outputs")
    assert bad.returncode == 1, bad.stdout[-4000:] + bad.stderr[-4000:]
    bad_dir = (project.results / "latest").resolve()
    summary = json.loads((bad_dir / "summary.json").read_text())
    assert [c["status"] for c in summary["comparisons"]] == ["identical"]
    fork = _steps(bad_dir)[("fork", "expectations")]
    assert fork["status"] == "failed" and {f["status"] for f in fork["failures"]} == {"pinned"}
    assert "0.500 of the expert tensors page-locked according to the driver (1 MiB of 2 MiB), expected 1; " \
           "ROCm_Host: 1 MiB of 2 MiB" in fork["detail"]
    assert _steps(bad_dir)[("base", "expectations")]["status"] == "passed"
    said = "pinned: 0.500 of the expert tensors page-locked according to the driver (1 MiB of 2 MiB)"
    html = (bad_dir / "report.html").read_text()
    assert "driver 1.00 MiB" in html and said in html
    assert said in (bad_dir / "summary.md").read_text()
    junit = (project.results / "junit" / f"checks-{PLATFORM}.xml").read_text()
    assert "ROCm_Host: 1 MiB of 2 MiB" in junit and 'failures="1"' in junit
    signatures = json.loads((bad_dir / "signatures.json").read_text())
    assert [e["signature"]["key"] for e in signatures] == ["pinned: fork/moe: pinned fraction below 1"]
