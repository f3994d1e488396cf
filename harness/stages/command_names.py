"""The command-line stages, declared once: the run loop (harness.stages.shape.COMMANDS), the command line
(harness.cli) and nox (noxfile.py) read their names and their one-line summaries here.  Standard library
only: the command line's ``--help`` and nox import it without the requirements."""

#: Each stage command, in the order a run takes them, and what it does in one line.
STAGE_COMMANDS = {
    "build": "configure and build each selected platform, variants base (upstream) and fork (patched)",
    "test": "the fork's native tests through ctest by label; JUnit XML",
    "compare-outputs": "every comparison group (greedy, token by token) and its speed rules",
}
