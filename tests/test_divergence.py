"""Tests of harness.stages.outputs.divergence on recorded token streams: exact first divergence, margins, near ties,
end of generation, nondeterministic repeats, the llama-completion byte check and the KL summary."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from harness.stages.outputs.compare import GenerationResult, to_json
from harness.stages.outputs.divergence import (
    EngineRun,
    SideRuns,
    check_texts,
    compare_streams,
    first_differing_byte,
    first_divergence,
    summarize_kl,
)
from harness.stages.outputs.engine import EngineGeneration, GenToken, ScoreResult, parse_generation

EOG = 1  # the end-of-generation token id of these recorded streams


def tok(id_: int, piece: bytes, top2: int = 0, margin: float = 5.0, eog: bool = False) -> GenToken:
    """A generated token chosen as the row's top-1 with ``margin`` nats over its second choice ``top2``."""
    return GenToken(id=id_, piece=piece, eog=eog, top=((id_, 10.0), (top2, 10.0 - margin)), lse=11.0)


def end(margin: float = 5.0, top2: int = 0) -> GenToken:
    return tok(EOG, b"", top2=top2, margin=margin, eog=True)


def gen(*tokens: GenToken) -> EngineGeneration:
    return EngineGeneration(tokens=list(tokens), prompt_tokens=5, eog=bool(tokens and tokens[-1].eog),
                            prompt_ms=1.0, gen_ms=2.0)


def completion(text: bytes, complete: bool = True, status: str = "ok") -> GenerationResult:
    return GenerationResult(status=status, text=text, returncode=0 if status == "ok" else -11,
                            signal=None if status == "ok" else "SIGSEGV", error_line=None, seconds=1.0,
                            stdout_path=Path("x.stdout"), stderr_path=Path("x.stderr"), argv=[], complete=complete)


def side(*gens: EngineGeneration, text: bytes | None = None, complete: bool = True) -> SideRuns:
    runs = [EngineRun(status="ok", generation=g) for g in gens]
    comp = completion(gens[0].text if text is None else text, complete) if gens else None
    return SideRuns(engine=runs, completion=comp)


HELLO = gen(tok(10, b"Hello"), tok(11, b","), tok(12, b" world"), end())


def test_identical_streams_are_identical() -> None:
    pc = compare_streams("p", "ref", side(HELLO, HELLO), "cand", side(HELLO, HELLO), 0.1)
    assert pc.status == "identical" and pc.first_divergence is None and pc.nondeterministic == []
    assert pc.text_check is not None and pc.text_check.status == "identical"
    assert pc.reference_tokens == [10, 11, 12, EOG] and pc.detail == "identical"


def test_shifted_merge_reports_the_engines_index_and_pieces() -> None:
    # the candidate generated " wor" + "ld" where the reference generated " world": re-tokenizing the
    # texts would merge them again; the engine's streams part at generated token 2
    cand = gen(tok(10, b"Hello"), tok(11, b","), tok(40, b" wor", top2=12, margin=3.0), tok(41, b"ld"), end())
    pc = compare_streams("p", "ref", side(HELLO), "cand", side(cand), 0.1)
    div = pc.first_divergence
    assert pc.status == "diverged" and div is not None and div.index == 2
    assert div.reference is not None and div.reference.id == 12 and div.reference.piece == " world"
    assert div.candidate is not None and div.candidate.id == 40 and div.candidate.piece_hex == b" wor".hex()
    assert div.reference.margin == 5.0 and div.candidate.margin == 3.0
    # same bytes on both sides: the byte check agrees, the token ids do not
    assert pc.text_check is not None and pc.text_check.status == "identical"
    assert "generated token 2" in pc.detail and "hard divergence" in pc.detail


def test_both_end_at_once_is_an_identical_empty_generation() -> None:
    empty = gen(end())
    pc = compare_streams("p", "ref", side(empty), "cand", side(empty), 0.1)
    assert pc.status == "identical" and pc.first_divergence is None
    assert pc.reference_text == b"" and "end at once" in pc.detail


def test_one_side_ends_at_once_diverges_at_zero() -> None:
    pc = compare_streams("p", "ref", side(gen(end(margin=4.0, top2=10))), "cand", side(HELLO), 0.1)
    div = pc.first_divergence
    assert pc.status == "diverged" and div is not None and div.index == 0
    assert div.reference is not None and div.reference.eog and div.reference.piece == ""
    assert div.candidate is not None and div.candidate.id == 10 and not div.near_tie
    assert pc.text_check is not None and pc.text_check.status == "differs"
    assert pc.text_check.first_differing_byte == 0


