"""The type of a JSON value, as the standard library's json module reads and writes it.

A JSON value is an object, an array, a string, a number, true, false or null: ``dict``, ``list``, ``str``,
``int``/``float``, ``bool`` or ``None`` once read.  Its type is known only once a reader has looked at it, and
every reader of the run record checks what it reads (harness.record.probe, harness.record.compare, ...), so a
value on its way in or out is :data:`JSON`.  A JSON object is written ``dict[str, Any]`` (``Mapping[str, Any]``
read-only) and an array ``list[Any]``: the rule for ``Any`` (docs/ci.md#the-type-checker,
tests/test_any.py).
"""

from __future__ import annotations

from typing import Any, TypeAlias

#: A JSON value of any kind, as json.loads returns it or json.dumps takes it.
JSON: TypeAlias = Any  # Any: json.loads returns Any, and mypy has no recursive JSON type its readers could narrow
