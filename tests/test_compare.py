"""Tests of harness.stages.outputs.compare: divergence finding, run comparison and running llama-completion."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.stages.outputs.compare import (
    Divergence,
    GenerationResult,
    GenerationSpec,
    Token,
    TokenizeError,
    compare_runs,
    completion_argv,
    find_error_line,
    first_divergence,
    parse_token_ids,
    parse_token_pieces,
    run_generation,
    split_completion_stdout,
    to_json,
    tokenize,
)


def toks(*pairs: tuple[int, str]) -> list[Token]:
    return [Token(id=i, piece=p) for i, p in pairs]


# --- first_divergence -------------------------------------------------------


def test_first_divergence_same_sequences() -> None:
    seq = toks((10, "a"), (11, " b"), (12, " c"))
    assert first_divergence(seq, list(seq)) is None


def test_first_divergence_in_the_middle() -> None:
    ref = toks((10, "a"), (11, " b"), (12, " c"), (13, " d"))
    cand = toks((10, "a"), (11, " b"), (99, " x"), (13, " d"))
    assert first_divergence(ref, cand) == Divergence(2, Token(12, " c"), Token(99, " x"))


def test_first_divergence_decided_by_id_not_piece() -> None:
    ref = toks((10, "a"), (11, " b"))
    cand = toks((10, "a"), (12, " b"))
    assert first_divergence(ref, cand) == Divergence(1, Token(11, " b"), Token(12, " b"))
    same_ids = toks((10, "A"), (11, "B"))
    assert first_divergence(ref, same_ids) is None


def test_first_divergence_candidate_is_prefix() -> None:
    ref = toks((10, "a"), (11, " b"), (12, " c"))
    cand = ref[:2]
    assert first_divergence(ref, cand) == Divergence(2, Token(12, " c"), None)


def test_first_divergence_reference_is_prefix() -> None:
    cand = toks((10, "a"), (11, " b"), (12, " c"))
    assert first_divergence(cand[:1], cand) == Divergence(1, None, Token(11, " b"))


def test_first_divergence_empty_sides() -> None:
    assert first_divergence([], []) is None
    assert first_divergence([], toks((5, "x"))) == Divergence(0, None, Token(5, "x"))
    assert first_divergence(toks((5, "x")), []) == Divergence(0, Token(5, "x"), None)


# --- compare_runs ------------------------------------------------------------


def result(status: str = "ok", text: bytes = b"", *, returncode: int | None = 0,
           sig: str | None = None, error_line: str | None = None,
           seconds: float = 1.0) -> GenerationResult:
    return GenerationResult(
        status=status, text=text, returncode=returncode, signal=sig,  # type: ignore[arg-type]
        error_line=error_line, seconds=seconds, stdout_path=Path("x.stdout"),
        stderr_path=Path("x.stderr"), argv=["llama-completion"],
    )


class WordTokenizer:
    """Splits text into words with their leading whitespace; ids come from first sight."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.calls = 0

    def __call__(self, text: bytes) -> list[Token]:
        self.calls += 1
        pieces = re.findall(r"\s*\S+|\s+", text.decode("utf-8", "surrogateescape"))
        return [Token(self.vocab.setdefault(p, 100 + len(self.vocab)), p) for p in pieces]


def no_tokenize(text: bytes) -> list[Token]:
    raise AssertionError("identical texts must not be tokenized")


def test_compare_runs_identical_without_tokenizing() -> None:
    text = "Grüße aus Köln".encode()
    cmp = compare_runs("p1", "base", [result(text=text)] * 2, "pinned", [result(text=text)] * 2,
                       no_tokenize)
    assert cmp.status == "identical"
    assert cmp.first_divergence is None
    assert cmp.nondeterministic == []
    assert (cmp.prompt_id, cmp.reference, cmp.candidate) == ("p1", "base", "pinned")
    assert cmp.reference_text == cmp.candidate_text == text


def test_compare_runs_diverged_reports_token_index_and_tokens() -> None:
    tok = WordTokenizer()
    ref = b"The cat sat on the mat"
    cand = b"The cat sat on a mat"
    cmp = compare_runs("p1", "base", [result(text=ref)] * 2, "pinned", [result(text=cand)] * 2, tok)
    assert cmp.status == "diverged"
    div = cmp.first_divergence
    assert div is not None
    assert div.index == 4
    assert div.reference == Token(tok.vocab[" the"], " the")
    assert div.candidate == Token(tok.vocab[" a"], " a")
    assert cmp.detail == (
        f"diverged at token 4: ' the' (id {tok.vocab[' the']}) vs ' a' (id {tok.vocab[' a']})"
    )
    assert cmp.candidate_text == cand