def test_candidate_stops_where_reference_continues() -> None:
    short = gen(tok(10, b"Hello"), end())
    pc = compare_streams("p", "ref", side(HELLO), "cand", side(short), 0.1)
    assert pc.first_divergence is not None and pc.first_divergence.index == 1
    assert pc.first_divergence.candidate is not None and pc.first_divergence.candidate.eog


def test_reference_reaches_n_predict_where_candidate_continues() -> None:
    ref = gen(tok(10, b"Hello"), tok(11, b","))
    cand = gen(tok(10, b"Hello"), tok(11, b","), tok(12, b" world"))
    div = first_divergence(ref.tokens, cand.tokens, 0.1)
    assert div is not None and div.index == 2 and div.reference is None and div.candidate is not None


def test_near_tie_flip() -> None:
    ref = gen(tok(10, b"Hello"), tok(11, b",", top2=13, margin=0.004), tok(12, b" world"), end())
    cand = gen(tok(10, b"Hello"), tok(13, b"!", top2=11, margin=0.003), end())
    pc = compare_streams("p", "ref", side(ref), "cand", side(cand), 0.1)
    div = pc.first_divergence
    assert div is not None and div.index == 1 and div.near_tie and div.near_tie_margin == 0.1
    assert "near tie" in pc.detail and pc.status == "diverged"


def test_small_margin_but_third_choice_is_a_hard_divergence() -> None:
    ref = gen(tok(10, b"Hello"), tok(11, b",", top2=13, margin=0.004), end())
    cand = gen(tok(10, b"Hello"), tok(14, b"?"), end())
    div = first_divergence(ref.tokens, cand.tokens, 0.1)
    assert div is not None and not div.near_tie


def test_second_choice_with_a_wide_margin_is_a_hard_divergence() -> None:
    ref = gen(tok(10, b"Hello"), tok(11, b",", top2=13, margin=0.5), end())
    cand = gen(tok(10, b"Hello"), tok(13, b"!"), end())
    div = first_divergence(ref.tokens, cand.tokens, 0.1)
    assert div is not None and not div.near_tie
    assert first_divergence(ref.tokens, cand.tokens, 1.0).near_tie  # the threshold decides


def test_nondeterministic_engine_repeats_never_pass() -> None:
    other = gen(tok(10, b"Hello"), tok(11, b","), tok(50, b" there"), end())
    pc = compare_streams("p", "ref", side(HELLO), "cand", side(HELLO, other, text=HELLO.text), 0.1)
    assert pc.status == "diverged" and pc.nondeterministic == ["cand"] and pc.first_divergence is None
    assert "engine repeat 2 differs from repeat 1 at generated token 2" in pc.detail


def test_completion_text_that_differs_from_the_engine_is_nondeterminism() -> None:
    pc = compare_streams("p", "ref", side(HELLO, text=b"Hello, there"), "cand", side(HELLO, text=b"Hello, there"), 0.1)
    assert pc.status == "diverged" and pc.nondeterministic == ["ref", "cand"]
    assert "llama-completion text differs from the engine's at byte 7" in pc.detail


def test_completion_texts_differ_although_streams_agree() -> None:
    pc = compare_streams("p", "ref", side(HELLO), "cand", side(HELLO, text=HELLO.text + b"\n"), 0.1)
    # the candidate's llama-completion printed more than its engine generation: nondeterministic, and the byte check
    assert pc.status == "diverged"
    assert pc.text_check is not None and pc.text_check.first_differing_byte == len(HELLO.text)


def test_cut_completion_text_is_compared_as_far_as_it_goes() -> None:
    pc = compare_streams("p", "ref", side(HELLO), "cand", side(HELLO, text=b"Hello", complete=False), 0.1)
    assert pc.status == "identical"
    assert pc.text_check is not None and pc.text_check.status == "incomplete"
    assert "cut at exit" in pc.detail
    cut_wrong = check_texts(completion(b"Hello, world"), completion(b"Help", complete=False))
    assert cut_wrong.status == "differs" and cut_wrong.first_differing_byte == 3


