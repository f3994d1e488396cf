"""The hash locks: requirements.txt from requirements.in, and the two subsets under .ci/ at its pins (docs/ci.md,
"Hash-locked dependencies"), checked offline against their input files; every install of the project takes a lock
with ``--require-hashes``; pip refuses a planted wrong hash, and a requirement without one, before installing."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
#: input file -> (its lock, the lock whose pins it takes, or None)
LOCKS = {"requirements.in": ("requirements.txt", None),
         ".ci/requirements-matrix.in": (".ci/requirements-matrix.txt", "requirements.txt"),
         ".ci/requirements-gpu.in": (".ci/requirements-gpu.txt", "requirements.txt")}


@dataclass
class Pin:
    """One package of a lock: its version, its hashes and what brought it in (uv's ``# via`` lines)."""

    version: str
    hashes: list[str] = field(default_factory=list)
    via: set[str] = field(default_factory=set)


def read_lock(text: str) -> dict[str, Pin]:
    """The packages of a lock that ``uv pip compile --generate-hashes`` wrote, by canonical name."""
    pins: dict[str, Pin] = {}
    current: Pin | None = None
    in_via = False
    for line in text.replace("\\\n", " ").splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            spec, *hashes = line.split("--hash=")
            req = Requirement(spec.strip())
            [(op, version)] = [(s.operator, s.version) for s in req.specifier]
            assert op == "==", line
            current = pins[canonicalize_name(req.name)] = Pin(version, [h.strip() for h in hashes])
            in_via = False
        elif current is not None and (m := re.match(r"\s+# via(.*)$", line)):
            in_via = True
            current.via |= {m.group(1).strip()} - {""}
        elif current is not None and in_via and (m := re.match(r"\s+#\s+(\S.*)$", line)):
            current.via.add(m.group(1).strip())
    return pins


def read_input(text: str) -> dict[str, Requirement]:
    """The requirements of an input file (one a line, ``#`` comments), by canonical name."""
    reqs = [Requirement(line.split("#")[0].strip()) for line in text.splitlines() if line.split("#")[0].strip()]
    return {canonicalize_name(r.name): r for r in reqs}


def lock_problems(input_name: str, input_text: str, lock_text: str, main_lock_text: str | None = None) -> list[str]:
    """Where a lock does not say what its input file asks for: a name or version of the input not pinned so, a
    package without hashes, one that only the input brought in and that the input no longer names, or (for a
    subset) a pin other than the main lock's."""
    wanted, pins = read_input(input_text), read_lock(lock_text)
    problems = []
    for name, req in wanted.items():
        if name not in pins:
            problems.append(f"{input_name}: {req} is not in the lock")
        elif not req.specifier.contains(pins[name].version, prereleases=True):
            problems.append(f"{input_name}: {req} but the lock pins {name}=={pins[name].version}")
    for name, pin in pins.items():
        if not pin.hashes:
            problems.append(f"lock: {name}=={pin.version} has no hash")
        if name not in wanted and not {v for v in pin.via if not v.startswith("-")}:  # no package brought it in
            problems.append(f"lock: {name}=={pin.version} comes only from {input_name}, which no longer names it")
    if main_lock_text is not None:
        main = read_lock(main_lock_text)
        problems += [f"lock: {name}=={pin.version} but the main lock pins "
                     f"{main[name].version if name in main else 'nothing'}"
                     for name, pin in pins.items() if name not in main or main[name].version != pin.version]
    return problems


@pytest.mark.parametrize("input_name", sorted(LOCKS))
def test_each_lock_pins_what_its_input_asks_with_hashes(input_name):
    lock, main = LOCKS[input_name]
    assert lock_problems(input_name, (ROOT / input_name).read_text(), (ROOT / lock).read_text(),
                         (ROOT / main).read_text() if main else None) == []
    assert ".ci/lock" in (ROOT / lock).read_text().splitlines()[1]  # written by the script, not by hand


def test_a_lock_stale_against_its_input_is_caught():
    text, lock = (ROOT / "requirements.in").read_text(), (ROOT / "requirements.txt").read_text()
    assert lock_problems("requirements.in", text.replace("pytest==9.2.0", "pytest==9.2.1"), lock) == [
        "requirements.in: pytest==9.2.1 but the lock pins pytest==9.2.0"]
    assert lock_problems("requirements.in", text + "humanize==4.17.1\nleftpad==1.0\n", lock) == [
        "requirements.in: humanize==4.17.1 but the lock pins humanize==4.17.0",
        "requirements.in: leftpad==1.0 is not in the lock"]
    assert lock_problems("requirements.in", text.replace("unidiff==1.0.1\n", ""), lock) == [
        "lock: unidiff==1.0.1 comes only from requirements.in, which no longer names it"]
    unhashed = re.sub(r"(pefile==2024\.8\.26) \\\n(\s+--hash=\S+ \\\n)*\s+--hash=\S+\n", r"\1\n", lock)
    assert unhashed != lock
    assert lock_problems("requirements.in", text, unhashed) == ["lock: pefile==2024.8.26 has no hash"]
    subset = (ROOT / ".ci" / "requirements-gpu.txt").read_text()
    assert lock_problems("gpu", "numpy\n", subset.replace("numpy==2.4.6", "numpy==2.4.7"), lock)[-1] == \
        "lock: numpy==2.4.7 but the main lock pins 2.4.6"


def pip_installs() -> dict[str, list[list[str]]]:
    """Every ``pip install`` command of the files that install the project, as words, by file."""
    found: dict[str, list[list[str]]] = {}
    for name in ("README.md", ".ci/run", ".ci/gpu-evidence.sh", ".github/workflows/harness.yml"):
        for line in (ROOT / name).read_text().replace("\\\n", " ").splitlines():  # continued lines joined
            for command in re.split(r"&&|\|\|", line.split(" #")[0]):
                words = shlex.split(command) if "pip" in command and "install" in command else []
                if "pip" in words and "install" in words:
                    found.setdefault(name, []).append(words)
    return found


def test_every_install_of_the_project_takes_a_lock_with_hashes_checked():
    found = pip_installs()
    assert set(found) == {"README.md", ".ci/run", ".ci/gpu-evidence.sh", ".github/workflows/harness.yml"}
    locks = {lock for lock, _ in LOCKS.values()}
    for name, commands in found.items():
        # a file written by .ci/lock_subset.py from a lock holds that lock's entries, hashes included
        subsets = {out for lock, out in re.findall(r"lock_subset\.py (\S+) \S+ > (\S+)", (ROOT / name).read_text())
                   if lock in locks}
        for words in commands:
            if words[-2:] == ["-e", "."]:  # the project itself: nothing fetched, its build backend from the lock
                assert {"--no-deps", "--no-build-isolation", "--no-index"} <= set(words), (name, words)
                continue
            assert "--require-hashes" in words and words[words.index("-r") + 1] in locks | subsets, (name, words)
            assert "-c" not in words, (name, words)  # pip takes no hashes from a constraints file


def tiny_wheel(where: Path) -> Path:
    """A valid wheel of the package ``tinylock`` 1.0 (one module) in ``where``, the same bytes at every call."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / "tinylock-1.0-py3-none-any.whl"
    files = {"tinylock.py": "VALUE = 1\n",
             "tinylock-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinylock\nVersion: 1.0\n",
             "tinylock-1.0.dist-info/WHEEL":
                 "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},,\n" for n in files) + "tinylock-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in {**files, "tinylock-1.0.dist-info/RECORD": record}.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), text)  # the same bytes each time
    return path


def install_as_ci_run(tmp_path: Path, requirement: str) -> subprocess.CompletedProcess:
    """``requirement`` installed offline from a local wheel with .ci/run's own pip install options (its
    ``-r requirements.txt`` replaced by a file holding ``requirement``), into ``tmp_path/site``."""
    [words] = [w for w in pip_installs()[".ci/run"] if "--require-hashes" in w]  # the lock's, not the project's
    req = tmp_path / "req.txt"
    req.write_text(requirement + "\n")
    at = words.index("-r")
    options = [w for w in words[words.index("install") + 1:at] + words[at + 2:] if w != "--quiet"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    return subprocess.run([sys.executable, "-m", "pip", "install", *options, "-r", str(req), "--no-index",
                           "--find-links", str(tiny_wheel(tmp_path / "wheels").parent),
                           "--target", str(tmp_path / "site")], capture_output=True, text=True, env=env, timeout=120)


def test_pip_refuses_a_planted_wrong_hash_and_a_missing_one_before_installing(tmp_path):
    right = hashlib.sha256(tiny_wheel(tmp_path / "wheels").read_bytes()).hexdigest()
    wrong = install_as_ci_run(tmp_path, "tinylock==1.0 --hash=sha256:" + "0" * 64)
    assert wrong.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE" in wrong.stderr
    assert f"Expected sha256 {'0' * 64}" in wrong.stderr and f"Got        {right}" in wrong.stderr
    assert not (tmp_path / "site" / "tinylock.py").exists()
    missing = install_as_ci_run(tmp_path, "tinylock==1.0")  # a line without a hash: refused with --require-hashes
    assert missing.returncode != 0 and "Hashes are required in --require-hashes mode" in missing.stderr, missing.stderr
    ok = install_as_ci_run(tmp_path, f"tinylock==1.0 --hash=sha256:{right}")
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "site" / "tinylock.py").is_file()
