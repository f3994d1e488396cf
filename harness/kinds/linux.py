"""``os: linux``: the host every other OS is cross-built on (harness.stages.building.cross)."""

from __future__ import annotations

from .shape import OsKind

LINUX = OsKind(name="linux", executable_suffix="", crlf_stdout=False, sys_platform="linux", runner_label="linux",
               shell="bash", cross_host=True)
