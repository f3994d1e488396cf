"""The harness that builds, tests and compares the llama.cpp fork (README.md); its command line is harness.cli."""

__version__ = "0.1.0"
