"""README.md and docs/ kept true: their shell blocks parse, their nox sessions exist,
their links resolve and the repository paths they name exist (results/README.md and
results/evidence/README.md are held to the same).

The pages are read with markdown-it-py (CommonMark plus tables, as GitHub renders
them).  What is checked, per page:

- every fenced ``sh`` (``bash``, ``shell``) block parses with ``bash -n``;
- every ``nox -s NAME ...`` shown, in prose, tables or blocks, names sessions that
  ``noxfile.py`` defines (as ``nox --list`` lists them);
- every relative link resolves to a file or directory of the checkout, and an
  ``#anchor`` to a heading of the Markdown page it points into (GitHub's heading ids);
- every path of the repository named in a code span or a shell block exists: a word
  whose first component is a top-level entry of the checkout (``harness/...``,
  ``.ci/run``, ``results/evidence/``) must be a file or directory there, unless git
  ignores it (``results/latest``, ``.harness/...``: what a run writes).  Words holding
  a placeholder (``<run-id>``, ``*``, ``…``) are not paths.

The README's bisect example is run as written by tests/test_readme_bisect.py.
"""

from __future__ import annotations

import posixpath
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[1]

#: Info strings of the fenced blocks that are shell commands.
SHELL_FENCES = ("sh", "bash", "shell")

#: ``nox -s`` and what follows it up to a code span's end, a comment, a shell operator, a closing
#: parenthesis or an escaped pipe.
NOX_COMMAND = re.compile(r"\bnox\s+(?:-s|--sessions?)\s+([^`#;&|)\\\n]*)")

#: Characters that make a word a placeholder or a pattern rather than a path.
NOT_A_PATH = re.compile(r"[\s<>*…{}$|\[\]=:?\"'()]")


def doc_pages(root: Path = ROOT) -> dict[str, str]:
    """README.md, every ``docs/*.md`` and the results READMEs of ``root`` as {path relative to root: text}."""
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md")),
             root / "results" / "README.md", root / "results" / "evidence" / "README.md"]
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in pages}


def parse(text: str) -> list[Token]:
    """The block tokens of a Markdown text (CommonMark with tables, as GitHub reads it)."""
    return MarkdownIt("commonmark").enable("table").parse(text)


def line_of(token: Token, content: str, offset: int) -> int:
    """The 1-based line of ``offset`` into ``content``, the text of block ``token``."""
    start = token.map[0] if token.map else 0
    if token.type == "fence":
        start += 1  # the content starts after the opening fence
    return start + 1 + content.count("\n", 0, offset)


def heading_text(inline: Token) -> str:
    """A heading's text as rendered (code spans without their backticks, links without targets)."""
    return "".join(c.content for c in inline.children or () if c.type in ("text", "code_inline"))


