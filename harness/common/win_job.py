"""On Windows, what the harness starts dies with it: a job object that closes with the harness.

Windows has no parent-death signal (Linux's ``PR_SET_PDEATHSIG``, harness.common.proc).  Its means is a *job
object* with the limit ``JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE``: the kernel ends every process in the job when the
last handle to the job is closed, and a process's handles are closed when it ends, however it ends (Task
Manager's End task and ``TerminateProcess`` included).  :func:`tie_children_to_this_process` puts the harness
itself into such a job, once, before its first child; every process started after that inherits the job (none is
started with ``CREATE_BREAKAWAY_FROM_JOB``), so ctest, the tests, ninja's compilers and the engines end with the
harness.  The job's one handle is kept for the life of the process and never closed: closing it would end the
harness too.

Windows 8 and later nest jobs, so a harness that a CI runner already started inside a job can still be put into
one of its own.  Where the job cannot be made (an older system, a runner that forbids it), the harness runs
without it and :func:`tie_children_to_this_process` says why; nothing else changes.

The layouts and constants are those of the Windows SDK (``winnt.h``): ``JOBOBJECT_EXTENDED_LIMIT_INFORMATION`` is
144 bytes on x64, ``JobObjectExtendedLimitInformation`` is 9, ``JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`` 0x2000.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

#: ``JOBOBJECTINFOCLASS`` value of the extended limits (winnt.h).
JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS = 9
#: The limit that ends every process of the job when its last handle closes (winnt.h).
JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x2000


class IoCounters(ctypes.Structure):
    """``IO_COUNTERS`` (winnt.h): six 64-bit counters."""
    _fields_ = [(name, ctypes.c_ulonglong) for name in (
        "ReadOperationCount", "WriteOperationCount", "OtherOperationCount",
        "ReadTransferCount", "WriteTransferCount", "OtherTransferCount")]


class BasicLimitInformation(ctypes.Structure):
    """``JOBOBJECT_BASIC_LIMIT_INFORMATION`` (winnt.h); ``SIZE_T`` and ``ULONG_PTR`` are pointer-sized."""
    _fields_ = [("PerProcessUserTimeLimit", ctypes.c_int64),
                ("PerJobUserTimeLimit", ctypes.c_int64),
                ("LimitFlags", ctypes.c_uint32),
                ("MinimumWorkingSetSize", ctypes.c_size_t),
                ("MaximumWorkingSetSize", ctypes.c_size_t),
                ("ActiveProcessLimit", ctypes.c_uint32),
                ("Affinity", ctypes.c_size_t),
                ("PriorityClass", ctypes.c_uint32),
                ("SchedulingClass", ctypes.c_uint32)]


class ExtendedLimitInformation(ctypes.Structure):
    """``JOBOBJECT_EXTENDED_LIMIT_INFORMATION`` (winnt.h)."""
    _fields_ = [("BasicLimitInformation", BasicLimitInformation),
                ("IoInfo", IoCounters),
                ("ProcessMemoryLimit", ctypes.c_size_t),
                ("JobMemoryLimit", ctypes.c_size_t),
                ("PeakProcessMemoryUsed", ctypes.c_size_t),
                ("PeakJobMemoryUsed", ctypes.c_size_t)]


_lock = threading.Lock()
#: The job's handle once made (kept open for the life of the process), or the reason it was not.
_state: dict[str, Any] = {}


def _kernel32() -> Any:  # Any: ctypes' WinDLL exists on Windows only, and its functions are looked up by name
    """kernel32 through ctypes with the last error kept, its handle-returning functions typed as pointers."""
    k = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
    k.CreateJobObjectW.restype = ctypes.c_void_p
    k.CreateJobObjectW.argtypes = [ctypes.c_void_p, ctypes.c_wchar_p]
    k.GetCurrentProcess.restype = ctypes.c_void_p
    k.SetInformationJobObject.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32]
    k.AssignProcessToJobObject.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return k


def make_job(kernel32: Any) -> tuple[int | None, str]:  # Any: kernel32 or a stand-in (_kernel32)
    """Put the calling process into a new job that ends all its processes when its last handle closes.

    ``kernel32``: the library (:func:`_kernel32`), or a stand-in with the same four functions.  Returns (the job's
    handle, "") when the process is in the job, (None, why) when a call failed, ``why`` naming the call and
    Windows' error code.  The handle must stay open for as long as the process runs."""
    def last_error() -> int:
        get = getattr(ctypes, "get_last_error", None)
        return get() if get else 0

    job = kernel32.CreateJobObjectW(None, None)
    if not job:
        return None, f"CreateJobObjectW failed (error {last_error()})"
    info = ExtendedLimitInformation()
    info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
    if not kernel32.SetInformationJobObject(job, JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS, ctypes.byref(info),
                                            ctypes.sizeof(info)):
        return None, f"SetInformationJobObject failed (error {last_error()})"
    if not kernel32.AssignProcessToJobObject(job, kernel32.GetCurrentProcess()):
        return None, f"AssignProcessToJobObject failed (error {last_error()})"
    return job, ""


def tie_children_to_this_process() -> str:
    """On Windows, once per process: put the harness into a kill-on-close job (:func:`make_job`) so that every
    process it starts afterwards ends with it.  Returns "" when the job is in force (or not needed: not Windows),
    else why it could not be made; the harness runs on without it.  Thread-safe; later calls return the first
    call's answer."""
    if os.name != "nt":
        return ""
    with _lock:
        if "why" not in _state:  # pragma: no cover - Windows only
            try:
                job, why = make_job(_kernel32())
            except (OSError, AttributeError) as exc:
                job, why = None, f"kernel32 could not be loaded: {exc}"
            _state.update(job=job, why=why)
        return _state["why"]