def test_crash_wins_over_timeout_and_divergence() -> None:
    crashed = SideRuns(engine=[EngineRun(status="crashed", error="engine ended while generating (SIGSEGV)")],
                       completion=completion(b"", status="ok"))
    timed_out = SideRuns(engine=[EngineRun(status="timeout", error="engine timed out after 300 s")])
    pc = compare_streams("p", "ref", timed_out, "cand", crashed, 0.1)
    assert pc.status == "crashed" and "cand crashed: engine ended while generating (SIGSEGV)" in pc.detail
    pc = compare_streams("p", "ref", timed_out, "cand", side(HELLO), 0.1)
    assert pc.status == "timeout" and pc.detail.startswith("ref timed out")


def test_crashed_completion_is_a_crash() -> None:
    cand = SideRuns(engine=[EngineRun(status="ok", generation=HELLO)], completion=completion(b"", status="crashed"))
    pc = compare_streams("p", "ref", side(HELLO), "cand", cand, 0.1)
    assert pc.status == "crashed" and "llama-completion SIGSEGV" in pc.detail


def test_needs_engine_runs_on_both_sides() -> None:
    with pytest.raises(ValueError):
        compare_streams("p", "ref", SideRuns(engine=[]), "cand", side(HELLO), 0.1)


def test_kl_summary_and_detail() -> None:
    kl = summarize_kl(ScoreResult(positions=4, kl=[0.0, 0.002, 0.01, 0.0], top1=[True, True, False, True]))
    assert kl is not None and kl.positions == 4 and kl.max == 0.01 and kl.max_at == 2
    assert kl.mean == pytest.approx(0.003) and kl.top1_agreement == 0.75
    assert summarize_kl(ScoreResult(positions=3)) is None
    pc = compare_streams("p", "ref", side(HELLO), "cand", side(HELLO), 0.1, kl)
    assert pc.status == "identical" and "top-1 agreement 75.0%" in pc.detail


def test_first_differing_byte() -> None:
    assert first_differing_byte(b"abc", b"abc") is None
    assert first_differing_byte(b"abc", b"abd") == 2
    assert first_differing_byte(b"ab", b"abc") == 2
    assert first_differing_byte("Grüße".encode(), "Grüsse".encode()) == 4  # bytes, not characters


def test_generation_reply_round_trip_and_json() -> None:
    reply = json.loads('{"ok":true,"prompt_tokens":3,"eog":true,"prompt_ms":1.5,"gen_ms":2.5,"tokens":['
                       '{"id":7,"piece":"c3","eog":false,"top":[[7,3.5],[9,3.25]],"lse":4.0},'
                       '{"id":1,"piece":"","eog":true,"top":[[1,8],[7,1]],"lse":8.001}]}')
    g = parse_generation(reply)
    assert g.ids == [7, 1] and g.text == b"\xc3" and g.tokens[0].margin == 0.25 and g.eog
    pc = compare_streams("p", "ref", side(g), "cand", side(g), 0.1)
    json.dumps(to_json(pc))  # partial UTF-8 pieces serialise


# --------------------------------------------------------------------------- what a comparison records and says


def failed(status: str, error_line: str | None = None, seconds: float = 1.0) -> GenerationResult:
    """A llama-completion run that crashed (SIGSEGV) or timed out, with ``error_line`` from its stderr."""
    return replace(completion(b"", status=status), error_line=error_line, seconds=seconds,
                   signal="SIGSEGV" if status == "crashed" else None, returncode=None)


def test_a_divergence_records_both_rows_and_where_the_token_starts_in_the_text() -> None:
    ref = gen(tok(10, "Grü".encode()), tok(11, b","), tok(12, b" world"), end())
    cand = gen(tok(10, "Grü".encode()), tok(11, b","), tok(40, b" wor", top2=12, margin=3.0), tok(41, b"ld"), end())
    div = first_divergence(ref.tokens, cand.tokens, 0.1)
    assert div is not None and div.index == 2
    assert div.text_offset == 4  # "Grü," is 4 characters (5 bytes) before the divergent token
    assert div.reference is not None and div.reference.top == ((12, 10.0), (0, 5.0))
    assert div.candidate is not None and div.candidate.top == ((40, 10.0), (12, 7.0))