def test_compare_runs_diverged_when_candidate_stops_early() -> None:
    tok = WordTokenizer()
    cmp = compare_runs("p", "base", [result(text=b"one two three")], "cand",
                       [result(text=b"one two")], tok)
    assert cmp.status == "diverged"
    assert cmp.first_divergence == Divergence(2, Token(tok.vocab[" three"], " three"), None)
    assert cmp.detail.endswith("vs end of output")


def test_compare_runs_candidate_crash_with_signal() -> None:
    crashed = result("crashed", b"The cat", returncode=-11, sig="SIGSEGV")
    cmp = compare_runs("p", "base", [result(text=b"The cat sat")] * 2, "pinned",
                       [result(text=b"The cat sat"), crashed], no_tokenize)
    assert cmp.status == "crashed"
    assert cmp.first_divergence is None
    assert cmp.detail == "candidate crashed in 1 of 2 repeats: SIGSEGV"


def test_compare_runs_crash_wins_over_timeout_and_names_error_line() -> None:
    timed_out = result("timeout", b"", returncode=None, seconds=300.2)
    crashed = result("crashed", returncode=1, error_line="error: failed to load model")
    cmp = compare_runs("p", "base", [timed_out], "pinned", [crashed], no_tokenize)
    assert cmp.status == "crashed"
    assert cmp.detail == "candidate crashed: exit code 1: error: failed to load model"


def test_compare_runs_reference_timeout() -> None:
    timed_out = result("timeout", b"partial", returncode=None, seconds=300.4)
    cmp = compare_runs("p", "base", [timed_out], "pinned", [result(text=b"x")], no_tokenize)
    assert cmp.status == "timeout"
    assert cmp.detail == "reference timed out after 300 s"


def test_compare_runs_nondeterministic_reference_is_never_identical() -> None:
    tok = WordTokenizer()
    ref_runs = [result(text=b"a b c"), result(text=b"a b d")]
    same = compare_runs("p", "base", ref_runs, "pinned", [result(text=b"a b c")] * 2, tok)
    assert same.status == "diverged"
    assert same.nondeterministic == ["base"]
    assert "nondeterministic: base" in same.detail and "reference repeat 2" in same.detail
    assert same.first_divergence is not None and same.first_divergence.index == 2

    differs = compare_runs("p", "base", ref_runs, "pinned", [result(text=b"a x c")] * 2, tok)
    assert differs.status == "diverged"
    assert differs.nondeterministic == ["base"]
    assert differs.first_divergence is not None and differs.first_divergence.index == 1


def test_compare_runs_candidate_that_varies_between_repeats_diverges() -> None:
    tok = WordTokenizer()
    ref_runs = [result(text=b"hello world")] * 2
    cand_runs = [result(text=b"hello world"), result(text=b"hello there")]
    cmp = compare_runs("p", "base", ref_runs, "fork", cand_runs, tok)
    assert cmp.status == "diverged"
    assert cmp.nondeterministic == ["fork"]
    assert cmp.first_divergence is not None and cmp.first_divergence.index == 1
    assert cmp.first_divergence.candidate.piece == " there"
    assert "candidate repeat 2" in cmp.detail


def test_compare_runs_needs_runs_on_both_sides() -> None:
    with pytest.raises(ValueError, match="p7"):
        compare_runs("p7", "base", [], "pinned", [result()], no_tokenize)


def test_to_json_is_serialisable_with_bytes_and_partial_pieces() -> None:
    piece = b"\xe2\x80".decode("utf-8", "surrogateescape")
    cmp = compare_runs("p", "a", [result(text=b"x\xe2\x80")], "b", [result(text=b"y")],
                       lambda t: [Token(1 if t.startswith(b"x") else 2, piece)])
    data = json.loads(json.dumps(to_json(cmp)))
    assert data["reference_text"] == "x\ufffd"
    assert data["first_divergence"]["reference"] == {"id": 1, "piece": "\ufffd"}
    assert data["status"] == "diverged"


# --- stdout / tokenize output parsing ----------------------------------------


def test_split_completion_stdout() -> None:
    assert split_completion_stdout(b"Hello\n there\n\n") == (b"Hello\n there", False, True)
    assert split_completion_stdout(b"Hi. [end of text]\n\n\n") == (b"Hi.", True, True)
    # a generated trailing newline is kept: only the trailer itself is removed
    assert split_completion_stdout(b"ends in newline\n\n\n") == (b"ends in newline\n", False, True)
    # no trailer: the logger may have lost the tail at exit, so the text may be cut
    assert split_completion_stdout(b"cut off") == (b"cut off", False, False)
    assert split_completion_stdout(b"a [end of text] b\n\n") == (b"a [end of text] b", False, True)
    assert split_completion_stdout(b" [end of text]\n\n\n") == (b"", True, True)  # ended at once
    # trailer lost at exit: the marker, written after every piece, still proves the text whole
    assert split_completion_stdout(b"Hi. [end of text]\n") == (b"Hi.", True, True)


