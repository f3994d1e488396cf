"""One model load, many greedy generations: the harness's ``llama-harness-engine`` program.

The program (``harness/stages/outputs/engine/engine.cpp``) is built into every llama.cpp build
of the harness (``inject.cmake`` adds it to the configure; the llama.cpp tree is
not changed), with the same compiler and toolchain as the build (MinGW too).  It takes llama-completion's command-line arguments, loads the
model once and then serves requests read from stdin:

* ``generate``: a greedy generation returning, per generated token, the engine's
  token id, its piece (bytes), whether it is an end-of-generation token, the two
  highest logits with their token ids and the log-sum-exp of the row;
* ``score``: the prompt plus given tokens evaluated teacher-forced, writing the
  full log-probability rows to a dump file and/or computing KL divergence and
  top-1 agreement against a reference dump;
* ``bench``: a timed prompt of given length and a timed generation of given length
  (the speed stage, harness.stages.speed.speed);
* ``probe`` and ``reload``: what the runtime, driver and OS say of the load's weights
  (harness.record.probe), and of the model loaded and freed again in the same process
  (harness.record.reloads).

``EngineSession`` runs one such process with a configuration's arguments and
environment (optionally behind an emulator prefix such as ``wine``); stderr goes
to a file, so the load's log (buffer types, pin-ladder lines) is kept.
"""

from __future__ import annotations

import json
import queue
import statistics
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ...common import proc
from ...common.words import signal_name
from ...common.statuses import CRASHED, TIMEOUT

if TYPE_CHECKING:  # its type only: the engine's client reads the settings it is given
    from ...matrix.config import Generation

#: The prefix of every reply line the engine writes to stdout.
REPLY_PREFIX = b"@@engine "


def engine_argv(binary: Path, model: Path, gen: Generation, args: Sequence[str] = ()) -> list[str]:
    """The engine's command line for one configuration: binary, model and generation settings, then ``args``.

    ``gen`` is a ``harness.matrix.config.Generation`` (n_predict tokens, seed, ctx_size
    tokens; ``threads``, when set, becomes ``-t``).  The flags are llama-completion's (``--temp 0``: greedy;
    ``--no-warmup``; ``-fit off``: see :func:`harness.stages.outputs.compare.completion_argv`;
    ``-lv 4``: INFO lines such as buffer types and the pin ladder reach stderr), so
    configuration ``args`` mean the same to both and, coming last, override the defaults.
    """
    return [str(binary), "-m", str(model), "-n", str(gen.n_predict), "-c", str(gen.ctx_size),
            "--seed", str(gen.seed), "--temp", "0", "--no-warmup", "-fit", "off", "-lv", "4",
            *(["-t", str(gen.threads)] if gen.threads else []), *args]


