"""Which Python runs the harness for nox: nox's own when it has the requirements, else the project's ``.venv``.

Standard library only: noxfile.py imports it in whatever Python nox runs in (pipx's, say).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from .errors import EXIT_ENVIRONMENT

#: The third-party modules the package imports (every ``import`` of harness/ outside the standard library; a
#: test keeps the list complete): an interpreter without one of them cannot run every command.
NEEDED_MODULES = ("yaml", "jsonschema", "gguf", "numpy", "rich", "filelock", "elftools", "pefile", "scipy",
                  "unidiff", "argcomplete")


def missing_modules() -> list[str]:
    """The modules of :data:`NEEDED_MODULES` this interpreter cannot import, found without importing them."""
    return [m for m in NEEDED_MODULES if importlib.util.find_spec(m) is None]


def harness_python(root: Path) -> str:
    """The Python that runs the harness of the checkout ``root``: this one when it has :data:`NEEDED_MODULES`,
    else ``root/.venv``'s.  Prints one ``error:`` line saying how to install them and raises
    SystemExit(EXIT_ENVIRONMENT) when neither has them."""
    missing = missing_modules()
    if not missing:
        return sys.executable
    venv = root / ".venv" / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    if venv.exists():
        return str(venv)
    print(f"error: nox runs in {sys.executable}, which lacks {', '.join(missing)}: run "
          f"`python -m pip install --require-hashes -r requirements.txt` and then `python -m nox` in the "
          f"project's environment",
          file=sys.stderr)
    raise SystemExit(EXIT_ENVIRONMENT)
