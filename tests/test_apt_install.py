""".ci/apt-install: installs only what dpkg does not report installed, through sudo where not root.

dpkg-query, apt-get, sudo and id are stand-ins first on PATH that answer from the environment
and record their calls, so no package is installed and no index is fetched.
"""

import os
import stat
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "apt-install"


@pytest.fixture
def tools(tmp_path):
    """(environment with the stand-ins on PATH, file their calls are recorded in)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    scripts = {
        # the last argument is the package; installed where FAKE_INSTALLED names it
        "dpkg-query": 'for p in $FAKE_INSTALLED; do [ "$p" = "${!#}" ] && printf installed && exit 0; done\n'
                      'printf not-installed\n',
        "apt-get": 'echo "apt-get $*" >> "$CALLS"\n',
        "sudo": 'echo "sudo" >> "$CALLS"; exec "$@"\n',
        "id": 'echo "${FAKE_UID:-0}"\n',
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/usr/bin/env bash\n" + body, encoding="utf-8")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "CALLS": str(calls)}
    return env, calls


def run(env, *args):
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def test_installed_packages_fetch_nothing(tools):
    env, calls = tools
    proc = run({**env, "FAKE_INSTALLED": "wine64 g++-mingw-w64-x86-64-posix"}, "g++-mingw-w64-x86-64-posix wine64")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["apt-install: g++-mingw-w64-x86-64-posix is installed",
                                        "apt-install: wine64 is installed"]
    assert not calls.exists()


def test_only_the_missing_packages_are_installed_through_sudo_where_not_root(tools):
    env, calls = tools
    proc = run({**env, "FAKE_INSTALLED": "wine64", "FAKE_UID": "1001"}, "g++-mingw-w64-x86-64-posix wine64",
               "shellcheck")
    assert proc.returncode == 0, proc.stderr
    assert calls.read_text().splitlines() == [
        "sudo", "apt-get update -qq",
        "sudo", "apt-get install -y -qq --no-install-recommends g++-mingw-w64-x86-64-posix shellcheck"]


def test_a_name_that_is_no_package_name_exits_2_before_apt(tools):
    env, calls = tools
    proc = run(env, "wine64 $(reboot)")
    assert proc.returncode == 2 and "not a Debian package name: '$(reboot)'" in proc.stderr
    assert not calls.exists()
