"""Deciding a greedy comparison from the engine's token streams.

Inputs are what the runs produced: per configuration the engine generations
(token ids, pieces, end-of-generation flags and the two highest logits of
every row, ``harness.stages.outputs.engine``), the llama-completion run's text
(``harness.stages.outputs.compare``) and, for the candidate, the teacher-forced KL divergence
against the reference.  Everything here is a pure function of those records, so
it is tested on recorded streams.

Rules (docs/comparisons.md, "Rules"):

* A crash in any run of either side gives ``crashed``; otherwise a timeout gives
  ``timeout``.
* A configuration whose engine repeats differ in token ids, or whose
  llama-completion text differs from its engine text, is nondeterministic; the
  comparison is then ``diverged``, never ``identical``.
* The first divergence is the first generated-token index (from 0) where the
  token ids differ.  An end-of-generation token is part of the stream: both
  sides stopping at once is identical (an empty generation is valid), one side
  stopping where the other continues diverges at that index.
* ``near_tie`` is true when the reference's top-1 minus top-2 logit at the
  divergence is below the group's ``near_tie_margin`` and the candidate chose
  the reference's second choice.
* The llama-completion texts are compared byte for byte; a difference there
  diverges the comparison even when the token streams agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...common.statuses import CRASHED, DIVERGED, GENERATION_FAILURES, IDENTICAL, TIMEOUT
from .compare import GenerationResult
from .engine import EngineGeneration, GenToken, ScoreResult


@dataclass
class EngineRun:
    """One engine generation or its failure: ``status`` ok, crashed or timeout; ``error`` the reason; ``seconds`` wall time."""

    status: str
    generation: EngineGeneration | None = None
    error: str = ""
    seconds: float = 0.0


@dataclass
class SideRuns:
    """Everything one configuration produced for one prompt: engine repeats and the llama-completion run (None: not run)."""

    engine: list[EngineRun]
    completion: GenerationResult | None = None


@dataclass(frozen=True)
class TokenSide:
    """One side's token at a divergence: id, piece (text, invalid UTF-8 replaced) and its exact bytes as hex,
    end-of-generation flag, the top-1 minus top-2 logit of the row it was chosen from (nats), and that row's
    two highest (id, logit) pairs."""

    id: int
    piece: str
    piece_hex: str
    eog: bool
    margin: float
    top: tuple[tuple[int, float], tuple[int, float]]


@dataclass(frozen=True)
class Divergence:
    """The first divergent generated token.

    ``index`` counts generated tokens from 0; ``reference``/``candidate`` are the
    sides' tokens there (``None``: that side's stream ended without an
    end-of-generation token, i.e. at n_predict).  ``near_tie`` and the
    ``near_tie_margin`` it was judged with (nats) are explained in the module
    docstring.  ``text_offset`` is where the token starts in the generated text,
    in characters of the text decoded as UTF-8 with replacement (for display).
    """

    index: int
    reference: TokenSide | None
    candidate: TokenSide | None
    near_tie: bool
    near_tie_margin: float
    text_offset: int = 0


@dataclass(frozen=True)
class KlSummary:
    """KL(reference || candidate) over the generated positions, teacher-forced on the reference's tokens.

    ``positions``: number of positions; ``mean``/``max`` in nats; ``max_at``: the
    position of the maximum; ``top1_agreement``: fraction of positions (0..1)
    where both full distributions have the same most likely token.  ``per_position``: the KL of each
    position in nats, kept where any is above zero (the report draws them; all-zero lists are left out).
    """

    positions: int
    mean: float
    max: float
    max_at: int
    top1_agreement: float
    per_position: tuple[float, ...] = ()


#: The statuses of a :class:`TextCheck` besides ``identical`` (the comparison's IDENTICAL): the texts part, or a
#: side's text may be cut.
TEXT_DIFFERS, TEXT_CUT = "differs", "incomplete"


@dataclass(frozen=True)
class TextCheck:
    """The llama-completion texts compared byte for byte.

    ``status``: ``identical``, ``differs`` (``first_differing_byte`` is the byte
    offset where they part, or the shorter length when one is a prefix) or
    ``incomplete`` (a side's stdout lacked llama-completion's end-of-run
    trailer, so its text may be cut: compared only as far as it goes).
    ``reference_bytes``/``candidate_bytes``: the texts' lengths.
    """

    status: str
    first_differing_byte: int | None
    reference_bytes: int
    candidate_bytes: int


@dataclass
class StreamComparison:
    """The verdict for one prompt of one candidate against the reference.

    ``status``: identical, diverged, crashed or timeout.  ``detail``: one line.
    ``nondeterministic``: the configurations whose runs disagreed among
    themselves.  ``first_divergence``: between the first engine repeats.
    ``kl``: the candidate's teacher-forced KL summary (None when not scored).
    ``text_check``: the llama-completion check (None when a side has no text).
    ``reference_tokens``/``candidate_tokens``: the first engine repeats' ids;
    ``reference_text``/``candidate_text``: their texts (pieces joined).
    """

    prompt_id: str
    reference: str
    candidate: str
    status: str
    detail: str
    nondeterministic: list[str] = field(default_factory=list)
    first_divergence: Divergence | None = None
    kl: KlSummary | None = None
    text_check: TextCheck | None = None
    reference_tokens: list[int] = field(default_factory=list)
    candidate_tokens: list[int] = field(default_factory=list)
    reference_text: bytes = b""
    candidate_text: bytes = b""


def token_side(tok: GenToken | None) -> TokenSide | None:
    """The ``TokenSide`` record of a generated token (None stays None)."""
    if tok is None:
        return None
    return TokenSide(id=tok.id, piece=tok.piece.decode("utf-8", "replace"), piece_hex=tok.piece.hex(), eog=tok.eog,
                     margin=tok.margin, top=tok.top)


def first_divergence(ref: Sequence[GenToken], cand: Sequence[GenToken], near_tie_margin: float) -> Divergence | None:
    """The first generated-token index where two streams differ by token id, or None when they are equal.

    A stream that is shorter (it reached n_predict) diverges at its length, with
    ``None`` on its side.  ``near_tie_margin`` (nats) decides ``near_tie``: the
    reference's margin at the index is below it and the candidate's token is the
    reference's second choice.
    """
    common = min(len(ref), len(cand))
    index = next((k for k in range(common) if ref[k].id != cand[k].id), None)
    if index is None:
        if len(ref) == len(cand):
            return None
        index = common
    r = ref[index] if index < len(ref) else None
    c = cand[index] if index < len(cand) else None
    near = bool(r is not None and c is not None and r.margin < near_tie_margin and c.id == r.top[1][0])
    prefix = b"".join(t.piece for t in ref[:index])
    return Divergence(index=index, reference=token_side(r), candidate=token_side(c), near_tie=near,
                      near_tie_margin=near_tie_margin, text_offset=len(prefix.decode("utf-8", "replace")))


def first_differing_byte(a: bytes, b: bytes) -> int | None:
    """The first byte offset where ``a`` and ``b`` differ (the shorter length if one is a prefix), None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check_texts(ref: GenerationResult, cand: GenerationResult) -> TextCheck:
    """Compare two llama-completion runs' texts byte for byte (see ``TextCheck``)."""
    offset = first_differing_byte(ref.text, cand.text)
    if ref.complete and cand.complete:
        status = IDENTICAL if offset is None else TEXT_DIFFERS
    else:
        # a cut text is only known up to its length: it must be a prefix of the other
        shorter = min(len(ref.text), len(cand.text))
        cut_offset = first_differing_byte(ref.text[:shorter], cand.text[:shorter])
        status, offset = (TEXT_CUT, None) if cut_offset is None else (TEXT_DIFFERS, cut_offset)
    return TextCheck(status=status, first_differing_byte=offset, reference_bytes=len(ref.text),
                     candidate_bytes=len(cand.text))