class EngineError(RuntimeError):
    """The engine process died, timed out, or answered a request with an error.

    ``kind`` is ``"crashed"`` (the process ended or replied with an error) or
    ``"timeout"``; ``signal`` names the signal that ended it, ``returncode`` its
    exit code (both ``None`` while it runs or after a timeout).
    """

    def __init__(self, kind: str, message: str, returncode: int | None = None, signal_name: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.returncode = returncode
        self.signal = signal_name


@dataclass(frozen=True)
class GenToken:
    """One generated token as the engine produced it.

    ``id``: vocabulary id.  ``piece``: the bytes llama-completion prints for it
    (special tokens render empty).  ``eog``: an end-of-generation token (the
    generation stopped after it).  ``top``: the two highest logits of the row the
    token was chosen from, as ((id, logit), (id, logit)), highest first.
    ``lse``: log of the sum of exp(logits) over the vocabulary, so
    ``logit - lse`` is a log-probability in nats.
    """

    id: int
    piece: bytes
    eog: bool
    top: tuple[tuple[int, float], tuple[int, float]]
    lse: float

    @property
    def margin(self) -> float:
        """Top-1 minus top-2 logit of this row (equal to the difference of their log-probabilities), in nats."""
        return self.top[0][1] - self.top[1][1]


@dataclass
class EngineGeneration:
    """One greedy generation: the tokens (an end-of-generation token included, last) and timings.

    ``prompt_tokens``: prompt length in tokens.  ``prompt_ms``/``gen_ms``: the
    engine's wall time for the prompt and for the generated tokens, milliseconds.
    """

    tokens: list[GenToken]
    prompt_tokens: int
    eog: bool
    prompt_ms: float
    gen_ms: float

    @property
    def ids(self) -> list[int]:
        """The generated token ids."""
        return [t.id for t in self.tokens]

    @property
    def text(self) -> bytes:
        """The generated text: the pieces concatenated (what llama-completion prints)."""
        return b"".join(t.piece for t in self.tokens)


@dataclass
class ScoreResult:
    """A teacher-forced evaluation: ``positions`` scored; per position the KL divergence
    KL(reference || this) in nats and whether both distributions have the same top-1
    token (empty lists when no reference dump was given).  ``score_ms``: milliseconds."""

    positions: int
    kl: list[float] = field(default_factory=list)
    top1: list[bool] = field(default_factory=list)
    score_ms: float = 0.0


@dataclass(frozen=True)
class BenchResult:
    """One timed ``bench`` request: ``n_prompt`` tokens processed in ``pp_ms`` and ``n_gen`` tokens
    generated in ``tg_ms``, ``token_ms`` per generated token (milliseconds, the engine's own clock, each
    part ending when the backend's work has finished).  ``pp_queued_ms``: the time the prompt's decodes took
    to return, before that wait (None from an engine that does not report it): on a GPU the time to queue
    the work, which is what the engine timed as pp before it waited (docs/speed.md, "Where the offset came
    from")."""

    n_prompt: int
    n_gen: int
    pp_ms: float
    tg_ms: float
    token_ms: tuple[float, ...] = ()
    pp_queued_ms: float | None = None

    @property
    def pp_tok_s(self) -> float:
        """Prompt processing speed in tokens per second."""
        return self.n_prompt / (self.pp_ms / 1000.0)

    @property
    def pp_queued_tok_s(self) -> float | None:
        """``n_prompt`` over the prompt's queueing time, tokens per second; None where not reported."""
        return None if not self.pp_queued_ms else self.n_prompt / (self.pp_queued_ms / 1000.0)

    @property
    def tg_tok_s(self) -> float:
        """Generation speed in tokens per second: 1000 over the median milliseconds per generated token
        (over ``tg_ms / n_gen`` without per-token times).  The median, since on a shared machine a few
        tokens of a request are delayed by other processes and would otherwise decide the sample."""
        if self.token_ms:
            return 1000.0 / statistics.median(self.token_ms)
        return self.n_gen / (self.tg_ms / 1000.0)


def parse_generation(reply: Mapping[str, Any]) -> EngineGeneration:
    """Build an ``EngineGeneration`` from a ``generate`` reply (pieces hex-encoded); raises KeyError/ValueError on a malformed reply."""
    tokens = [GenToken(id=int(t["id"]), piece=bytes.fromhex(t["piece"]), eog=bool(t["eog"]),
                       top=((int(t["top"][0][0]), float(t["top"][0][1])), (int(t["top"][1][0]), float(t["top"][1][1]))),
                       lse=float(t["lse"]))
              for t in reply["tokens"]]
    return EngineGeneration(tokens=tokens, prompt_tokens=int(reply["prompt_tokens"]), eog=bool(reply["eog"]),
                            prompt_ms=float(reply["prompt_ms"]), gen_ms=float(reply["gen_ms"]))


def write_engine_cmd(cmd_path: Path, argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> None:
    """Write ``engine.cmd``: JSON with the engine's argv, the environment added and the request timeout (seconds)."""
    cmd_path.write_text(json.dumps({"argv": [str(a) for a in argv], "env": dict(env), "timeout_s": timeout_s},
                                   indent=2) + "\n", encoding="utf-8")


class EngineSession:
    """A running engine process for one configuration and model.

    ``argv`` is the full command (emulator prefix, engine binary, arguments);
    ``env`` is added on top of ``os.environ``.  stderr goes to ``stderr_path``
    (appended), the command to ``cmd_path`` as JSON.  ``load_timeout_s`` bounds
    the model load, ``request_timeout_s`` each request, in seconds.  Use as a
    context manager; ``close`` ends the process (its whole process group on
    POSIX).  Raises ``OSError`` if the process cannot be started and
    ``EngineError`` if the model does not load.
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], stderr_path: Path, cmd_path: Path,
                 load_timeout_s: float, request_timeout_s: float):
        self.argv = [str(a) for a in argv]
        self.request_timeout_s = request_timeout_s
        self.stderr_path = stderr_path
        stderr_path.parent.mkdir(parents=True, exist_ok=True)
        write_engine_cmd(cmd_path, self.argv, env, request_timeout_s)
        self._stderr: IO[bytes] = stderr_path.open("ab")
        start = time.monotonic()
        # its own process group, registered so that an interrupt of the harness ends it (harness.common.proc)
        self.proc = proc.start(self.argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            ready = self._reply(load_timeout_s, "loading the model")
        except EngineError:
            self.kill()
            self._stderr.close()
            raise
        self.load_seconds = time.monotonic() - start
        self.n_vocab = int(ready.get("n_vocab", 0))
        #: what the loaded program says of itself: the model's description as ``llama_model_desc`` gives it
        #: (``model_desc``) and the CPU threads its context decodes with (``n_threads``); {} from an engine
        #: built before it said so
        self.facts: dict[str, Any] = {k: ready[k] for k in ("model_desc", "n_threads") if k in ready}

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(REPLY_PREFIX):
                self._lines.put(line[len(REPLY_PREFIX):])
        self._lines.put(None)

    def _failure(self, kind: str, what: str, timeout_s: float | None = None) -> EngineError:
        if kind == TIMEOUT:
            self.kill()
            return EngineError(TIMEOUT, f"engine timed out after {timeout_s:.0f} s while {what}")
        rc = self.proc.wait()
        sig = signal_name(-rc) if rc < 0 else None
        cause = sig or f"exit code {rc}"
        return EngineError(CRASHED, f"engine ended while {what} ({cause})", returncode=rc, signal_name=sig)

    def _reply(self, timeout_s: float, what: str) -> dict:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise self._failure(TIMEOUT, what, timeout_s) from None
        if line is None:
            raise self._failure(CRASHED, what)
        reply = json.loads(line)
        if not reply.get("ok"):
            raise EngineError(CRASHED, f"engine refused {what}: {reply.get('error')}")
        return reply

    def _request(self, fields: Sequence[str], what: str) -> dict:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("\t".join(fields).encode("ascii") + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._failure(CRASHED, what) from None
        return self._reply(self.request_timeout_s, what)

    def generate(self, prompt: str) -> EngineGeneration:
        """Generate greedily from ``prompt`` (UTF-8, surrogateescape); raises ``EngineError``."""
        return parse_generation(self._request(["generate", prompt.encode("utf-8", "surrogateescape").hex()],
                                              "generating"))

    def score(self, prompt: str, tokens: Sequence[int], dump: Path | None = None,
              reference: Path | None = None) -> ScoreResult:
        """Evaluate ``prompt`` + ``tokens`` teacher-forced (see the module docstring); raises ``EngineError``."""
        reply = self._request(["score", prompt.encode("utf-8", "surrogateescape").hex(),
                               ",".join(str(t) for t in tokens),
                               str(dump).encode().hex() if dump else "-",
                               str(reference).encode().hex() if reference else "-"], "scoring")
        return ScoreResult(positions=int(reply["positions"]), kl=[float(x) for x in reply.get("kl", [])],
                           top1=[bool(x) for x in reply.get("top1", [])], score_ms=float(reply.get("score_ms", 0.0)))

    def bench(self, n_prompt: int, n_gen: int) -> BenchResult:
        """Time ``n_prompt`` tokens of prompt processing and ``n_gen`` generated tokens (see engine.cpp's
        ``bench``); raises ``EngineError`` (a refusal: the counts do not fit the context)."""
        reply = self._request(["bench", str(int(n_prompt)), str(int(n_gen))], "benchmarking")
        return BenchResult(n_prompt=int(reply["n_prompt"]), n_gen=int(reply["n_gen"]),
                           pp_ms=float(reply["pp_ms"]), tg_ms=float(reply["tg_ms"]),
                           token_ms=tuple(float(x) for x in reply.get("tg_token_ms", ())),
                           pp_queued_ms=float(reply["pp_queued_ms"]) if "pp_queued_ms" in reply else None)

    def probe(self, path: Path) -> dict:
        """Write the load's probe record to ``path`` (engine.cpp's ``probe``, harness.record.probe) and return
        the engine's reply (``weights``, ``buffers``: counts; ``probe_ms``); raises ``EngineError``."""
        return self._request(["probe", str(path).encode().hex()], "probing the load")

    def reload(self, count: int, path: Path) -> dict:
        """Load, probe and free the model ``count`` times in this process, beside its own load, writing the record
        to ``path`` (engine.cpp's ``reload``, harness.record.reloads); returns the engine's reply (``loads``,
        ``reload_ms``); raises ``EngineError`` (a load that failed, or a death)."""
        return self._request(["reload", str(int(count)), str(path).encode().hex()], "reloading the model")

    def peak_rss_bytes(self) -> int | None:
        """The engine process's peak resident set so far, in bytes (harness.common.proc.peak_rss_bytes:
        the kernel's VmHWM); None where it cannot be read.  Under an emulator (Wine) it is the process
        the harness started, not the emulator's server."""
        return proc.peak_rss_bytes(self.proc.pid)

    def kill(self) -> None:
        """End the process and its process group (harness.common.proc.terminate) and unregister it."""
        proc.terminate(self.proc)
        proc.finish(self.proc, 0)

    def close(self) -> None:
        """Ask the engine to quit, wait up to 30 s, then kill it; closes the stderr file."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b"quit\n")
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            proc.finish(self.proc, 30)  # terminates the group if it does not quit in time
        finally:
            self._stderr.close()

    def __enter__(self) -> "EngineSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
