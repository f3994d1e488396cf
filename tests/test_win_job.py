"""The Windows job object that ends the harness's processes with it (harness.common.win_job): its layouts
against the Windows SDK's headers as MinGW-w64 ships them, and the calls it makes, through a stand-in kernel32.
The job itself, made by a Windows CPython and ending a killed harness's processes, is tried under Wine
(tests/test_win_job_wine.py, slow); what Windows' own kernel does with it is not tried here."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from harness.common import win_job
from harness.common.win_job import (JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS, JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
                                    BasicLimitInformation, ExtendedLimitInformation, make_job)

MINGW = "x86_64-w64-mingw32-gcc"


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8 or not shutil.which(MINGW),
                    reason="needs a 64-bit Python and MinGW-w64's gcc (g++-mingw-w64-x86-64-posix)")
def test_the_structures_and_constants_are_the_windows_sdk_s(tmp_path):
    # the compiler checks each number of the module against winnt.h: a field missing, reordered or of the wrong
    # width moves an offset or the size, and SetInformationJobObject would read the flags from the wrong bytes
    checks = {
        "sizeof(JOBOBJECT_EXTENDED_LIMIT_INFORMATION)": ctypes.sizeof(ExtendedLimitInformation),
        "sizeof(JOBOBJECT_BASIC_LIMIT_INFORMATION)": ctypes.sizeof(BasicLimitInformation),
        "offsetof(JOBOBJECT_BASIC_LIMIT_INFORMATION, LimitFlags)": BasicLimitInformation.LimitFlags.offset,
        "offsetof(JOBOBJECT_BASIC_LIMIT_INFORMATION, SchedulingClass)": BasicLimitInformation.SchedulingClass.offset,
        "offsetof(JOBOBJECT_EXTENDED_LIMIT_INFORMATION, ProcessMemoryLimit)":
            ExtendedLimitInformation.ProcessMemoryLimit.offset,
        "JobObjectExtendedLimitInformation": JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS,
        "JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE": JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
    }
    source = tmp_path / "layout.c"
    source.write_text("#include <windows.h>\n#include <stddef.h>\n" + "".join(
        f'_Static_assert({expr} == {value}, "{expr} is not {value}");\n' for expr, value in checks.items()))
    done = subprocess.run([MINGW, "-c", str(source), "-o", str(tmp_path / "layout.o")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert ctypes.sizeof(ExtendedLimitInformation) == 144  # the size Microsoft documents for x64


class Kernel32:
    """A stand-in for kernel32's four functions: records each call, answers as told."""

    def __init__(self, fail: str = ""):
        self.fail = fail
        self.calls: list[tuple] = []

    def CreateJobObjectW(self, attributes, name):  # noqa: N802 - Windows' name
        self.calls.append(("CreateJobObjectW", attributes, name))
        return 0 if self.fail == "CreateJobObjectW" else 0x1234

    def SetInformationJobObject(self, job, info_class, info, size):  # noqa: N802
        limits = ctypes.cast(info, ctypes.POINTER(ExtendedLimitInformation)).contents
        self.calls.append(("SetInformationJobObject", job, info_class, limits.BasicLimitInformation.LimitFlags, size))
        return 0 if self.fail == "SetInformationJobObject" else 1

    def GetCurrentProcess(self):  # noqa: N802
        return -1  # Windows' pseudo-handle of the calling process

    def AssignProcessToJobObject(self, job, process):  # noqa: N802
        self.calls.append(("AssignProcessToJobObject", job, process))
        return 0 if self.fail == "AssignProcessToJobObject" else 1


def test_the_harness_joins_a_job_that_ends_its_processes_when_the_last_handle_closes():
    k = Kernel32()
    job, why = make_job(k)
    assert (job, why) == (0x1234, "")
    assert k.calls == [
        ("CreateJobObjectW", None, None),  # unnamed: no other process can open it and keep it alive
        ("SetInformationJobObject", 0x1234, 9, 0x2000, ctypes.sizeof(ExtendedLimitInformation)),
        ("AssignProcessToJobObject", 0x1234, -1),  # the harness itself: its children inherit the job
    ]


@pytest.mark.parametrize("call", ["CreateJobObjectW", "SetInformationJobObject", "AssignProcessToJobObject"])
def test_a_job_that_cannot_be_made_is_named_and_nothing_after_it_is_called(call):
    k = Kernel32(fail=call)
    job, why = make_job(k)
    assert job is None and why.startswith(f"{call} failed (error ")
    assert [c[0] for c in k.calls][-1] == call  # the process is never put into a job without the limit


def test_elsewhere_nothing_is_done():
    assert win_job.tie_children_to_this_process() == ""
    assert win_job._state == {}