def test_parse_token_ids() -> None:
    assert parse_token_ids(b"[2, 9259, 236764]\n") == [2, 9259, 236764]
    assert parse_token_ids(b"[]\n") == []
    with pytest.raises(TokenizeError):
        parse_token_ids(b"error: nope\n")


def test_parse_token_pieces_with_quotes_and_newlines() -> None:
    out = (b"   818 -> 'It'\n"
           b"236789 -> '''\n"
           b"   236 -> '\n"
           b"'\n"
           b"   563 -> ' \xc3'\n")
    tokens = parse_token_pieces(out, [818, 236789, 236, 563])
    assert [t.id for t in tokens] == [818, 236789, 236, 563]
    assert [t.piece.encode("utf-8", "surrogateescape") for t in tokens] == [
        b"It", b"'", b"\n", b" \xc3"]
    with pytest.raises(TokenizeError):
        parse_token_pieces(out, [818, 236789, 236])


def test_find_error_line_takes_last_match() -> None:
    err = (b"llama_model_loader: loaded meta data\n"
           b"ggml_cuda_init: failed to initialize CUDA: no device\n"
           b"/src/ggml-cuda.cu:88: CUDA error: invalid argument\n"
           b"llama_perf_context_print: total time = 5 ms\n")
    assert find_error_line(err) == "/src/ggml-cuda.cu:88: CUDA error: invalid argument"
    assert find_error_line(b"print_info: n_ctx = 1024\n") is None


def test_completion_argv_puts_configuration_args_last() -> None:
    spec = GenerationSpec(binary=Path("/b/llama-completion"), model=Path("/m.gguf"), prompt="x",
                          n_predict=7, seed=3, ctx_size=256, args=("--load-mode", "none"))
    argv = completion_argv(spec, Path("/tmp/p.txt"))
    assert argv[0] == "/b/llama-completion"
    assert argv[-2:] == ["--load-mode", "none"]
    assert "-t" not in argv
    for flag, value in (("-m", "/m.gguf"), ("-f", "/tmp/p.txt"), ("-n", "7"), ("-c", "256"),
                        ("--seed", "3"), ("--temp", "0")):
        assert argv[argv.index(flag) + 1] == value
    assert {"-no-cnv", "--no-display-prompt", "--no-escape", "--simple-io"} <= set(argv)
    spec.threads = 2
    argv = completion_argv(spec, Path("/tmp/p.txt"))
    assert argv[argv.index("-t") + 1] == "2"


# --- run_generation against fake executables ----------------------------------


def write_script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


ECHO = """
import os, sys
args = sys.argv[1:]
data = open(args[args.index("-f") + 1], "rb").read()
if data.endswith(b"\\n"):  # common/arg.cpp drops one trailing newline of -f
    data = data[:-1]
sys.stderr.write("llama_model_loader: loaded meta data\\n")
out = sys.stdout.buffer
out.write(data + b"|" + os.environ.get("FAKE_SUFFIX", "").encode())
if "--fake-eog" in args:
    out.write(b" [end of text]\\n")
out.write(b"\\n\\n")
"""


def spec_for(binary: Path, **kw: object) -> GenerationSpec:
    return GenerationSpec(binary=binary, model=Path("/nonexistent/model.gguf"),
                          prompt=kw.pop("prompt", "hello"), **kw)  # type: ignore[arg-type]


def test_run_generation_ok_passes_prompt_bytes_env_and_args(tmp_path: Path) -> None:
    binary = write_script(tmp_path, "echo-completion", ECHO)
    prompt = "Grüße aus Köln —\nwie geht's? \\n\n"
    spec = spec_for(binary, prompt=prompt, env={"FAKE_SUFFIX": "env-ok"}, args=("--fake-eog",))
    res = run_generation(spec, tmp_path / "logs" / "run1")
    assert res.status == "ok"
    assert res.returncode == 0 and res.signal is None and res.error_line is None
    assert res.text == prompt.encode() + b"|env-ok"
    assert res.stopped_at_eog is True
    assert res.stdout_path.read_bytes().endswith(b" [end of text]\n\n\n")
    assert b"loaded meta data" in res.stderr_path.read_bytes()
    cmd = json.loads((tmp_path / "logs" / "run1.cmd").read_text())
    assert cmd["argv"] == res.argv and cmd["argv"][0] == str(binary)
    assert cmd["env"] == {"FAKE_SUFFIX": "env-ok"}
    assert res.seconds > 0