def summarize_kl(score: ScoreResult) -> KlSummary | None:
    """Mean, maximum and top-1 agreement of a teacher-forced score against a reference; None without positions."""
    if not score.kl:
        return None
    worst = max(range(len(score.kl)), key=lambda k: score.kl[k])
    return KlSummary(positions=len(score.kl), mean=math.fsum(score.kl) / len(score.kl), max=score.kl[worst],
                     max_at=worst, top1_agreement=sum(score.top1) / len(score.top1),
                     per_position=tuple(score.kl) if score.kl[worst] > 0 else ())


def _side_failure(kind: str, name: str, side: SideRuns) -> str | None:
    failed = [r.error for r in side.engine if r.status == kind]
    comp = side.completion
    if comp is not None and comp.status == kind:
        cause = comp.signal or f"exit code {comp.returncode}"
        if kind == TIMEOUT:
            cause = f"after {comp.seconds:.0f} s"
        failed.append(f"llama-completion {cause}" + (f": {comp.error_line}" if comp.error_line else ""))
    if not failed:
        return None
    verb = "timed out" if kind == TIMEOUT else CRASHED
    return f"{name} {verb}: {failed[0]}" + (f" (and {len(failed) - 1} more runs)" if len(failed) > 1 else "")


def _self_disagreement(side: SideRuns) -> str | None:
    gens = [r.generation for r in side.engine if r.generation is not None]
    first = gens[0]
    for k, g in enumerate(gens[1:], 2):
        div = first_divergence(first.tokens, g.tokens, 0.0)
        if div is not None:
            return f"engine repeat {k} differs from repeat 1 at generated token {div.index}"
    comp = side.completion
    if comp is not None:
        text = first.text
        offset = first_differing_byte(text, comp.text)
        if offset is not None and (comp.complete or not text.startswith(comp.text)):
            return f"llama-completion text differs from the engine's at byte {offset}"
    return None


