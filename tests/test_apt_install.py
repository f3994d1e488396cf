""".ci/apt-install: installs only what dpkg does not report installed, through sudo where not root.

dpkg-query, apt-get, sudo and id are stand-ins first on PATH that answer from the environment
and record their calls, so no package is installed and no index is fetched; the dry run of the
workflow's series job (tests/test_ci_dry_run.py) runs its install step with the same stand-ins.
"""

import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "apt-install"


#: Commands a package install may reach besides the stand-ins: each is a tripwire first on PATH that records
#: ``reached NAME`` and exits 97, so a step that installs another way than .ci/apt-install's is caught.
TRIPWIRES = ("apt", "aptitude", "dpkg")


def package_manager_stand_ins(bin_dir: Path, calls: Path) -> Path:
    """Write the stand-ins for ``dpkg-query``, ``apt-get``, ``sudo`` and ``id`` and the :data:`TRIPWIRES` into
    ``bin_dir`` (made); returns ``bin_dir``, to be put first on PATH.

    ``apt-get`` appends ``apt-get ARGS`` to ``calls`` and installs nothing; ``sudo`` appends ``sudo`` and runs
    its command (the stand-in, when that is one); ``dpkg-query`` reports installed the packages the environment
    variable FAKE_INSTALLED names (none when unset), ``id -u`` answers FAKE_UID (0 when unset), other ``id``
    calls go to the real one.  The calls file's path is written into the scripts, so they record from any
    environment a caller's subprocess passes on."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    record = shlex.quote(str(calls))
    scripts = {
        # the last argument is the package; installed where FAKE_INSTALLED names it
        "dpkg-query": 'for p in ${FAKE_INSTALLED:-}; do [ "$p" = "${!#}" ] && printf installed && exit 0; done\n'
                      'printf not-installed\n',
        "apt-get": f'echo "apt-get $*" >> {record}\n',
        "sudo": f'echo "sudo" >> {record}; exec "$@"\n',
        "id": '[ "${1:-}" = -u ] && echo "${FAKE_UID:-0}" && exit 0\nexec /usr/bin/id "$@"\n',
        **{name: f'echo "reached {name} $*" >> {record}; exit 97\n' for name in TRIPWIRES},
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/usr/bin/env bash\n" + body, encoding="utf-8")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def recorded(calls: Path) -> list[str]:
    """The lines the stand-ins recorded in ``calls`` (none when nothing was called)."""
    return calls.read_text(encoding="utf-8").splitlines() if calls.exists() else []


@pytest.fixture
def tools(tmp_path):
    """(environment with the stand-ins on PATH, file their calls are recorded in)."""
    calls = tmp_path / "calls.txt"
    bin_dir = package_manager_stand_ins(tmp_path / "bin", calls)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
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
