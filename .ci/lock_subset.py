"""Print the entries of a hash-locked requirements file whose wheel a directory holds.

    python3 .ci/lock_subset.py LOCK WHEEL_DIR > requirements.txt

Each printed entry keeps its ``--hash`` lines, so ``pip install --require-hashes`` still checks every
wheel it installs against the lock; entries without a wheel in WHEEL_DIR are left out (the machine's
own Python is expected to have them; .ci/gpu-evidence.sh checks the imports after installing).
Exit 2 naming the file when LOCK cannot be read or WHEEL_DIR holds a wheel the lock does not list.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it: lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_names(wheel_dir: Path) -> set[str]:
    """The normalized distribution names of the ``*.whl`` files in ``wheel_dir`` (the part before the first ``-``)."""
    return {normalize(w.name.split("-", 1)[0]) for w in wheel_dir.glob("*.whl")}


def entries(lock_text: str) -> list[tuple[str, str]]:
    """(normalized name, text) of each requirement of a pip-compile lock: a line starting with a name and its
    indented continuation lines (hashes, ``# via`` comments)."""
    out: list[tuple[str, str]] = []
    for block in re.split(r"\n(?=\S)", lock_text):
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*==", block)
        if m:
            out.append((normalize(m.group(1)), block.rstrip("\n")))
    return out


def main(argv: list[str]) -> int:
    """Print LOCK's entries with a wheel in WHEEL_DIR; 2 on an unreadable lock or a wheel the lock lacks."""
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    lock, wheel_dir = Path(argv[0]), Path(argv[1])
    try:
        locked = entries(lock.read_text(encoding="utf-8"))
    except OSError as e:
        print(f"{lock}: {e.strerror}", file=sys.stderr)
        return 2
    have = wheel_names(wheel_dir)
    unknown = sorted(have - {name for name, _ in locked})
    if unknown:
        print(f"{wheel_dir}: wheels that {lock} does not list: {', '.join(unknown)}", file=sys.stderr)
        return 2
    for name, text in locked:
        if name in have:
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