def test_run_generation_without_trailer_is_ok_and_keeps_the_text(tmp_path: Path) -> None:
    # the asynchronous logger of llama-completion may lose its last entries at exit
    binary = write_script(tmp_path, "short", "import sys\nsys.stdout.write('half a sent\\n')\n")
    res = run_generation(spec_for(binary), tmp_path / "short")
    assert res.status == "ok"
    assert res.returncode == 0
    assert res.text == b"half a sent\n" and res.complete is False
    assert res.error_line is None


def test_run_generation_segfault(tmp_path: Path) -> None:
    binary = write_script(tmp_path, "segv", """
        import os, signal, sys
        sys.stdout.write("The cat"); sys.stdout.flush()
        sys.stderr.write("load: error reading header, retrying\\n")
        sys.stderr.write("/src/ggml/ggml.c:1234: GGML_ASSERT(ne >= 0) failed\\n")
        sys.stderr.write("ggml_backend: backtrace follows\\n"); sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    """)
    res = run_generation(spec_for(binary), tmp_path / "segv")
    assert res.status == "crashed"
    assert res.signal == "SIGSEGV"
    assert res.returncode == -signal.SIGSEGV
    assert res.error_line == "/src/ggml/ggml.c:1234: GGML_ASSERT(ne >= 0) failed"
    assert res.text == b"The cat"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_run_generation_timeout_kills_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    binary = write_script(tmp_path, "slow", f"""
        import subprocess, sys, time
        child = subprocess.Popen(["sleep", "60"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        sys.stdout.write("partial"); sys.stdout.flush()
        time.sleep(60)
    """)
    start = time.monotonic()
    res = run_generation(spec_for(binary, timeout_s=1.0), tmp_path / "slow")
    assert time.monotonic() - start < 20
    assert res.status == "timeout"
    assert res.returncode is None and res.signal is None
    assert 1.0 <= res.seconds < 20
    assert res.text == b"partial"
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_run_generation_error_exit(tmp_path: Path) -> None:
    binary = write_script(tmp_path, "fails", """
        import sys
        sys.stderr.write("llama_model_load: error loading model: file not found\\n")
        sys.stderr.write("main: error: unable to load model\\n")
        sys.stderr.write("llama_backend_free: done\\n")
        sys.exit(1)
    """)
    res = run_generation(spec_for(binary), tmp_path / "fails")
    assert res.status == "crashed"
    assert res.returncode == 1 and res.signal is None
    assert res.error_line == "main: error: unable to load model"
    assert "unable to load model" in res.stderr_path.read_text()
    assert res.stdout_path.read_bytes() == b""


# --- real binaries -------------------------------------------------------------


@pytest.mark.slow
def test_real_greedy_runs_are_repeatable_and_tokenize_round_trips(tmp_path: Path) -> None:
    bin_dir = os.environ.get("HARNESS_TEST_LLAMA_BIN_DIR")
    model = os.environ.get("HARNESS_TEST_MODEL")
    if not bin_dir or not model:
        pytest.skip("set HARNESS_TEST_LLAMA_BIN_DIR and HARNESS_TEST_MODEL to run")
    completion = Path(bin_dir) / "llama-completion"
    tokenizer = Path(bin_dir) / "llama-tokenize"
    prompts = {
        "capital": "The capital of France is",
        "german": "Grüße aus Köln —\nwie geht's?",
        "list": "Three facts about the moon:\n1.",
    }
    for prompt_id, prompt in prompts.items():
        runs = []
        for repeat in range(2):
            spec = GenerationSpec(binary=completion, model=Path(model), prompt=prompt,
                                  n_predict=24, threads=2, timeout_s=300)
            res = run_generation(spec, tmp_path / f"{prompt_id}-{repeat}")
            assert res.status == "ok", (res.error_line, res.stderr_path.read_text()[-2000:])
            runs.append(res)
        assert runs[0].text, f"{prompt_id}: nothing generated"

        def tok(text: bytes) -> list[Token]:
            return tokenize(tokenizer, Path(model), text, tmp_path / "tok")

        cmp = compare_runs(prompt_id, "first", runs[:1], "second", runs[1:], tok)
        assert cmp.status == "identical", cmp.detail
        for text in (runs[0].text, prompt.encode()):
            tokens = tok(text)
            assert tokens
            joined = "".join(t.piece for t in tokens).encode("utf-8", "surrogateescape")
            assert joined == text


def test_run_generation_that_ends_at_once_is_a_valid_empty_generation(tmp_path: Path) -> None:
    binary = write_script(tmp_path, "silent", "import sys\nsys.stdout.write(' [end of text]\\n\\n\\n')\n")
    res = run_generation(spec_for(binary), tmp_path / "silent")
    assert res.status == "ok" and res.stopped_at_eog and res.complete
    assert res.returncode == 0 and res.text == b""