def github_slug(text: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@cache
def anchors(text: str) -> frozenset[str]:
    """Every heading id of a Markdown text; a repeated heading gets ``-1``, ``-2``, … as on GitHub.  Kept per text:
    a page is linked from many places, and every check of the pages reads the same ones again."""
    seen: dict[str, int] = {}
    ids = set()
    tokens = parse(text)
    for i, tok in enumerate(tokens):
        if tok.type != "heading_open":
            continue
        slug = github_slug(heading_text(tokens[i + 1]))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(ids)


@cache
def nox_sessions(root: Path = ROOT) -> frozenset[str]:
    """The session names of ``root/noxfile.py``, as ``nox --list`` lists them.

    nox marks each session line ``* NAME -> …`` (selected by default) or ``- NAME -> …``
    after a ``Sessions defined in …`` line; ``--json`` lists the default sessions only.
    Raises CalledProcessError when nox cannot read the noxfile.
    """
    nox = shutil.which("nox", path=str(Path(sys.executable).parent)) or shutil.which("nox")
    assert nox, "nox is in requirements.txt"
    out = subprocess.run([nox, "--list", "-f", str(root / "noxfile.py")], cwd=root,
                         check=True, capture_output=True, text=True).stdout
    listing = out.split("Sessions defined in", 1)[1]
    return frozenset(re.findall(r"^[*-] (\S+)(?: -> |$)", listing, re.M))


@cache
def checkout_entries(root: Path = ROOT) -> tuple[frozenset[str], frozenset[str]]:
    """(files, directories) of the checkout that git tracks or would add, relative to ``root``."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                         cwd=root, check=True, capture_output=True, text=True).stdout
    files = frozenset(f for f in out.split("\0") if f)
    dirs = frozenset(str(Path(f).parents[i].as_posix()) for f in files for i in range(len(Path(f).parts) - 1))
    return files, dirs


@cache
def top_entries(root: Path = ROOT) -> frozenset[str]:
    """The first path components of :func:`checkout_entries`' files: the checkout's top-level entries."""
    return frozenset(f.split("/", 1)[0] for f in checkout_entries(root)[0])


def git_ignored(root: Path, paths: list[str]) -> set[str]:
    """Those of ``paths`` (relative to ``root``) that git ignores: outputs a run writes."""
    if not paths:
        return set()
    done = subprocess.run(["git", "check-ignore", "--no-index", "--stdin", "-z"], cwd=root,
                          input="\0".join(paths) + "\0", capture_output=True, text=True)
    return {p for p in done.stdout.split("\0") if p}


def code_words(tokens: list[Token]):
    """Yield (token, content, offset, word) for every word of a code span or a shell block."""
    for tok in tokens:
        if tok.type == "inline":
            pos = 0
            for child in tok.children or ():
                if child.type == "code_inline":
                    pos = max(tok.content.find(child.content, pos), 0)
                    for m in re.finditer(r"\S+", child.content):
                        yield tok, tok.content, pos + m.start(), m.group()
        elif tok.type == "fence" and tok.info.strip() in SHELL_FENCES:
            for m in re.finditer(r"\S+", tok.content):
                yield tok, tok.content, m.start(), m.group()


def session_problems(name: str, tokens: list[Token], sessions: frozenset[str]) -> list[str]:
    """``path:line`` problems for every ``nox -s NAME`` of a page whose NAME is not in ``sessions``."""
    problems = []
    for tok in tokens:
        content = tok.content if tok.type in ("inline", "fence", "code_block") else ""
        for m in NOX_COMMAND.finditer(content):
            for word in m.group(1).split():
                if word.startswith(("-", "[")):
                    break  # the session names end where nox's options or the posargs start
                if word not in sessions:
                    problems.append(f"{name}:{line_of(tok, content, m.start())}: nox session {word!r} "
                                    f"is not in noxfile.py")
    return problems


def shell_problems(name: str, tokens: list[Token]) -> list[str]:
    """``path:line`` problems for every shell block of a page that ``bash -n`` refuses."""
    problems = []
    for tok in tokens:
        if tok.type == "fence" and tok.info.strip() in SHELL_FENCES:
            done = subprocess.run(["bash", "-n"], input=tok.content, capture_output=True, text=True)
            if done.returncode:
                problems.append(f"{name}:{line_of(tok, tok.content, 0)}: sh block does not parse: "
                                f"{done.stderr.strip()}")
    return problems


def link_problems(name: str, tokens: list[Token], pages: dict[str, str], root: Path) -> list[str]:
    """``path:line`` problems for every relative link of page ``name`` whose file or ``#anchor`` is missing.

    A target is looked up in ``pages`` first, then in the checkout; absolute URLs are not fetched.
    """
    files, dirs = checkout_entries(root)
    problems = []
    for tok in tokens:
        for child in tok.children or () if tok.type == "inline" else ():
            href = child.attrs.get("href") if child.type == "link_open" else None
            if not href or re.match(r"[a-z][a-z0-9+.-]*:", href):
                continue
            target, _, anchor = href.partition("#")
            where = f"{name}:{line_of(tok, tok.content, max(tok.content.find(href), 0))}: link {href!r}"
            rel = posixpath.normpath(posixpath.join(posixpath.dirname(name), target)) if target else name
            if rel == ".." or rel.startswith("../"):
                problems.append(f"{where} leaves the repository")
            elif rel not in pages and rel not in files and rel not in dirs:
                problems.append(f"{where}: {rel} does not exist")
            elif anchor and rel.endswith(".md"):
                text = pages[rel] if rel in pages else (root / rel).read_text(encoding="utf-8")
                if anchor not in anchors(text):
                    problems.append(f"{where}: {rel} has no heading #{anchor}")
    return problems


def path_problems(name: str, tokens: list[Token], pages: dict[str, str], root: Path) -> list[str]:
    """``path:line`` problems for every repository path a page names (code spans, shell blocks) that is missing.

    A word is a repository path when it holds a ``/`` and its first component is a top-level
    entry of the checkout; one git ignores is something a run writes and is not missing.
    """
    files, dirs = checkout_entries(root)
    top = top_entries(root)
    named = []
    for tok, content, offset, word in code_words(tokens):
        path = word.rstrip(".,;").rstrip("/")
        if NOT_A_PATH.search(path) or path.startswith("-") or "/" not in path:
            continue
        if Path(path).parts[0] in top and path not in files and path not in dirs and path not in pages:
            named.append((line_of(tok, content, offset), path))
    ignored = git_ignored(root, sorted({p for _, p in named}))
    return [f"{name}:{line}: path {path} does not exist" for line, path in named if path not in ignored]


def doc_problems(pages: dict[str, str], root: Path = ROOT) -> list[str]:
    """Every broken promise of ``pages`` ({path relative to root: Markdown}), one ``path:line: what`` each.

    Links and anchors are resolved against ``pages`` first and the checkout second, so a
    page changed in memory is checked as it stands.  Raises CalledProcessError when git
    or nox cannot list the checkout or its sessions.
    """
    sessions = nox_sessions(root)
    problems: list[str] = []
    for name, text in pages.items():
        tokens = parse(text)
        problems += session_problems(name, tokens, sessions)
        problems += shell_problems(name, tokens)
        problems += link_problems(name, tokens, pages, root)
        problems += path_problems(name, tokens, pages, root)
    return problems


def test_the_readme_and_docs_hold_true():
    problems = doc_problems(doc_pages())
    assert not problems, "\n".join(problems)


def test_the_readme_links_every_page_of_docs():
    readme = doc_pages()["README.md"]
    linked = {c.attrs["href"].partition("#")[0] for t in parse(readme) if t.type == "inline"
              for c in t.children or () if c.type == "link_open"}
    assert {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")} <= linked


def planted(page: str, text: str) -> list[str]:
    """The problems of the real pages with ``text`` appended to ``page``."""
    pages = doc_pages()
    pages[page] += "\n" + text + "\n"
    return doc_problems(pages)


@pytest.mark.parametrize("page, fault, problem", [
    ("README.md", "See [the guide](docs/no-such-page.md).",
     "link 'docs/no-such-page.md': docs/no-such-page.md does not exist"),
    ("docs/benchmarks.md", "The runs: [evidence](results/evidence/README.md).",  # relative to docs/, not the root
     "docs/results/evidence/README.md does not exist"),
    ("docs/triage.md", "See [rules](comparisons.md#no-such-heading).",
     "docs/comparisons.md has no heading #no-such-heading"),
    ("docs/ci.md", "Run `nox -s build no-such-session -- --platform x`.",
     "nox session 'no-such-session' is not in noxfile.py"),
    ("docs/matrix.md", "The rule is in `harness/matrix/no_such_module.py`.",
     "path harness/matrix/no_such_module.py does not exist"),
    ("README.md", "```sh\npython benchmarks/no_such_benchmark.py\n```",
     "path benchmarks/no_such_benchmark.py does not exist"),
    ("docs/gpu.md", "```sh\nif true; then echo unfinished\n```", "sh block does not parse"),
])
def test_a_planted_fault_is_found_with_its_page_and_line(page, fault, problem):
    found = planted(page, fault)
    assert len(found) == 1, found
    assert found[0].startswith(f"{page}:") and problem in found[0], found
    line = int(found[0].split(":")[1])
    lines = doc_pages()[page].count("\n") + 1
    assert lines < line <= lines + fault.count("\n") + 1  # the line of the planted text


def test_outputs_a_run_writes_are_not_missing_paths():
    assert planted("README.md", "The newest run is `results/latest`; trees are in `.harness/fork`.") == []


def test_heading_ids_are_githubs():
    text = "# A `b.py` page\n## Where things live\n## Where things live\n## CPU (`x86_64`), 2× faster\n"
    assert anchors(text) == {"a-bpy-page", "where-things-live", "where-things-live-1", "cpu-x86_64-2-faster"}
