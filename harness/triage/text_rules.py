"""A failure's signature read from log text, declared once: the signature kinds and their ranks, :class:`Signature`,
the normalisation that makes a key the same across machines and runs (paths, addresses, times, template
arguments), the signal of an exit code, and the rules that read a sanitizer report, a CUDA error, an assertion
and a test-backend-ops failure out of any text (:func:`classify_text`).  harness.triage.signatures applies
them to each step of a run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..common.words import signal_name
from ..record.gpu import SANITIZER_AT, SANITIZER_DETAIL, SANITIZER_NOT_A_REPORT, SANITIZER_REPORT
from ..record.gpu import SANITIZER_SUMMARY as _SAN_SUMMARY


#: Every signature kind, declared once here (the module docstring says what each key holds), with
#: its rank: of a step with several failures (tests, generations) the signature of the lowest rank
#: is kept, the most specific.  A CUDA error ends in an abort (SIGABRT) and an assertion too, so
#: those rank above ``signal``.
KIND_RANK = {"configure_error": 3, "compile_error": 3, "link_error": 3, "patch_apply": 3, "test_assertion": 2,
             "signal": 5, "cuda_error": 1, "sanitizer_report": 0, "timeout": 4, "output_mismatch": 6,
             "placement": 6, "pinning": 6, "warning": 7, "reload": 6, "speed_regression": 6, "other": 8}
#: The signature kind of each rule of harness.stages.checks.expectations (``weights`` and ``mapped`` are placements
#: too; a failed ``claims`` finding is a pinning where its key starts so, else a placement).
EXPECTATION_KINDS = {"placement": "placement", "weights": "placement", "mapped": "placement", "pinned": "pinning",
                     "claims": "placement", "warnings": "warning"}
#: The kinds, in declaration order.
KINDS = tuple(KIND_RANK)

#: Longest key and summary, in characters (keys are compared, not read; they stay short).
KEY_MAX_CHARS = 240
SUMMARY_MAX_CHARS = 200
#: Most evidence lines kept per signature.
EVIDENCE_MAX_LINES = 6

#: Top-level directories of the llama.cpp tree; a path is cut to start at one of them when
#: the source and build roots are unknown (e.g. ``/home/u/x/ggml/src/ggml.c`` -> ``ggml/src/ggml.c``).
SOURCE_TOP_DIRS = ("ggml", "src", "common", "tools", "tests", "examples", "include", "vendor", "pocs")


@dataclass(frozen=True)
class Signature:
    """A failure's stable identity.

    ``kind`` is one of KINDS; ``key`` is stable across runs and machines (no
    addresses, timestamps, absolute paths or innocent line numbers) and is what
    runs are matched by; ``summary`` is one line for people; ``evidence`` the log
    line(s) it was read from, as logged.
    """

    kind: str
    key: str
    summary: str
    evidence: str


# --------------------------------------------------------------------------- normalisation

_ABS_PATH = re.compile(
    r"(?<![\w.\\/])(?:[A-Za-z]:[\\/]|/)(?:[\w.+@~-]+[\\/])*[\w.+@~-]+"
    r"(?P<pos>(?::\d+){1,2}\b|\(\d+(?:,\d+)?\))?")
_REL_POS = re.compile(r"(?<=[\w.])(?::\d+){1,2}(?=:)")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b")
_TIMESTAMP = re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:?\d\d)?"
                        r"|\b\d{8}T\d{6}Z(?:-[0-9a-f]{4})?\b|\b\d\d:\d\d:\d\d(?:\.\d+)?\b")
_DURATION = re.compile(r"\b\d+(?:\.\d+)?\s*(?:ms|us|µs|ns|s|sec|secs|seconds)\b")
_LONG_NUMBER = re.compile(r"\b\d{6,}\b")
_SPACES = re.compile(r"\s+")
#: ANSI escape sequences (colours of test-backend-ops' OK/FAIL, cursor control): CSI and OSC.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
#: CUB/Thrust/libcu++ put the CCCL version and the SM architecture into their namespace names
#: (``CUB_200200_900_NS`` on sm_90, ``…_890_NS`` on sm_89); the name without them.
_VERSIONED_NS = re.compile(r"\b(?P<lib>CUB|THRUST|CCCL|LIBCUDACXX|_LIBCUDACXX)_\d+(?:_\d+)*_NS\b")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (colour codes, cursor movement)."""
    return _ANSI.sub("", text)


