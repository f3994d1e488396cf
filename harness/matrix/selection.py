"""What one run takes of the matrix: the platforms, comparison groups, models and prompts the command line
selects (``--platform``, ``--group``, ``--model``), decided here once.  The preflight, the run's context
(harness.stages.shape.Context.selection) and through it every stage read the selection from here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .config import Matrix


@dataclass(frozen=True)
class Selection:
    """The selection of one run from ``matrix``: ``platforms``, ``groups``, ``models`` as named on the command
    line (empty: no restriction).  Names are those of the matrix; an unknown platform raises MatrixError where
    it is looked up (harness.matrix.config.Matrix.platform)."""

    matrix: Matrix
    platforms: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    models: tuple[str, ...] = ()

    @classmethod
    def of(cls, matrix: Matrix, platforms: Sequence[str] = (), groups: Sequence[str] = (),
           models: Sequence[str] = ()) -> Selection:
        """The selection of ``matrix`` by the names given (lists from the command line)."""
        return cls(matrix, tuple(platforms), tuple(groups), tuple(models))

    def platform_names(self) -> list[str]:
        """The platforms ``--platform`` names, else every platform of the matrix, in that order."""
        return list(self.platforms) or list(self.matrix.platforms)

    def names_platforms(self) -> bool:
        """True when ``--platform`` named the platforms (a platform that cannot run then leaves the run
        incomplete, where the matrix's others are just skipped)."""
        return bool(self.platforms)

    def names_group(self, group: str) -> bool:
        """True when ``--group`` named ``group`` (a named group skipped leaves the run incomplete)."""
        return group in self.groups

    def group_names(self, platform: str) -> list[str]:
        """The comparison groups of ``platform`` that ``--group`` leaves in, in the platform's order."""
        return [g for g in self.matrix.platform(platform).groups if not self.groups or g in self.groups]

    def takes_model(self, model: str) -> bool:
        """True when ``--model`` leaves model ``model`` in."""
        return not self.models or model in self.models

    def model_names(self, group: str) -> list[str]:
        """The models of comparison group ``group`` that ``--model`` leaves in, in the group's order."""
        return [m for m in self.matrix.groups[group].models if self.takes_model(m)]

    def groups_with_models(self, platform: str) -> list[str]:
        """The groups of :meth:`group_names` with at least one model :meth:`model_names` leaves in: those whose
        comparisons generate anything."""
        return [g for g in self.group_names(platform) if self.model_names(g)]

    def prompt_names(self, group: str) -> list[str]:
        """The prompts of comparison group ``group`` (the command line selects none: every prompt of the group)."""
        return list(self.matrix.groups[group].prompts)

    def filters(self) -> str:
        """The ``--group`` and ``--model`` names, joined, ``none`` without either (for a run that selected
        nothing)."""
        return ", ".join(self.groups + self.models) or "none"