def test_a_partial_utf8_piece_at_the_divergence_keeps_its_bytes_and_shows_a_replacement_character() -> None:
    div = first_divergence(gen(tok(20, b"\xc3"), end()).tokens, gen(tok(21, b"\xc3\xa9"), end()).tokens, 0.1)
    assert div is not None and div.reference is not None and div.candidate is not None
    assert div.reference.piece == "\ufffd" and div.reference.piece_hex == "c3"
    assert div.candidate.piece == "é" and div.candidate.piece_hex == "c3a9"


def test_candidate_reaches_n_predict_where_reference_continues() -> None:
    cand = gen(tok(10, b"Hello"), tok(11, b","))  # no end-of-generation token: n_predict reached
    pc = compare_streams("p", "ref", side(HELLO), "cand", side(cand), 0.1)
    div = pc.first_divergence
    assert div is not None and div.index == 2 and div.candidate is None and div.reference is not None
    assert pc.status == "diverged"
    assert pc.detail == ("diverged at generated token 2 (hard divergence): reference ' world' (id 12, margin 5) vs "
                         "candidate end of output (n_predict reached); llama-completion texts differ at byte 6")


def test_a_margin_at_the_near_tie_threshold_is_no_near_tie() -> None:
    ref = gen(tok(10, b"Hello"), tok(11, b",", top2=13, margin=0.5), end())
    cand = gen(tok(10, b"Hello"), tok(13, b"!"), end())
    assert not first_divergence(ref.tokens, cand.tokens, 0.5).near_tie  # below the margin, not at it
    assert first_divergence(ref.tokens, cand.tokens, 0.5001).near_tie


def test_a_near_tie_and_an_end_of_generation_are_described_with_both_tokens() -> None:
    ref = gen(tok(10, b"Hello"), tok(11, b",", top2=13, margin=0.004), tok(12, b" world"), end())
    cand = gen(tok(10, b"Hello"), tok(13, b"!", top2=11, margin=0.003), end())
    pc = compare_streams("p", "ref", side(ref), "cand", side(cand), 0.1)
    assert pc.detail == ("diverged at generated token 1 (near tie): reference ',' (id 11, margin 0.004) vs "
                         "candidate '!' (id 13, margin 0.003); llama-completion texts differ at byte 5")
    pc = compare_streams("p", "ref", side(gen(end(margin=4.0, top2=10))), "cand", side(HELLO), 0.1)
    assert pc.detail == ("diverged at generated token 0 (hard divergence): reference end of generation (id 1, "
                         "margin 4) vs candidate 'Hello' (id 10, margin 5); llama-completion texts differ at byte 0")


def test_a_text_check_counts_each_side_s_bytes() -> None:
    tc = check_texts(completion(b"Hello, world"), completion(b"Help", complete=False))
    assert (tc.reference_bytes, tc.candidate_bytes) == (12, 4)


def test_a_kl_summary_keeps_each_position_unless_all_are_zero() -> None:
    kl = summarize_kl(ScoreResult(positions=4, kl=[0.0, 0.002, 0.01, 0.0], top1=[True, True, False, True]))
    assert kl is not None and kl.per_position == (0.0, 0.002, 0.01, 0.0)
    zero = summarize_kl(ScoreResult(positions=2, kl=[0.0, 0.0], top1=[True, True]))
    assert zero is not None and zero.per_position == () and zero.max == 0.0


def test_a_comparison_names_its_prompt_and_sides_and_keeps_the_kl_summary() -> None:
    kl = summarize_kl(ScoreResult(positions=4, kl=[0.0, 0.002, 0.01, 0.0], top1=[True, True, False, True]))
    pc = compare_streams("p1", "ref", side(HELLO), "cand", side(HELLO), 0.1, kl)
    assert (pc.prompt_id, pc.reference, pc.candidate) == ("p1", "ref", "cand") and pc.kl is kl
    assert pc.detail == "identical; KL mean 0.003 max 0.01 nats, top-1 agreement 75.0%"
    crashed = SideRuns(engine=[EngineRun(status="crashed", error="engine ended (SIGSEGV)")])
    assert compare_streams("p1", "ref", side(HELLO), "cand", crashed, 0.1, kl).kl is None  # a crash is a crash


