"""`Any` is left only where a reason is written beside it (docs/ci.md#the-type-checker).

A JSON value is typed ``JSON`` (harness.common.json_value), a JSON object or array ``dict[str, Any]``,
``Mapping[str, Any]`` or ``list[Any]``; every other ``Any`` in the package carries ``# Any: <why>`` on its line.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "harness"

#: The JSON containers the rule allows without a reason, as ast.unparse writes them.
JSON_CONTAINERS = {"dict[str, Any]", "Mapping[str, Any]", "list[Any]"}

REASON = "# Any:"


def bare_anys(source: str) -> list[int]:
    """The lines of ``source`` where ``Any`` is used outside the allowed JSON containers with no ``# Any:`` reason
    on the line; its imports are not uses."""
    tree = ast.parse(source)
    reasons = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
               if tok.type == tokenize.COMMENT and tok.string.startswith(REASON)}
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and ast.unparse(node) in JSON_CONTAINERS:
            allowed.update(id(n) for n in ast.walk(node))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "Any" in node.value:
            # a string annotation (a forward reference) is parsed as one
            try:
                inner = ast.parse(node.value, mode="eval")
            except SyntaxError:
                continue
            if any(isinstance(n, ast.Name) and n.id == "Any" for n in ast.walk(inner)) \
                    and ast.unparse(inner.body) not in JSON_CONTAINERS and node.lineno not in reasons:
                allowed.add(-node.lineno)  # reported below
    found = {n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "Any" and id(n) not in allowed}
    found |= {n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "Any"
              and isinstance(n.value, ast.Name) and n.value.id == "typing"}
    found |= {-key for key in allowed if key < 0}
    return sorted(line for line in found if line not in reasons)


def test_no_module_of_the_package_uses_a_bare_any():
    found = []
    for path in sorted(HARNESS.rglob("*.py")):
        rel = path.relative_to(HARNESS).as_posix()
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        found += [f"harness/{rel}:{n}: {lines[n - 1].strip()}" for n in bare_anys(source)]
    assert not found, "Any without '# Any: <why>' beside it:\n" + "\n".join(found)


def test_a_bare_any_is_found_and_a_reason_or_a_json_container_is_not():
    planted = ("from typing import Any, Mapping\n"
               "def f(x: Any) -> dict[str, Any]:\n"                       # 2: bare
               "    return {}\n"
               "def g(x: Any) -> None:  # Any: the caller's own type\n"  # 4: a reason
               "    y: list[Any] = []\n"                                  # 5: a JSON array
               "def h(x: Mapping[str, Any], y: 'tuple[Any, int]') -> None:\n"  # 6: a string annotation
               "    z: dict[Any, int] = {}\n")                            # 7: not a JSON object
    assert bare_anys(planted) == [2, 6, 7]