def strip_templates(text: str) -> str:
    """``text`` with every template argument list replaced by ``<…>`` (nesting-aware), so a
    kernel named with other types or tuning policies keeps one key; ``operator<`` and
    ``<<`` are left alone."""
    out: list[str] = []
    depth = 0
    i = 0
    while i < len(text):
        c = text[i]
        if c == "<" and text[i:i + 2] != "<<" and not text[max(0, i - 8):i].endswith("operator") and \
                (depth or (i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_:"))):
            if depth == 0:
                out.append("<…>")
            depth += 1
        elif c == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(c)
        i += 1
    return "".join(out) if depth == 0 else text


def relative_path(path: str, roots: Sequence[str] = ()) -> str:
    """``path`` made machine independent: relative to the longest matching root, else cut at a
    llama.cpp top-level directory (:data:`SOURCE_TOP_DIRS`, keeping a leading ``ggml/``),
    else only its file name.  Backslashes become slashes.  Returns the new path (str).
    """
    p = path.replace("\\", "/")
    if not re.match(r"^(?:[A-Za-z]:)?/", p):
        return re.sub(r"^(?:\.\.?/)+", "", p)
    for root in sorted((r.replace("\\", "/").rstrip("/") for r in roots if r), key=len, reverse=True):
        if p.startswith(root + "/"):
            return p[len(root) + 1:]
    parts = [x for x in p.split("/") if x]
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in SOURCE_TOP_DIRS:
            if i > 0 and parts[i - 1] == "ggml" and parts[i] != "ggml":
                i -= 1
            return "/".join(parts[i:])
    return parts[-1] if parts else p


def normalise(text: str, roots: Sequence[str] = ()) -> str:
    """``text`` with everything that changes between runs removed, for use in keys.

    Timestamps become ``<time>``; absolute paths become relative (see :func:`relative_path`)
    and lose ``:line:col`` / ``(line)`` suffixes, as do relative ``file:line:`` positions;
    hex numbers become ``0x?``; durations ``<t>``; numbers of six or more digits
    (addresses, process ids, byte counts of a run) ``<n>``; whitespace is collapsed.
    ANSI escapes are dropped and versioned CUB/Thrust namespaces lose their version
    (``CUB_200200_900_NS`` -> ``CUB_NS``).
    """
    text = _VERSIONED_NS.sub(lambda m: f"{m.group('lib')}_NS", strip_ansi(text))
    text = _TIMESTAMP.sub("<time>", text)
    text = _ABS_PATH.sub(lambda m: relative_path(m.group(0)[:len(m.group(0)) - len(m.group("pos") or "")],
                                                 roots), text)
    text = _REL_POS.sub("", text)
    text = _HEX.sub("0x?", text)
    text = _DURATION.sub("<t>", text)
    text = _LONG_NUMBER.sub("<n>", text)
    return _SPACES.sub(" ", text).strip()


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: Characters a key may be cut after: between words, list items and argument lists.
_KEY_BOUNDARY = re.compile(r"[\s,;:()\[\]<>]")


def clip_key(key: str, limit: int = KEY_MAX_CHARS) -> str:
    """``key`` cut to at most ``limit`` characters at a token boundary (never inside a name or
    number), ending in ``…`` when cut; a single token longer than the limit is cut hard."""
    if len(key) <= limit:
        return key
    head = key[:limit - 1]
    cuts = [m.start() for m in _KEY_BOUNDARY.finditer(head)]
    if cuts and cuts[-1] > limit // 2:
        head = head[:cuts[-1] + 1] if head[cuts[-1]] in ",;:([<" else head[:cuts[-1]]
    return head.rstrip() + "…"


def _sig(kind: str, key: str, summary: str, evidence: Iterable[str]) -> Signature:
    lines = [strip_ansi(line).rstrip() for line in evidence if line and line.strip()]
    return Signature(kind, clip_key(key), _clip(strip_ansi(summary), SUMMARY_MAX_CHARS),
                     "\n".join(lines[:EVIDENCE_MAX_LINES]))


# --------------------------------------------------------------------------- signals and exit codes

#: Windows NTSTATUS exit codes that mean the process was killed by the equivalent of a signal.
WINDOWS_STATUS = {0xC0000005: "SIGSEGV", 0xC000001D: "SIGILL", 0xC0000094: "SIGFPE",
                  0xC00000FD: "SIGSEGV", 0xC0000409: "SIGABRT"}

#: Messages of shells, ctest and the C runtime that name the signal that ended a process.
_SIGNAL_TEXT = [
    (re.compile(r"Segmentation fault|\bSEGFAULT\b|Exception: SegFault|\bSIGSEGV\b"), "SIGSEGV"),
    (re.compile(r"Subprocess aborted|Child aborted|^Aborted\b|\bAborted \(core dumped\)|\bSIGABRT\b", re.M),
     "SIGABRT"),
    (re.compile(r"Illegal instruction|\bILLEGAL\b|Exception: Illegal|\bSIGILL\b"), "SIGILL"),
    (re.compile(r"Bus error|\bSIGBUS\b"), "SIGBUS"),
    (re.compile(r"Floating point exception|Exception: Numerical|\bSIGFPE\b"), "SIGFPE"),
    (re.compile(r"^Killed$|\bSIGKILL\b", re.M), "SIGKILL"),
]


def signal_from_exit(code: int | None) -> str | None:
    """The signal a process exit status stands for, or None.

    Negative return codes are Python's ``-N`` for "killed by signal N"; 129..192 are a
    shell's ``128 + N``; Windows NTSTATUS crash codes are in :data:`WINDOWS_STATUS`.
    """
    if code is None:
        return None
    number = -code if code < 0 else (code - 128 if 128 < code <= 192 else None)
    if number is not None:
        return signal_name(number)
    return WINDOWS_STATUS.get(code & 0xFFFFFFFF)


def _signal_in_text(text: str) -> tuple[str, str] | None:
    for pattern, name in _SIGNAL_TEXT:
        m = pattern.search(text)
        if m:
            return name, _line_at(text, m.start())
    return None


def _line_at(text: str, pos: int) -> str:
    """The whole line of ``text`` holding character ``pos``, stripped."""
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start:].strip() if end < 0 else text[start:end].strip()


# --------------------------------------------------------------------------- text rules

_CUDA_ERROR = re.compile(r"\b(?:CUDA|HIP|MUSA) error: (?P<msg>\S.*?)\s*$")
_CUDA_WHERE = re.compile(r"current device: -?\d+, in function (?P<func>\S+) at (?P<file>.+?):\d+\s*$")
_API_CALL = re.compile(r"^\s*(?P<api>[A-Za-z_][\w:]*)\s*\(")
_GGML_ASSERT = re.compile(r"(?P<file>\S+?):\d+: (?P<what>GGML_ASSERT\((?P<cond>.*)\) failed)")
_C_ASSERT = re.compile(r"(?P<file>[^\s:]+):\d+: (?P<func>[^:]+?): Assertion [`'](?P<cond>.+)' failed")
_MSVC_ASSERT = re.compile(r"Assertion failed: (?P<cond>.+?), file (?P<file>.+?), line \d+")
_ASSERT_LINE = re.compile(r"\bassert(?:ion)? failed\b.*", re.I)
_FAIL_LINE = re.compile(r"^\s*(?:\[\s*FAIL(?:ED)?\s*\]|FAIL(?:ED)?\b[:!]?)\s*(?P<what>.*)$", re.M)
_TIMEOUT_TEXT = re.compile(r"\*\*\*Timeout|\btimed out\b", re.I)
_SAN_LINE, _SAN_DETAIL = SANITIZER_REPORT, SANITIZER_DETAIL
_SAN_NOT_A_REPORT, _SAN_AT = SANITIZER_NOT_A_REPORT, SANITIZER_AT


def _sanitizer(text: str, context: str, roots: Sequence[str], tool: str = "") -> Signature | None:
    counts = [int(n) for n in _SAN_SUMMARY.findall(text)]
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _SAN_LINE.match(line)
        if not m or _SAN_DETAIL.match(line) or _SAN_NOT_A_REPORT.match(m.group("msg")):
            continue
        msg = m.group("msg")
        where = ""
        evidence = [line]
        for follow in lines[i + 1:i + 8]:
            d = _SAN_DETAIL.match(follow)
            if not d:
                break
            evidence.append(follow)
            at = _SAN_AT.match(d.group("msg"))
            if at and not where:
                where = (at.group("fn1") or at.group("fn2") or "").strip()
        label = f"{tool}: " if tool else ""
        key = f"{label}{strip_templates(normalise(msg, roots))}" + \
            (f" in {strip_templates(normalise(where, roots))}" if where else "")
        if context:
            key = f"{context}: {key}"
        return _sig("sanitizer_report", key, f"compute-sanitizer{' ' + tool if tool else ''}: {msg}"
                    + (f" in {where}" if where else "") + (f" ({context})" if context else ""), evidence)
    if counts and sum(counts):
        key = f"{context + ': ' if context else ''}{tool or 'compute-sanitizer'} reported errors"
        return _sig("sanitizer_report", key, f"compute-sanitizer{' ' + tool if tool else ''}: "
                    f"{sum(counts)} error(s)" + (f" in {context}" if context else ""),
                    [m.group(0) for m in _SAN_SUMMARY.finditer(text)])
    return None


def _cuda(text: str, roots: Sequence[str]) -> Signature | None:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _CUDA_ERROR.search(line)
        if not m:
            continue
        msg = m.group("msg")
        func, api, evidence = "", "", [line]
        for j in range(i + 1, min(i + 3, len(lines))):
            w = _CUDA_WHERE.search(lines[j])
            if w:
                func = w.group("func")
                evidence.append(lines[j])
                if j + 1 < len(lines):
                    a = _API_CALL.match(lines[j + 1])
                    if a:
                        api = a.group("api")
                        evidence.append(lines[j + 1])
                break
        key = f"{normalise(msg, roots).lower()} at {api or 'unknown call'}"
        summary = f"CUDA error: {msg} at {api or 'an unknown call'}" + (f" (in {func})" if func else "")
        return _sig("cuda_error", key, summary, evidence)
    return None


def _assertion(text: str, context: str, roots: Sequence[str]) -> Signature | None:
    prefix = f"{context}: " if context else ""
    for pattern in (_GGML_ASSERT, _C_ASSERT, _MSVC_ASSERT):
        m = pattern.search(text)
        if m:
            what = m.group("what") if "what" in pattern.groupindex else f"assertion `{m.group('cond')}' failed"
            file = relative_path(m.group("file"), roots)
            line = _line_at(text, m.start())
            return _sig("test_assertion", f"{prefix}{normalise(what, roots)} in {file}",
                        f"{what} in {file}" + (f" ({context})" if context else ""), [line])
    m = _ASSERT_LINE.search(text)
    if m:
        return _sig("test_assertion", prefix + normalise(m.group(0), roots),
                    f"{m.group(0).strip()}" + (f" ({context})" if context else ""), [m.group(0)])
    m = _FAIL_LINE.search(text)
    if m:
        what = m.group("what").strip() or "FAIL"
        return _sig("test_assertion", prefix + "FAIL " + normalise(what, roots),
                    f"FAIL {what}" + (f" ({context})" if context else ""), [m.group(0)])
    return None


#: One test-backend-ops case line: ``  MUL_MAT(type_a=f16,type_b=f32,m=16,...): ... FAIL``
#: (tests/test-backend-ops.cpp prints the op, its parameters, the error and OK/FAIL).
_BACKEND_OP_FAIL = re.compile(r"^\s*(?P<case>(?P<op>[A-Z][A-Z0-9_]*)\((?P<params>.*?)\)):\s.*\bFAIL\b", re.M)
_BACKEND_NAME = re.compile(r"^\s*Backend \d+/\d+: (?P<name>\S+)", re.M)


def _backend_ops(text: str, context: str) -> Signature | None:
    """test-backend-ops failures keyed by every failing op with its parameters (and backend), sorted."""
    cases: dict[str, str] = {}
    for m in _BACKEND_OP_FAIL.finditer(text):
        backends = [b.group("name") for b in _BACKEND_NAME.finditer(text, 0, m.start())]
        case = m.group("case") + (f" on {backends[-1]}" if backends else "")
        cases.setdefault(case, _line_at(text, m.start()))
    if not cases:
        return None
    names = sorted(cases)
    prefix = f"{context or 'test-backend-ops'}: "
    more = f" (+{len(names) - 1} more failing case(s))" if len(names) > 1 else ""
    return _sig("test_assertion", prefix + "FAIL " + "; ".join(names), f"{prefix}FAIL {names[0]}{more}",
                [cases[n] for n in names])


def classify_text(text: str, context: str = "", roots: Sequence[str] = (), *, tool: str = "") -> Signature | None:
    """The signature a failing program's output shows, or None when no rule matches.

    ``text``: the program's output; ``context``: the test or program name put into the key
    (e.g. ``test-moe-pin-layers``, ``llama-completion``); ``roots``: source/build directories
    paths are made relative to; ``tool``: the compute-sanitizer tool, when it ran under one.
    Rules in order: sanitizer report, CUDA error, test-backend-ops FAIL lines, assertion or
    FAIL line, timeout, signal.  ANSI escape codes are removed first.
    """
    text = strip_ansi(text)
    for found in (_sanitizer(text, context, roots, tool), _cuda(text, roots), _backend_ops(text, context),
                  _assertion(text, context, roots)):
        if found:
            return found
    m = _TIMEOUT_TEXT.search(text)
    if m:
        line = _line_at(text, m.start())
        return _sig("timeout", f"timeout in {context or 'program'}", f"{context or 'program'} timed out", [line])
    sig = _signal_in_text(text)
    if sig:
        name, line = sig
        return signal_signature(name, context, line)
    return None


def signal_signature(name: str, context: str, evidence: str = "") -> Signature:
    """A ``signal`` signature for signal ``name`` (e.g. SIGSEGV) ending ``context`` (a test or program)."""
    where = context or "program"
    return _sig("signal", f"{name} in {where}", f"{where} killed by {name}", [evidence])
