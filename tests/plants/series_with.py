"""Write the project's patch series plus planted faults into a directory, for ``--patches-dir``.

    python tests/plants/series_with.py OUT_DIR PLANT.patch [PLANT.patch ...]

copies ``patches/*.patch`` and ``patches/series`` into OUT_DIR (created, or emptied of
``*.patch`` files) and appends each plant after the series, in the order given.  A plant
is one ``git format-patch`` file that applies on top of the series (tests/plants/).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def series_with(out_dir: Path, plants: list[Path], patches: Path = ROOT / "patches") -> Path:
    """Write ``patches`` plus ``plants`` (appended to its ``series``) into ``out_dir``; returns ``out_dir``.

    Raises FileNotFoundError naming a plant that does not exist and ValueError for a plant whose file
    name the series already holds.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.patch"):
        old.unlink()
    for patch in patches.glob("*.patch"):
        shutil.copyfile(patch, out_dir / patch.name)
    series = (patches / "series").read_text(encoding="utf-8")
    for plant in plants:
        if not plant.is_file():
            raise FileNotFoundError(f"plant {plant} does not exist")
        if (out_dir / plant.name).exists():
            raise ValueError(f"plant {plant.name}: the series already has a patch of that name")
        shutil.copyfile(plant, out_dir / plant.name)
        series = series.rstrip("\n") + f"\n{plant.name}\n"
    (out_dir / "series").write_text(series, encoding="utf-8")
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    print(series_with(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]))