def test_identical_details_say_how_the_streams_ended() -> None:
    empty = gen(end())
    assert compare_streams("p", "ref", side(empty), "cand", side(empty), 0.1).detail == \
        "identical (both generations end at once)"
    one = gen(tok(10, b"Hello"))  # one token, n_predict 1: no end of generation
    assert compare_streams("p", "ref", side(one), "cand", side(one), 0.1).detail == "identical"
    pc = compare_streams("p", "ref", side(HELLO), "cand", side(HELLO, text=b"Hello", complete=False), 0.1)
    assert pc.detail == "identical; llama-completion text cut at exit on one side: compared as far as it goes"


def test_a_side_without_a_llama_completion_run_has_no_text_check() -> None:
    pc = compare_streams("p", "ref", side(HELLO), "cand", SideRuns(engine=[EngineRun(status="ok", generation=HELLO)]),
                         0.1)
    assert pc.status == "identical" and pc.text_check is None and pc.detail == "identical"


def test_a_completion_text_that_stops_short_of_the_engine_s_or_departs_while_cut_is_nondeterminism() -> None:
    pc = compare_streams("p", "ref", side(HELLO), "cand", side(HELLO, text=b"Hello,"), 0.1)
    assert pc.status == "diverged" and pc.nondeterministic == ["cand"]
    assert "nondeterministic: cand: llama-completion text differs from the engine's at byte 6" in pc.detail
    pc = compare_streams("p", "ref", side(HELLO), "cand", side(HELLO, text=b"Help", complete=False), 0.1)
    assert pc.status == "diverged" and pc.nondeterministic == ["cand"]
    assert "nondeterministic: cand: llama-completion text differs from the engine's at byte 3" in pc.detail


def test_a_failure_detail_names_the_side_the_cause_and_how_many_more_runs_failed() -> None:
    def detail(cand: SideRuns, ref: SideRuns | None = None) -> str:
        return compare_streams("p", "ref", ref or side(HELLO), "cand", cand, 0.1).detail

    ok = [EngineRun(status="ok", generation=HELLO)]
    assert detail(SideRuns(engine=ok, completion=failed("crashed"))) == "cand crashed: llama-completion SIGSEGV"
    assert detail(SideRuns(engine=ok, completion=failed("crashed", "CUDA error: out of memory"))) == \
        "cand crashed: llama-completion SIGSEGV: CUDA error: out of memory"
    assert detail(SideRuns(engine=ok, completion=failed("timeout", seconds=300.4))) == \
        "cand timed out: llama-completion after 300 s"
    two = [EngineRun(status="crashed", error="engine ended (SIGSEGV)"), *ok]
    assert detail(SideRuns(engine=two, completion=failed("crashed"))) == \
        "cand crashed: engine ended (SIGSEGV) (and 1 more runs)"
    three = [EngineRun(status="crashed", error="engine ended (SIGABRT)"), *two]
    assert detail(SideRuns(engine=three, completion=failed("crashed"))) == \
        "cand crashed: engine ended (SIGABRT) (and 2 more runs)"
    assert detail(SideRuns(engine=ok, completion=failed("crashed")), SideRuns(engine=two)) == \
        "ref crashed: engine ended (SIGSEGV); cand crashed: llama-completion SIGSEGV"


def test_an_empty_side_is_refused_by_its_prompt() -> None:
    with pytest.raises(ValueError, match="^prompt 'p7': each side needs at least one engine run$"):
        compare_streams("p7", "ref", side(HELLO), "cand", SideRuns(engine=[]), 0.1)


def test_an_engine_run_that_did_not_fail_must_have_its_generation() -> None:
    with pytest.raises(AssertionError):
        compare_streams("p", "ref", side(HELLO), "cand", SideRuns(engine=[EngineRun(status="ok")]), 0.1)


def test_a_crash_carries_no_kl_or_agreement_figures() -> None:
    # the engine scored what the crashed side generated before it ended: 0 nats, all top-1 agreeing
    kl = summarize_kl(ScoreResult(positions=2, kl=[0.0, 0.0], top1=[True, True]))
    cand = SideRuns(engine=[EngineRun(status="ok", generation=HELLO)], completion=completion(b"", status="crashed"))
    pc = compare_streams("p", "ref", side(HELLO), "cand", cand, 0.1, kl)
    assert pc.status == "crashed" and pc.kl is None
    assert "KL" not in pc.detail and "top-1" not in pc.detail
