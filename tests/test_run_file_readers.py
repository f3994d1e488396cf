"""The typed readers of a run's files (harness/record/): each reads back what its writer wrote, and names the file
in a RecordError where the file is not JSON or not of its record's shape."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from harness.matrix.config import RunConfig
from harness.record import gpu
from harness.record.environment import read_environment
from harness.record.forecast import ForecastRecord
from harness.record.inputs import ConfigRecord, read_model_record, read_run_config, read_run_info
from harness.record.loads import read_load_command, read_pin_ladder, read_placement
from harness.record import native_tests
from harness.record.native_tests import SanitizerRecord, read_sanitizer, read_test_run
from harness.record.json_files import write_json
from harness.record.layout import RunLayout
from harness.record.records import RecordError
from harness.record.run import Run
from harness.record.signatures import read_signatures

ROOT = Path(__file__).resolve().parent.parent

GIB = 2**30

STDERR = ("llama_model_loader: loaded meta data with 31 key-value pairs\n"
          f"ggml_cuda_host_malloc: pin ladder: requested={4 * GIB} granted={2 * GIB} segments=2 calls=3 seconds=0.412\n"
          "ggml_cuda_host_malloc: pin ladder: partial pin: requested=6442450944 granted=2147483648 segments=4 "
          "error=cudaErrorMemoryAllocation\n"
          "load_tensors:   CPU_Mapped model buffer size =   100.00 MiB\n"
          "load_tensors:    CUDA_Host model buffer size =  4733.00 MiB\n"
          "llama_model_loader: loaded meta data with 31 key-value pairs\n"
          "load_tensors:          CPU model buffer size =  4733.50 MiB\n"
          "llama_model_loader: GGML_CUDA_MOE_PIN_LAYERS=4: experts of layers 0-3 in CUDA_Host\n")


def _bad(path: Path, text: str, reader, match: str) -> None:
    path.write_text(text)
    with pytest.raises(RecordError, match=match) as caught:
        reader(path)
    assert str(path) in str(caught.value) and str(path) not in caught.value.reason


def test_the_load_records_read_back_what_the_comparisons_write(tmp_path):
    layout = RunLayout(tmp_path)
    prefix = layout.generation("cpu", "fork", "m", "p", 1)
    assert RunLayout.beside(prefix, "placement") == layout.load_file("cpu", "fork", "m", "p.r1", "placement")
    assert layout.load_file("cpu", "fork", "m", "engine", "pin_ladder").name == "engine.pin-ladder.json"
    write_json(RunLayout.beside(prefix, "placement"), gpu.buffer_placement(STDERR))
    write_json(RunLayout.beside(prefix, "pin_ladder"), gpu.parse_ladder_lines(STDERR))
    placement = read_placement(RunLayout.beside(prefix, "placement"))
    assert placement.as_record() == gpu.buffer_placement(STDERR)
    assert placement.model_buffers_mib() == {"CPU": 4733.5}  # the last load's only
    assert placement.routing == ("GGML_CUDA_MOE_PIN_LAYERS=4: experts of layers 0-3 in CUDA_Host",)
    ladder = read_pin_ladder(RunLayout.beside(prefix, "pin_ladder"))
    assert [dict(r) for r in ladder.lines] == gpu.parse_ladder_lines(STDERR)
    assert ladder.totals() == gpu.ladder_totals(gpu.parse_ladder_lines(STDERR))
    assert ladder.totals()["granted"] == 2 * GIB and ladder.totals()["warnings"] == 1
    assert [(p, c, m, s) for p, c, m, s, _ in layout.all_load_files("placement")] == [("cpu", "fork", "m", "p.r1")]


def test_the_load_records_name_a_broken_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"x\.placement\.json"):
        read_placement(tmp_path / "x.placement.json")
    _bad(tmp_path / "x.placement.json", "{", read_placement, r"x\.placement\.json: cannot be read as JSON")
    _bad(tmp_path / "x.placement.json", "[]", read_placement, "not a placement record")
    _bad(tmp_path / "x.placement.json", json.dumps({"buffers": [{"stage": "load_tensors"}]}), read_placement,
         r"buffers\[0\] has no buffer_type and mib")
    _bad(tmp_path / "x.pin-ladder.json", "{}", read_pin_ladder, r"x\.pin-ladder\.json: not a pin-ladder record")
    _bad(tmp_path / "x.pin-ladder.json", json.dumps([{"kind": "ladder", "requested": 1}]), read_pin_ladder,
         "line 0 has no kind, requested and granted bytes")
    _bad(tmp_path / "x.cmd", json.dumps({"argv": []}), read_load_command, r"x\.cmd: not a command record")
    _bad(tmp_path / "x.cmd", "not json", read_load_command, r"x\.cmd: cannot be read as JSON")


def test_a_load_command_reads_back(tmp_path):
    path = tmp_path / "p.r1.cmd"
    path.write_text(json.dumps({"argv": ["/b/bin/llama-completion", "-m", "m.gguf"], "env": {"A": "1"},
                                "launcher_env": {}, "timeout_s": 300}))
    cmd = read_load_command(path)
    assert cmd.argv == ("/b/bin/llama-completion", "-m", "m.gguf") and cmd.env == {"A": "1"}
    assert cmd.timeout_s == 300.0 and cmd.program.name == "llama-completion"


def test_a_missing_load_record_says_why_a_run_may_have_none(tmp_path):
    for reader, name, why in ((read_load_command, "x.cmd", "no command record"),
                              (read_placement, "x.placement.json", "no placement record"),
                              (read_pin_ladder, "x.pin-ladder.json",
                               "no pin-ladder record; the load logged no pin-ladder line")):
        with pytest.raises(FileNotFoundError) as caught:
            reader(tmp_path / name)
        assert str(caught.value) == f"{tmp_path / name}: {why}"


def test_a_load_command_s_launcher_environment_and_a_missing_time_limit_read_back(tmp_path):
    path = tmp_path / "p.r1.cmd"
    path.write_text(json.dumps({"argv": ["/usr/bin/wine", "llama-completion.exe"], "env": {},
                                "launcher_env": {"WINEDEBUG": "-all", "WINEPREFIX": 7}}))
    cmd = read_load_command(path)
    assert cmd.launcher_env == {"WINEDEBUG": "-all", "WINEPREFIX": "7"} and cmd.env == {}
    assert cmd.timeout_s is None


def test_a_load_command_of_another_shape_names_its_file(tmp_path):
    _bad(tmp_path / "x.cmd", "[]", read_load_command, r"not a command record \(no argv of strings\)")
    for bad in ({"env": ["A=1"]}, {"launcher_env": "WINEDEBUG"}, {"timeout_s": "soon"}):
        path = tmp_path / "y.cmd"
        path.write_text(json.dumps({"argv": ["llama-completion"], **bad}))
        with pytest.raises(RecordError) as caught:
            read_load_command(path)
        assert str(caught.value) == f"{path}: {caught.value.reason}"
        assert re.fullmatch(r"not a command record \(.+\)", caught.value.reason)  # what was wrong with it


def test_a_placement_record_s_offloaded_layers_and_model_buffers_read_back(tmp_path):
    path = tmp_path / "x.placement.json"
    model = {"stage": "load_tensors", "what": "model", "load": 1}
    write_json(path, {"buffers": [{**model, "buffer_type": "CUDA0", "mib": 100.25}, {**model, "buffer_type": "CUDA0", "mib": 0.5},
                                  {**model, "buffer_type": "CPU", "mib": 1.234}],
                      "by_buffer_type": {"CUDA0": 100.75, "CPU": 1.234}, "offloaded_layers": [20, 33], "routing": []})
    placement = read_placement(path)
    assert placement.offloaded_layers == (20, 33) and placement.as_record()["offloaded_layers"] == [20, 33]
    assert placement.model_buffers_mib() == {"CUDA0": 100.75, "CPU": 1.23}  # summed per type, to 0.01 MiB


def test_a_placement_or_pin_ladder_of_another_shape_says_what_it_lacks(tmp_path):
    _bad(tmp_path / "x.placement.json", "[]", read_placement, r"x\.placement\.json: not a placement record \(not an object\)$")
    for buffer in ({"mib": 100.0}, {"buffer_type": "CPU", "mib": "100"}, {"buffer_type": "CPU", "mib": True}):
        _bad(tmp_path / "x.placement.json", json.dumps({"buffers": [buffer]}), read_placement,
             r"buffers\[0\] has no buffer_type and mib")
    _bad(tmp_path / "x.pin-ladder.json", json.dumps([{"requested": 1, "granted": 1}]), read_pin_ladder,
         "line 0 has no kind, requested and granted bytes")


def test_the_run_record_and_the_configuration_read_back(tmp_path):
    run = Run.open(tmp_path, "r1", argv=["harness", "build"])
    run.close()
    info = read_run_info(run.layout.run_json)
    assert info.run_id == "r1" and info.started and [c.argv for c in info.commands] == [("harness", "build")]
    config = RunConfig("cuda-pin", "fork", ("--cpu-moe", "--no-mmap"), {"GGML_CUDA_MOE_PIN_LAYERS": "4"},
                       "pin four layers", "base-cpu-moe", {"pinned": {"min": 1.0}}, 3, True)
    write_json(run.layout.config_json("cpu", "cuda-pin"), config)  # as the comparisons write it
    assert read_run_config(run.layout.config_json("cpu", "cuda-pin")) == ConfigRecord(
        "cuda-pin", "fork", ("--cpu-moe", "--no-mmap"), {"GGML_CUDA_MOE_PIN_LAYERS": "4"}, "pin four layers")
    write_json(run.layout.model_json("cpu", "m"), {"path": "/models/m.gguf", "n_layer": 4})
    model = read_model_record(run.layout.model_json("cpu", "m"))
    assert model.path == "/models/m.gguf" and model.summary["n_layer"] == 4
    with pytest.raises(FileNotFoundError, match="models/x.json"):
        read_model_record(run.layout.model_json("cpu", "x"))


def test_the_run_record_and_the_configuration_name_a_broken_file(tmp_path):
    _bad(tmp_path / "run.json", "[1]", read_run_info, r"run\.json: not a run record")
    _bad(tmp_path / "run.json", json.dumps({"commands": [1]}), read_run_info, r"run\.json: not a run record")
    _bad(tmp_path / "config.json", json.dumps({"name": "c"}), read_run_config, "no name and build")
    _bad(tmp_path / "config.json", "{", read_run_config, r"config\.json: cannot be read as JSON")
    _bad(tmp_path / "m.json", "3", read_model_record, r"m\.json: not a model record")


def test_the_environment_reads_back_what_collect_writes(tmp_path):
    env = {"os": "Linux-6.8", "machine": "x86_64", "cpu": "EPYC", "cpu_count": 16, "ram_bytes": 64 * GIB,
           "python": "3.12.3", "cmake": "cmake version 3.28", "ninja": "1.11", "ccache": None, "cc": "gcc 13",
           "cuda_toolkit": "13.0, V13.0.48", "cuda_driver": "13.0", "gpus": [{"name": "H200", "driver": "580"}],
           "visible_gpus": 1, "pin_environment": {"GGML_CUDA_NO_PINNED": ""}, "base_commit": "a" * 40,
           "base_source": "mirror", "patches": [{"name": "0001.patch", "sha256": "b" * 64}],
           "compilers_fork": {"CXX": "GNU 13.2 (/usr/bin/c++)"}}
    path = RunLayout(tmp_path).environment_json("cuda")
    write_json(path, env)
    rec = read_environment(path)
    assert (rec.os, rec.cpu, rec.cpu_count, rec.ram_bytes, rec.ccache) == ("Linux-6.8", "EPYC", 16, 64 * GIB, None)
    assert rec.gpus == ({"name": "H200", "driver": "580"},) and rec.visible_gpus == 1
    assert rec.base_commit == "a" * 40 and rec.patches == ({"name": "0001.patch", "sha256": "b" * 64},)
    assert rec.compilers == {"fork": {"CXX": "GNU 13.2 (/usr/bin/c++)"}}
    assert rec.pin_environment == {"GGML_CUDA_NO_PINNED": ""}
    write_json(path, {"os": "Linux"})
    assert read_environment(path).patches is None and read_environment(path).gpus == ()
    _bad(path, json.dumps({"gpus": ["H200"]}), read_environment, r"environment\.json: not an environment record")
    _bad(path, json.dumps({"cpu_count": "many"}), read_environment, "not an environment record")
    _bad(path, "{", read_environment, r"environment\.json: cannot be read as JSON")


def test_the_native_tests_records_read_back_what_the_test_stage_writes(tmp_path):
    layout = RunLayout(tmp_path)
    case = native_tests.TestCase  # not imported by name: pytest would take the classes for tests
    run = native_tests.TestRun("failed", [case("test-a", "passed", 0.5), case("test-b", "failed", 1.25, "exit 139")],
                  tmp_path / "junit.xml", tmp_path / "ctest.log", 2.0, "1 of 2 failed")
    write_json(layout.tests_file("cuda", "test-memcheck", "run"), run)
    assert read_test_run(layout.tests_file("cuda", "test-memcheck", "run")) == run
    assert [c.name for c in run.failed()] == ["test-b"]
    write_json(layout.tests_file("cuda", "test-memcheck", "sanitizer"), SanitizerRecord("memcheck", "0 errors"))
    assert read_sanitizer(layout.tests_file("cuda", "test-memcheck", "sanitizer")) == SanitizerRecord("memcheck",
                                                                                                      "0 errors")
    with pytest.raises(FileNotFoundError, match="tests/sanitizer.json"):
        read_sanitizer(layout.tests_file("cuda", "test", "sanitizer"))



def test_the_native_tests_records_read_their_absent_fields_as_nothing_and_name_a_missing_file_and_why(tmp_path):
    """A tests.json that gives only the status and the cases' names and statuses (or null for the rest) reads no
    JUnit or log path, 0 s and no message or detail; a sanitizer.json without tool or summary reads empty text.
    A missing file is a FileNotFoundError naming it and why a run may have none."""
    case = native_tests.TestCase
    path = tmp_path / "tests.json"
    path.write_text(json.dumps({"status": "passed", "cases": [{"name": "test-a", "status": "passed"}]}))
    nothing = native_tests.TestRun("passed", [case("test-a", "passed", 0.0, "")], None, None, 0.0, "")
    assert read_test_run(path) == nothing
    path.write_text(json.dumps({"status": "failed", "junit": None, "log": None, "seconds": None, "detail": None,
                                "cases": [{"name": "test-a", "status": "failed", "seconds": None, "message": None}]}))
    assert read_test_run(path) == replace(nothing, status="failed", cases=[case("test-a", "failed", 0.0, "")])
    sanitizer = tmp_path / "sanitizer.json"
    for text in ("{}", json.dumps({"tool": None, "summary": None})):
        sanitizer.write_text(text)
        assert read_sanitizer(sanitizer) == SanitizerRecord("", "")
    for reader, name, why in ((read_test_run, "tests.json", "the native tests did not record a run here"),
                              (read_sanitizer, "sanitizer.json", "the tests ran without compute-sanitizer")):
        with pytest.raises(FileNotFoundError) as missing:
            reader(tmp_path / "run" / name)
        assert str(missing.value) == f"{tmp_path / 'run' / name}: no {name}; {why}"


def test_a_test_run_counts_its_cases_per_status_with_the_three_kinds_always_named():
    """TestRun.counts: passed, failed and skipped are always there (0 where no case has it), and a status of
    another name (ctest's ``timeout``) is counted under its own name, never folded into one of the three."""
    case = native_tests.TestCase
    assert native_tests.TestRun("passed").counts() == {"passed": 0, "failed": 0, "skipped": 0}
    run = native_tests.TestRun("failed", [case("a", "passed"), case("b", "failed"), case("c", "passed"),
                                          case("d", "timeout"), case("e", "skipped")])
    assert run.counts() == {"passed": 2, "failed": 1, "skipped": 1, "timeout": 1}


def test_the_native_tests_records_name_a_broken_file(tmp_path):
    _bad(tmp_path / "tests.json", "{", read_test_run, r"tests\.json: cannot be read as JSON")
    _bad(tmp_path / "tests.json", json.dumps({"cases": []}), read_test_run, r"tests\.json: not a test run \(no status")
    _bad(tmp_path / "tests.json", json.dumps({"status": "failed", "cases": [{"status": "failed"}]}), read_test_run,
         "case 0 has no name and status")
    _bad(tmp_path / "sanitizer.json", json.dumps({"tool": 3}), read_sanitizer, r"sanitizer\.json: not a sanitizer")
    _bad(tmp_path / "sanitizer.json", "[]", read_sanitizer, "not a sanitizer record")


def test_the_signatures_read_back_as_classify_run_writes_them(tmp_path):
    sig = {"kind": "signal", "key": "SIGSEGV in llama-completion", "summary": "crashed", "evidence": "Segmentation"}
    other = dict(sig, key="timeout in llama-completion", kind="timeout")
    entries = [{"platform": "cuda", "config": "fork", "step": "generate", "signature": sig, "other_signatures": [other]},
               {"platform": "cuda", "config": "fork", "step": "build", "signature": sig},
               {"platform": "cuda", "config": "pin", "step": "compare", "group": "g", "model": "m", "prompt": "p",
                "reference": "base", "signature": sig}]
    path = RunLayout(tmp_path).signatures_json
    write_json(path, entries)
    read = read_signatures(path)
    assert [e.to_json() for e in read] == entries
    assert [list(e.to_json()) for e in read] == [list(e) for e in entries]  # the same keys in the same order
    assert read[2].comparison == {"group": "g", "model": "m", "prompt": "p", "reference": "base"}
    with pytest.raises(FileNotFoundError, match="signatures.json"):
        read_signatures(tmp_path / "x" / "signatures.json")
    _bad(path, "{}", read_signatures, r"signatures\.json: not a signatures record \(not a list\)")
    _bad(path, json.dumps([{"platform": "cuda", "config": "fork", "step": "build", "signature": {"kind": "x"}}]),
         read_signatures, "entry 0's signature is not a signature")
    _bad(path, json.dumps([{"platform": "cuda", "signature": sig}]), read_signatures,
         "entry 0 has no platform, config and step")


@pytest.mark.parametrize("path", sorted((ROOT / "results" / "forecast").glob("*/forecast.json")),
                         ids=lambda p: p.parent.name)
def test_a_committed_forecast_record_is_written_back_as_it_was_read(path):
    """forecast.json is written from its typed record (harness.record.forecast.ForecastRecord.to_json): each committed
    forecast reads back into the record and out again key for key, in the same order."""
    data = json.loads(path.read_text(encoding="utf-8"))
    again = ForecastRecord.from_json(data).to_json()
    assert again == data and list(again) == list(data)