def _piece(side: TokenSide | None) -> str:
    if side is None:
        return "end of output (n_predict reached)"
    what = "end of generation" if side.eog else repr(side.piece)
    return f"{what} (id {side.id}, margin {side.margin:.4g})"


def describe_divergence(div: Divergence) -> str:
    """One line: index, both sides' tokens with margins, near tie or hard divergence."""
    kind = "near tie" if div.near_tie else "hard divergence"
    return (f"diverged at generated token {div.index} ({kind}): reference {_piece(div.reference)} vs "
            f"candidate {_piece(div.candidate)}")


def compare_streams(prompt_id: str, reference_name: str, reference: SideRuns, candidate_name: str,
                    candidate: SideRuns, near_tie_margin: float, kl: KlSummary | None = None) -> StreamComparison:
    """Decide one prompt of a comparison by the rules of the module docstring.

    Takes both sides' runs, the group's near-tie margin (nats) and the
    candidate's KL summary; returns a ``StreamComparison``, without the KL summary where a side crashed or
    timed out (the score of what it generated before it ended is no measure of the comparison).  Raises
    ``ValueError`` when a side has no engine run.
    """
    if not reference.engine or not candidate.engine:
        raise ValueError(f"prompt {prompt_id!r}: each side needs at least one engine run")
    base = StreamComparison(prompt_id=prompt_id, reference=reference_name, candidate=candidate_name,
                            status=IDENTICAL, detail="", kl=kl)
    sides = ((reference_name, reference), (candidate_name, candidate))
    for kind in GENERATION_FAILURES:
        failures = [f for name, side in sides if (f := _side_failure(kind, name, side))]
        if failures:  # a crash is a crash: no KL or agreement figures of a generation that did not finish
            base.status, base.detail, base.kl = kind, "; ".join(failures), None
            return base

    ref_gen = reference.engine[0].generation
    cand_gen = candidate.engine[0].generation
    assert ref_gen is not None and cand_gen is not None
    base.reference_tokens, base.candidate_tokens = ref_gen.ids, cand_gen.ids
    base.reference_text, base.candidate_text = ref_gen.text, cand_gen.text
    notes: list[str] = []
    for name, side in sides:
        why = _self_disagreement(side)
        if why:
            base.nondeterministic.append(name)
            notes.append(f"nondeterministic: {name}: {why}")
    if reference.completion is not None and candidate.completion is not None:
        base.text_check = check_texts(reference.completion, candidate.completion)

    base.first_divergence = first_divergence(ref_gen.tokens, cand_gen.tokens, near_tie_margin)
    parts: list[str] = []
    if base.first_divergence is not None:
        parts.append(describe_divergence(base.first_divergence))
    elif ref_gen.tokens == [] or (len(ref_gen.tokens) == 1 and ref_gen.tokens[0].eog):
        parts.append("identical (both generations end at once)")
    tc = base.text_check
    if tc is not None and tc.status == TEXT_DIFFERS:
        parts.append(f"llama-completion texts differ at byte {tc.first_differing_byte}")
    elif tc is not None and tc.status == TEXT_CUT:
        notes.append("llama-completion text cut at exit on one side: compared as far as it goes")
    if base.first_divergence is not None or base.nondeterministic or (tc is not None and tc.status == TEXT_DIFFERS):
        base.status = DIVERGED
    elif not parts:
        parts.append(IDENTICAL)
    if kl is not None:
        notes.append(f"KL mean {kl.mean:.3g} max {kl.max:.3g} nats, top-1 agreement {kl.top1_agreement:.1%}")
    base.detail = "; ".join(parts + notes) or IDENTICAL
    return base
