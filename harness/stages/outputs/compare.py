"""Greedy-decoding runs of ``llama-completion`` and their comparison.

The ``compare-outputs`` stage runs one reference configuration and several
candidate configurations of the same model on the same prompts with greedy
decoding (temperature 0), each a few times, and reports per prompt whether the
generated text is identical, where it first diverges (the first divergent
token), or whether a run crashed or timed out.

Generated text is handled as raw bytes throughout; ``llama-completion`` writes
token pieces to stdout as they are produced, and a piece can end in the middle
of a UTF-8 sequence.  Token ids are recovered afterwards by running
``llama-tokenize`` from the same build on each side's text.

Longer than 400 lines: starting llama-completion, reading its bytes back (trailer, CRLF, cut
pieces) and comparing them are one contract; the result cache keys sessions by this file's bytes.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...common import proc
from ...common.words import signal_name
from ...common.statuses import CRASHED, DIVERGED, GENERATION_FAILURES, IDENTICAL, TIMEOUT
from ...common.json_value import JSON

#: How one generation ended: ``ok``, or one of harness.common.statuses.GENERATION_FAILURES (a crash, a time
#: limit), the status its comparison then takes.
GenerationStatus = str
#: A name declared in harness.common.statuses.COMPARISON (the one place comparison statuses are declared).
ComparisonStatus = str

#: ``llama-completion`` ends every run that returns from ``main`` normally with
#: ``LOG("\n\n")`` after the generation loop (tools/completion/completion.cpp).
END_OF_RUN_TRAILER = b"\n\n"

#: Printed by ``llama-completion`` in place of nothing when the sampled token
#: is an end-of-generation token and the run is not interactive; the token's
#: own piece is printed empty because special tokens are not rendered.
END_OF_TEXT_MARKER = b" [end of text]\n"

#: Lines of stderr that name a failure.  ggml's ``GGML_ASSERT``/``GGML_ABORT``
#: messages, CUDA runtime errors ("CUDA error: ..."), llama.cpp's
#: ``error:``/``failed to ...`` messages, and C++ runtime aborts all match.
_ERROR_LINE = re.compile(
    r"GGML_ASSERT|GGML_ABORT|CUDA error|\berror\b|\bfailed\b|\bfailure\b|\babort(ed)?\b"
    r"|\bfatal\b|\bexception\b|\bterminate called\b|segmentation fault|out of memory",
    re.IGNORECASE,
)

#: The start of a token line of the default llama-tokenize format after the
#: previous line's closing quote.
_TOKEN_LINE_START = re.compile(rb"'\n *-?\d+ -> '")

#: How much of the end of stderr is searched for an error line, in bytes.
_STDERR_TAIL_BYTES = 1 << 20


class TokenizeError(RuntimeError):
    """``llama-tokenize`` failed or printed output this module cannot parse."""


@dataclass(frozen=True)
class Token:
    """One token of a tokenized text.

    ``id`` is the vocabulary id.  ``piece`` is the token's text as printed by
    ``llama-tokenize``, decoded from UTF-8 with ``errors="surrogateescape"`` so a
    piece holding part of a multi-byte character still maps back to its bytes
    (``piece.encode("utf-8", "surrogateescape")``).
    """

    id: int
    piece: str


@dataclass(frozen=True)
class Divergence:
    """The first divergent token of two token sequences.

    ``index`` counts tokens from 0 within the generated text.  ``reference`` and
    ``candidate`` are each side's token at that index, or ``None`` where that
    side's text ended before it.
    """

    index: int
    reference: Token | None
    candidate: Token | None


def first_divergence(ref: Sequence[Token], cand: Sequence[Token]) -> Divergence | None:
    """Find the first index where two token sequences differ by token id.

    Takes the reference and candidate tokens; returns ``None`` when both have
    the same ids in the same order, otherwise the first index ``k`` where the
    ids differ or where one sequence has ended (that side's token is then
    ``None``).  Pieces are not compared: the id decides.
    """
    common = min(len(ref), len(cand))
    for k in range(common):
        if ref[k].id != cand[k].id:
            return Divergence(index=k, reference=ref[k], candidate=cand[k])
    if len(ref) == len(cand):
        return None
    return Divergence(
        index=common,
        reference=ref[common] if common < len(ref) else None,
        candidate=cand[common] if common < len(cand) else None,
    )


@dataclass
class GenerationSpec:
    """One greedy generation: binary, model, prompt and a configuration's extras.

    ``prompt`` is passed through a file byte for byte (a ``str`` is encoded as
    UTF-8 with ``errors="surrogateescape"``).  ``n_predict`` is the number of
    tokens to generate, ``ctx_size`` the context length in tokens, ``threads``
    the CPU thread count (``None``: the binary's default).  ``args`` are extra
    command-line arguments of the configuration and come last, so they can
    override the defaults; ``env`` is added on top of ``os.environ``.
    ``timeout_s`` is the wall-clock limit in seconds.  ``launcher`` is an
    argument-list prefix that runs the binary (an emulator such as Wine for a
    cross-built Windows binary; empty: run it directly) and ``launcher_env``
    the environment it needs; neither is part of the configuration.
    ``crlf_stdout``: the binary writes stdout in text mode with ``\r\n`` line
    ends (a Windows C runtime), which are read back as ``\n``.
    """

    binary: Path
    model: Path
    prompt: str
    n_predict: int = 120
    seed: int = 42
    ctx_size: int = 1024
    threads: int | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 300.0
    launcher: tuple[str, ...] = ()
    launcher_env: Mapping[str, str] = field(default_factory=dict)
    crlf_stdout: bool = False


def from_text_mode(raw: bytes) -> bytes:
    """Undo a Windows C runtime's text-mode stdout: every ``\n`` written became ``\r\n``.

    Replacing each ``\r\n`` by ``\n`` is the exact inverse (a written
    ``\r\n`` was stored as ``\r\r\n`` and comes back as ``\r\n``).
    """
    return raw.replace(b"\r\n", b"\n")


@dataclass
class GenerationResult:
    """Outcome of one ``llama-completion`` run.

    ``status`` is ``"ok"`` (exit code 0; an empty text is a valid generation
    that ended at once), ``"crashed"`` (killed by a signal or a non-zero exit
    code) or ``"timeout"`` (killed by us after
    ``GenerationSpec.timeout_s``; ``returncode`` and ``signal`` are then
    ``None``).  ``text`` is the generated text as bytes (for crashed and timed
    out runs: whatever was written to stdout).  ``signal`` names the signal that
    ended the process (e.g. ``"SIGSEGV"``).  ``error_line`` is the last stderr
    line that looks like an error, set for runs that did not succeed.
    ``seconds`` is the wall-clock duration.  ``stopped_at_eog`` tells whether
    the generation ended on an end-of-generation token rather than after
    ``n_predict`` tokens.  ``complete`` tells whether stdout showed that every
    generated piece was written (see ``split_completion_stdout``).
    """

    status: GenerationStatus
    text: bytes
    returncode: int | None
    signal: str | None
    error_line: str | None
    seconds: float
    stdout_path: Path
    stderr_path: Path
    argv: list[str]
    stopped_at_eog: bool = False
    complete: bool = True


def completion_argv(spec: GenerationSpec, prompt_file: Path) -> list[str]:
    """Build the ``llama-completion`` argument list for a greedy, non-interactive run.

    Takes the spec and the path of the file holding the prompt; returns argv.
    Flag choices (tools/completion/completion.cpp and common/arg.cpp at the
    pinned commit):

    * ``-no-cnv``: a model with a chat template otherwise starts conversation
      mode, which wraps the prompt in the template and waits on stdin.
    * ``--no-display-prompt``: the prompt is not echoed, so stdout starts with
      the first generated piece.
    * ``--temp 0``: the temperature sampler keeps only the highest logit,
      i.e. greedy decoding; ``--seed`` is still pinned for the final sampler.
    * ``--no-escape``: ``\\n``-style escapes in the prompt stay literal.
    * ``--simple-io`` and ``--color off``: no terminal handling or colour codes.
    * ``--no-warmup``: skips the empty warm-up decode, which does not change
      the output.
    * ``-fit off``: the configuration's arguments are the run's settings. With
      fit on (upstream's default since before llama-cpp-python 0.3.30), every
      process first loads the model's metadata and vocabulary once more to project
      its memory use and may then change unset settings (context, offloaded
      layers) to fit the free memory of that moment, so two runs of one
      configuration could differ by what else held memory. In every run of the
      matrix it changed nothing ("no changes needed"), and it cost 0.9 s of each
      gemma3-270m process start on the 2-core development machine (0.2 s on the
      H200 machine).
    * ``-lv 4``: ggml's and llama's INFO lines (model facts, buffer types,
      the pin ladder's per-allocation summary) reach stderr; common/log.cpp
      maps them to verbosity 4, one above the default.  stdout is unchanged.
    """
    argv = [
        str(spec.binary),
        "-m", str(spec.model),
        "-f", str(prompt_file),
        "-n", str(spec.n_predict),
        "-c", str(spec.ctx_size),
        "--seed", str(spec.seed),
        "--temp", "0",
        "-no-cnv",
        "--no-display-prompt",
        "--no-escape",
        "--simple-io",
        "--color", "off",
        "--no-warmup",
        "-fit", "off",
        "-lv", "4",
    ]
    if spec.threads is not None:
        argv += ["-t", str(spec.threads)]
    argv += list(spec.args)
    return argv


def write_prompt_file(prompt: str, path: Path) -> None:
    """Write ``prompt`` to ``path`` so that ``llama-completion -f`` reads it unchanged.

    The ``-f`` handler in common/arg.cpp drops one trailing ``\\n`` from the
    file, so one extra ``\\n`` is appended; every other byte reaches the
    tokenizer as written (UTF-8, ``errors="surrogateescape"``).
    """
    path.write_bytes(prompt.encode("utf-8", "surrogateescape") + b"\n")


def split_completion_stdout(raw: bytes) -> tuple[bytes, bool, bool]:
    """Separate the generated text from what ``llama-completion`` adds to stdout.

    Takes the raw stdout bytes of a run with ``--no-display-prompt``; returns
    ``(text, stopped_at_eog, complete)``.  The run's stdout is the generated
    pieces, then ``" [end of text]\\n"`` only if an end-of-generation token was
    sampled, then ``"\\n\\n"`` (tools/completion/completion.cpp).  Exactly those
    additions are removed; nothing else is normalised.

    llama-completion writes stdout through common/log.cpp's worker thread, and
    ``common_log_main()`` deliberately never flushes that queue at exit (see the
    comment there), so the last entries can be lost.  Each piece, the marker and
    the trailer are separate entries and what reaches stdout is a prefix of them:
    with the trailer or the marker present every piece was written
    (``complete``); without either the text may be cut.
    """
    if raw.endswith(END_OF_RUN_TRAILER):
        body, complete = raw[: -len(END_OF_RUN_TRAILER)], True
    else:
        body, complete = raw, False
    if body.endswith(END_OF_TEXT_MARKER):
        return body[: -len(END_OF_TEXT_MARKER)], True, True
    return body, False, complete


def find_error_line(stderr: bytes) -> str | None:
    """Return the last line of ``stderr`` that looks like an error, or ``None``.

    Matching follows ``_ERROR_LINE`` (GGML_ASSERT, CUDA error, error, failed,
    abort, ...); only the last ``_STDERR_TAIL_BYTES`` bytes are searched.  The
    line is decoded as UTF-8 with replacement characters and stripped.
    """
    tail = stderr[-_STDERR_TAIL_BYTES:].decode("utf-8", errors="replace")
    for line in reversed(tail.splitlines()):
        if _ERROR_LINE.search(line):
            return line.strip()
    return None


def prepare_generation(spec: GenerationSpec, log_stem: Path) -> tuple[list[str], Path, Path]:
    """Write ``<log_stem>.prompt`` and ``<log_stem>.cmd`` for ``spec``; return (argv, stdout path, stderr path).

    ``.cmd`` is JSON with argv, the environment added on top of ``os.environ`` and the
    timeout in seconds.  Parent directories are created; raises OSError when they cannot be written.
    """
    log_stem.parent.mkdir(parents=True, exist_ok=True)
    prompt_path = log_stem.with_name(log_stem.name + ".prompt")
    cmd_path = log_stem.with_name(log_stem.name + ".cmd")

    write_prompt_file(spec.prompt, prompt_path)
    argv = [*spec.launcher, *completion_argv(spec, prompt_path)]
    cmd_path.write_text(
        json.dumps(
            {"argv": argv, "env": dict(spec.env), "launcher_env": dict(spec.launcher_env),
             "timeout_s": spec.timeout_s},
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    return argv, log_stem.with_name(log_stem.name + ".stdout"), log_stem.with_name(log_stem.name + ".stderr")


def run_generation(spec: GenerationSpec, log_stem: Path) -> GenerationResult:
    """Run ``llama-completion`` once for ``spec`` and collect the generated text.

    Writes ``<log_stem>.prompt`` (the prompt file passed with ``-f``),
    ``<log_stem>.stdout``, ``<log_stem>.stderr`` and ``<log_stem>.cmd`` (JSON
    with argv, the environment added on top of ``os.environ``, and the timeout
    in seconds); parent directories are created.  The process gets stdin from
    ``/dev/null`` and its own process group (harness.common.proc); on timeout or an
    interrupt the whole group is terminated.  Returns a ``GenerationResult``; a crash or timeout is
    a result, not an exception.  Raises ``OSError`` if the binary cannot be
    started or the log files cannot be written.
    """
    argv, stdout_path, stderr_path = prepare_generation(spec, log_stem)
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        done = proc.run(argv, stdout=out, stderr=err, env={**spec.launcher_env, **spec.env},
                        timeout_s=spec.timeout_s)
    timed_out, returncode, seconds = done.timed_out, done.returncode, done.seconds

    raw = stdout_path.read_bytes()
    if spec.crlf_stdout:
        raw = from_text_mode(raw)
    stderr = stderr_path.read_bytes()
    common: dict[str, Any] = dict(  # the GenerationResult fields every ending shares, each of its own type
        seconds=seconds, stdout_path=stdout_path, stderr_path=stderr_path, argv=argv
    )
    if timed_out:
        return GenerationResult(
            status=TIMEOUT, text=raw, returncode=None, signal=None,
            error_line=find_error_line(stderr), **common,
        )
    assert returncode is not None
    if returncode < 0:
        return GenerationResult(
            status=CRASHED, text=raw, returncode=returncode,
            signal=signal_name(-returncode), error_line=find_error_line(stderr), **common,
        )
    if returncode != 0:
        return GenerationResult(
            status=CRASHED, text=raw, returncode=returncode, signal=None,
            error_line=find_error_line(stderr), **common,
        )
    text, stopped_at_eog, complete = split_completion_stdout(raw)
    return GenerationResult(
        status="ok", text=text, returncode=0, signal=None, error_line=None,
        stopped_at_eog=stopped_at_eog, complete=complete, **common,
    )


def _run_tokenize(argv: list[str], timeout_s: float, launcher: Sequence[str] = (),
                  launcher_env: Mapping[str, str] | None = None, crlf_stdout: bool = False) -> bytes:
    done, out, err = proc.run_capture([*launcher, *argv], env=launcher_env, timeout_s=timeout_s)
    if done.timed_out:
        raise TokenizeError(f"{argv[0]} timed out after {timeout_s:.0f} s")
    if done.returncode != 0:
        line = find_error_line(err) or f"exit code {done.returncode}"
        raise TokenizeError(f"{argv[0]} failed ({done.returncode}): {line}")
    return from_text_mode(out) if crlf_stdout else out


def parse_token_ids(output: bytes) -> list[int]:
    """Parse ``llama-tokenize --ids`` output, a Python list literal like ``[2, 9259]``.

    Returns the ids; raises ``TokenizeError`` if the output is not a list of
    integers.
    """
    try:
        value = ast.literal_eval(output.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError, SyntaxError) as exc:
        raise TokenizeError(f"cannot parse token ids from {output[:200]!r}") from exc
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        raise TokenizeError(f"token id output is not a list of integers: {output[:200]!r}")
    return value


def parse_token_pieces(output: bytes, ids: Sequence[int]) -> list[Token]:
    """Parse the default ``llama-tokenize`` output, guided by known token ids.

    The default format (tools/tokenize/tokenize.cpp) prints one token as
    ``printf("%6d -> '", id)``, the raw piece bytes, then ``'`` and a newline.
    Pieces may themselves hold newlines and quotes, so each piece is taken to
    end just before ``'\\n`` followed by the next token's expected prefix (the
    last one before the final ``'\\n``).  Takes stdout bytes and the ids from
    ``--ids``; returns tokens with pieces decoded using ``surrogateescape``.
    Raises ``TokenizeError`` when the output does not match the ids.
    """
    tokens: list[Token] = []
    pos = 0
    for i, token_id in enumerate(ids):
        prefix = b"%6d -> '" % token_id
        if not output.startswith(prefix, pos):
            raise TokenizeError(
                f"token {i}: expected {prefix!r} at byte {pos} of llama-tokenize output"
            )
        pos += len(prefix)
        if i + 1 < len(ids):
            end = output.find(b"'\n" + b"%6d -> '" % ids[i + 1], pos)
            if end < 0:
                raise TokenizeError(f"token {i}: end of piece not found in llama-tokenize output")
        else:
            if not output.endswith(b"'\n") or len(output) - 2 < pos:
                raise TokenizeError("last token: llama-tokenize output does not end with \"'\\n\"")
            end = len(output) - 2
            if _TOKEN_LINE_START.search(output, pos, end):
                raise TokenizeError("llama-tokenize printed more tokens than --ids listed")
        piece = output[pos:end]
        tokens.append(Token(id=token_id, piece=piece.decode("utf-8", "surrogateescape")))
        pos = end + 2
    if pos != len(output):
        raise TokenizeError(f"unexpected bytes after token list: {output[pos:pos + 80]!r}")
    return tokens


def tokenize(
    tokenize_binary: Path, model: Path, text: bytes, workdir: Path, timeout_s: float = 120.0,
    launcher: Sequence[str] = (), launcher_env: Mapping[str, str] | None = None, crlf_stdout: bool = False,
) -> list[Token]:
    """Tokenize ``text`` with ``llama-tokenize`` and return ids with their pieces.

    ``text`` is written to a file in ``workdir`` and read with ``-f`` (which
    that tool reads verbatim); ``--no-bos`` keeps BOS out, special-token text
    is not parsed (the tool's default) and ``--no-escape`` keeps backslashes
    literal.  The tool runs twice: with ``--ids`` for an unambiguous id list,
    and in its default format for the pieces (see ``parse_token_pieces``).
    Empty text gives ``[]`` without running anything.  ``timeout_s`` bounds each
    run, in seconds.  ``launcher``, ``launcher_env`` and ``crlf_stdout`` mean
    what they mean in ``GenerationSpec`` (a cross-built tokenizer under an
    emulator).  Raises ``TokenizeError`` on a failed run or unparsable output.
    """
    if not text:
        return []
    with _text_file(text, workdir) as text_path:
        base = [str(tokenize_binary), "-m", str(model), "-f", str(text_path), "--no-bos", "--no-escape"]
        run: dict[str, Any] = dict(launcher=launcher, launcher_env=launcher_env, crlf_stdout=crlf_stdout)  # _run_tokenize's keywords
        ids = parse_token_ids(_run_tokenize(base + ["--ids"], timeout_s, **run))
        return parse_token_pieces(_run_tokenize(base, timeout_s, **run), ids)


def prompt_token_ids(
    tokenize_binary: Path, model: Path, text: bytes, workdir: Path, timeout_s: float = 120.0,
    launcher: Sequence[str] = (), launcher_env: Mapping[str, str] | None = None, crlf_stdout: bool = False,
) -> list[int]:
    """The token ids of ``text`` as a prompt, from ``llama-tokenize`` (arguments as in :func:`tokenize`).

    As the engine's ``generate`` tokenizes it (harness/stages/outputs/engine/engine.cpp, ``tokenize_prompt``):
    special-token text parsed (the tool's default, common/arg.cpp: its ``--parse-special`` belongs to
    llama-imatrix), BOS added where the vocabulary adds one, and with it EOS where the vocabulary adds
    that (the tool's ``add_special`` follows the vocabulary's BOS; a vocabulary that adds EOS without
    BOS, T5's, is counted one token short).  Backslashes stay literal (``--no-escape``).  Raises
    ``TokenizeError`` on a failed run or unparsable output.
    """
    with _text_file(text, workdir) as text_path:
        return parse_token_ids(_run_tokenize(
            [str(tokenize_binary), "-m", str(model), "-f", str(text_path), "--no-escape", "--ids"],
            timeout_s, launcher=launcher, launcher_env=launcher_env, crlf_stdout=crlf_stdout))


@contextmanager
def _text_file(text: bytes, workdir: Path) -> Iterator[Path]:
    """``text`` in a file of its own in ``workdir`` (created if missing) for the block, then removed."""
    workdir.mkdir(parents=True, exist_ok=True)
    text_path = workdir / f"tokenize-{os.getpid()}-{time.monotonic_ns()}.txt"
    text_path.write_bytes(text)
    try:
        yield text_path
    finally:
        text_path.unlink(missing_ok=True)


@dataclass
class PromptComparison:
    """Result of comparing one candidate configuration against the reference on one prompt.

    ``status`` is ``"crashed"`` or ``"timeout"`` if any repeat on either side
    failed that way, else ``"identical"`` or ``"diverged"`` by the first
    repeats' texts.  ``first_divergence`` is set for a divergence found at token
    level.  ``detail`` is one human-readable line.  ``nondeterministic`` names
    the configurations whose repeats produced different texts.
    ``reference_text`` and ``candidate_text`` are the first repeats' texts.
    """

    prompt_id: str
    reference: str
    candidate: str
    status: ComparisonStatus
    first_divergence: Divergence | None
    detail: str
    nondeterministic: list[str]
    reference_text: bytes
    candidate_text: bytes


def _describe_piece(token: Token | None) -> str:
    if token is None:
        return "end of output"
    return f"{token.piece!r} (id {token.id})"


def _describe_divergence(div: Divergence) -> str:
    return (
        f"diverged at token {div.index}: "
        f"{_describe_piece(div.reference)} vs {_describe_piece(div.candidate)}"
    )


def _describe_failures(
    kind: GenerationStatus, sides: Sequence[tuple[str, Sequence[GenerationResult]]]
) -> str | None:
    parts: list[str] = []
    for side, runs in sides:
        failed = [r for r in runs if r.status == kind]
        if not failed:
            continue
        first = failed[0]
        count = "" if len(runs) == 1 else f" in {len(failed)} of {len(runs)} repeats"
        if kind == TIMEOUT:
            parts.append(f"{side} timed out{count} after {first.seconds:.0f} s")
            continue
        if first.signal is not None:
            cause = first.signal
        else:
            cause = f"exit code {first.returncode}"
        if first.error_line:
            cause += f": {first.error_line}"
        parts.append(f"{side} crashed{count}: {cause}")
    return "; ".join(parts) if parts else None


def compare_runs(
    prompt_id: str,
    reference_name: str,
    reference_runs: Sequence[GenerationResult],
    candidate_name: str,
    candidate_runs: Sequence[GenerationResult],
    tokenize_fn: Callable[[bytes], list[Token]],
) -> PromptComparison:
    """Compare the repeats of a reference and a candidate configuration on one prompt.

    Rules, in order: a crash in any repeat on either side gives ``"crashed"``;
    otherwise a timeout gives ``"timeout"`` (the detail names the side).
    Otherwise every repeat is compared with the reference's first repeat: a
    configuration whose repeats disagree is listed in ``nondeterministic`` and
    the comparison is ``"diverged"`` (nondeterminism is never reported as
    identical, whichever side shows it); byte-identical texts in every repeat
    give ``"identical"`` (no tokenizing).  A divergence is located by
    ``tokenize_fn`` (bytes -> tokens) in the first pair of texts that differ
    and reported in ``first_divergence``.  Raises ``ValueError`` if either
    side has no runs; exceptions from ``tokenize_fn`` propagate.
    """
    if not reference_runs or not candidate_runs:
        raise ValueError(f"prompt {prompt_id!r}: each side needs at least one run")
    ref_text = reference_runs[0].text
    cand_text = candidate_runs[0].text
    sides = [("reference", reference_runs), ("candidate", candidate_runs)]

    def result(status: ComparisonStatus, detail: str, nondet: list[str],
               div: Divergence | None = None, cand: bytes = cand_text) -> PromptComparison:
        return PromptComparison(
            prompt_id=prompt_id, reference=reference_name, candidate=candidate_name,
            status=status, first_divergence=div, detail=detail, nondeterministic=nondet,
            reference_text=ref_text, candidate_text=cand,
        )

    for kind in GENERATION_FAILURES:
        failure = _describe_failures(kind, sides)
        if failure is not None:
            return result(kind, failure, [])

    nondet = [
        name
        for name, runs in ((reference_name, reference_runs), (candidate_name, candidate_runs))
        if any(r.text != runs[0].text for r in runs[1:])
    ]
    suffix = f"; nondeterministic: {', '.join(nondet)}" if nondet else ""

    # the first text, in repeat order, that differs from the reference's first repeat
    others = [(f"candidate repeat {k}", r.text) for k, r in enumerate(candidate_runs, 1)]
    others += [(f"reference repeat {k}", r.text) for k, r in enumerate(reference_runs[1:], 2)]
    differing = next(((label, text) for label, text in others if text != ref_text), None)
    if differing is None:
        return result(IDENTICAL, IDENTICAL, nondet)
    label, other = differing
    where = "" if label == "candidate repeat 1" else f" ({label} against reference repeat 1)"

    div = first_divergence(tokenize_fn(ref_text), tokenize_fn(other))
    if div is None:
        byte_index = next(
            (i for i, (a, b) in enumerate(zip(ref_text, other)) if a != b),
            min(len(ref_text), len(other)),
        )
        detail = f"diverged at byte {byte_index}; the texts tokenize to the same ids"
        return result(DIVERGED, detail + where + suffix, nondet, cand=other)
    return result(DIVERGED, _describe_divergence(div) + where + suffix, nondet, div, cand=other)


def to_json(obj: object) -> JSON:
    """Convert results of this module into JSON-ready values.

    Dataclasses become dicts of their fields; ``bytes`` become ``str`` decoded
    as UTF-8 with ``errors="replace"``; strings holding surrogate escapes (token
    pieces of partial characters) are re-decoded the same way; ``Path`` becomes
    ``str``; tuples and lists become lists; mappings become dicts.  Other values
    are returned unchanged.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, bytes):
        return obj.decode("utf-8", errors="replace")
    if isinstance(obj, str):
        return obj.encode("utf-8", "surrogateescape").decode("utf-8", errors="replace")
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Mapping):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    return obj
