"""Whether a generation fits its context: a prompt's tokens plus ``n_predict`` within ``ctx_size``.

The rule is the one the programs apply.  The engine (harness/stages/outputs/engine/engine.cpp,
``generate``) refuses a prompt whose tokens plus ``n_predict`` exceed its context, and
llama-completion refuses a prompt longer than its context minus 4 tokens
(tools/completion/completion.cpp, "prompt is too long"); both contexts are ``ctx_size``
rounded up to a multiple of 256 (src/llama-context.cpp, ``GGML_PAD(cparams.n_ctx, 256)``).
So a generation fits when ``tokens + max(n_predict, 4) <= pad256(ctx_size)``.

The prompt's tokens are known exactly only from the model's own tokenizer, which needs a
build.  Before one, they are bounded from the prompt's bytes and the model's vocabulary
(:func:`fewest_prompt_tokens`, :func:`most_prompt_tokens`): a lower bound that already does not fit is refused before
anything runs, an upper bound that fits needs no tokenizer at all, and only what lies
between is tokenized after the build (harness.stages.outputs.refusals, with the build's llama-tokenize).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from ..common.errors import InputError
from .selection import Selection

#: llama.cpp pads the context to a multiple of this many tokens (src/llama-context.cpp).
CONTEXT_PADDING = 256

#: Tokens of the context llama-completion keeps free after the prompt (tools/completion/completion.cpp,
#: ``embd_inp.size() > n_ctx - 4``).
COMPLETION_FREE = 4

#: Tokens a prompt can have beyond one per byte: the space SentencePiece vocabularies put before the
#: text (llama-vocab.cpp, ``add_space_prefix``), and the BOS and EOS tokens a vocabulary may add.
TOKENS_BEYOND_BYTES = 3

#: Tokenizer models (GGUF ``tokenizer.ggml.model``) whose every token covers at most as many bytes of
#: the text as its own piece has: SentencePiece (``llama``: a text space is the 3-byte "▁" in the
#: piece, a byte-fallback token ``<0xNN>`` covers one byte) and byte-level BPE (``gpt2``: each text
#: byte is one or two bytes of the piece).  Special tokens the prompt spells out cover exactly their
#: piece.  Other models normalise the text first (accents stripped, characters folded), so a token
#: may cover more bytes than its piece: they get no vocabulary bound.
PIECE_COVERING_TOKENIZERS = frozenset({"llama", "gpt2"})


def context_tokens(ctx_size: int) -> int:
    """The context in tokens that llama.cpp makes of ``ctx_size``: rounded up to a multiple of
    :data:`CONTEXT_PADDING`."""
    return -(-ctx_size // CONTEXT_PADDING) * CONTEXT_PADDING


def fits(prompt_tokens: int, n_predict: int, ctx_size: int) -> bool:
    """Whether a prompt of ``prompt_tokens`` and ``n_predict`` generated tokens fit a context of
    ``ctx_size`` tokens for both the engine and llama-completion (the module docstring's rule)."""
    return prompt_tokens + max(n_predict, COMPLETION_FREE) <= context_tokens(ctx_size)


@dataclass(frozen=True)
class Vocabulary:
    """What the token bounds need of a model's vocabulary: its ``tokenizer`` model (GGUF
    ``tokenizer.ggml.model``, None when absent) and the bytes of its longest token piece (0: none)."""

    tokenizer: str | None
    longest_token_bytes: int


def most_prompt_tokens(text: str) -> int:
    """The most tokens ``text`` (UTF-8) can be for any model, BOS and EOS included: one per byte plus
    :data:`TOKENS_BEYOND_BYTES` (every tokenizer of llama.cpp covers each byte with at most one token:
    byte-level BPE and SentencePiece's byte fallback have a token per byte, an unknown character
    becomes one token)."""
    return len(text.encode("utf-8", "surrogateescape")) + TOKENS_BEYOND_BYTES


def fewest_prompt_tokens(text: str, vocabulary: Vocabulary | None) -> int:
    """The fewest tokens ``text`` (UTF-8) can be for a model with ``vocabulary`` (None: unknown): 1 (the
    engine refuses an empty token list), or for a tokenizer of :data:`PIECE_COVERING_TOKENIZERS` the
    text's bytes divided by the longest piece's bytes, rounded up, since no token covers more bytes
    than that."""
    size = len(text.encode("utf-8", "surrogateescape"))
    if vocabulary is None or vocabulary.tokenizer not in PIECE_COVERING_TOKENIZERS \
            or vocabulary.longest_token_bytes <= 0:
        return 1
    return max(1, -(-size // vocabulary.longest_token_bytes))


@dataclass(frozen=True)
class PlannedGeneration:
    """One prompt a run generates from: ``group``, ``model``, ``prompt`` (id) and its ``text``,
    ``n_predict`` tokens (``from_flag``: given with --n-predict, else the group's in ``matrix``)
    in a context of ``ctx_size`` tokens."""

    group: str
    model: str
    prompt: str
    text: str
    n_predict: int
    ctx_size: int
    from_flag: bool
    matrix: str

    def refusal(self, tokens: int, exact: bool) -> str:
        """The one line that says this generation does not fit with a prompt of ``tokens`` tokens
        (``exact``: counted by the model's tokenizer, else a lower bound), and how much would."""
        what = f"--n-predict {self.n_predict}" if self.from_flag else \
            f"n_predict {self.n_predict} of group {self.group} ({self.matrix})"
        n_ctx = context_tokens(self.ctx_size)
        ctx = f"ctx_size {self.ctx_size}" + (f" ({n_ctx} tokens once llama.cpp rounds it up to a multiple of "
                                             f"{CONTEXT_PADDING})" if n_ctx != self.ctx_size else "")
        count = f"{tokens} tokens" if exact else f"at least {tokens} token{'s' if tokens != 1 else ''}"
        room = n_ctx - tokens
        advice = (f"at most {room} tokens can be generated after it" if room >= COMPLETION_FREE else
                  f"it leaves fewer than the {COMPLETION_FREE} free tokens llama-completion needs")
        return f"{what} does not fit {ctx} with prompt {self.prompt} ({count} of {self.model}): {advice}"


def selected_generations(selection: Selection, n_predict: int | None) -> list[PlannedGeneration]:
    """Every prompt that compare-outputs would generate from in ``selection`` (its platforms, groups with a
    selected model, models and prompts: harness.matrix.selection), with ``n_predict`` (the --n-predict
    option, None: each group's); one entry per group, model and prompt."""
    matrix = selection.matrix
    out: dict[tuple[str, str, str], PlannedGeneration] = {}
    for pname in selection.platform_names():
        for gname in selection.groups_with_models(pname):
            group = matrix.groups[gname]
            for model in selection.model_names(gname):
                for pid in selection.prompt_names(gname):
                    out.setdefault((gname, model, pid), PlannedGeneration(
                        gname, model, pid, matrix.prompts[pid].text, n_predict or group.generation.n_predict,
                        group.generation.ctx_size, n_predict is not None, str(matrix.path)))
    return list(out.values())


def refuse_unfit(generations: Iterable[PlannedGeneration], vocabulary: Callable[[str], Vocabulary | None],
                 count: Callable[[PlannedGeneration], int | None] | None = None) -> list[PlannedGeneration]:
    """Raise InputError naming the first of ``generations`` that cannot fit (and how many more do not).

    ``vocabulary``: model name -> its :class:`Vocabulary` (None: unknown), asked only for a generation
    whose prompt's most tokens do not fit.  Without ``count`` (before a build) a generation is refused
    when even the fewest tokens its prompt can be do not fit; with ``count`` (generation -> the prompt's
    exact tokens by the model's tokenizer; None: they could not be counted, and the generation runs)
    every generation the bounds leave open is counted.  Returns the generations still open: those whose
    most tokens do not fit and that were not counted (none when ``count`` is given).
    """
    refused: list[str] = []
    open_: list[PlannedGeneration] = []
    for gen in generations:
        if fits(most_prompt_tokens(gen.text), gen.n_predict, gen.ctx_size):
            continue  # whatever the tokenizer: no model file read, nothing tokenized
        low = fewest_prompt_tokens(gen.text, vocabulary(gen.model))
        if not fits(low, gen.n_predict, gen.ctx_size):
            refused.append(gen.refusal(low, exact=False))
        elif count is None:
            open_.append(gen)
        else:
            tokens = count(gen)
            if tokens is not None and not fits(tokens, gen.n_predict, gen.ctx_size):
                refused.append(gen.refusal(tokens, exact=True))
    if refused:
        more = len(refused) - 1
        raise InputError(refused[0] + (f"; {more} more prompt{'s' if more > 1 else ''} do{'es' if more == 1 else ''} "
                                       "not fit either" if more else ""))
    return open_


def vocabulary_of(summary: Mapping[str, object] | None) -> Vocabulary | None:
    """The :class:`Vocabulary` in a model summary (harness.matrix.models.model_summary), None without one."""
    if not summary:
        return None
    tokenizer = summary.get("tokenizer_model")
    longest = summary.get("longest_token_bytes")
    return Vocabulary(tokenizer if isinstance(tokenizer, str) else None, longest if isinstance(longest, int) else 0)
