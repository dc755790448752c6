"""The unit tests mirror `src/`: every folder under tests/unit is a package of
src/tkbox at the same path (tests/unit/doors/network tests tkbox.doors.network), so
a module's unit tests are found where the module is. Tests that span packages (the
import graph, the shape rules, the docs) sit at the top of tests/unit."""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parent
SRC = UNIT.parents[1] / "src" / "tkbox"


def strays(unit: Path = UNIT, src: Path = SRC) -> list[str]:
    """Folders under `unit` holding Python files with no package at that path in `src`."""
    out = []
    for d in sorted(p for p in unit.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        rel = d.relative_to(unit)
        if any(d.glob("*.py")) and not (src / rel / "__init__.py").is_file():
            out.append(str(rel))
    return out


def test_every_unit_test_folder_is_a_package_of_src() -> None:
    assert strays() == [], "move these tests to the folder of the package they test"


def test_a_folder_that_is_no_package_is_found(tmp_path: Path) -> None:
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "__init__.py").write_text("")
    for d in ("a", "vm_choice"):
        (tmp_path / "unit" / d).mkdir(parents=True)
        (tmp_path / "unit" / d / "test_x.py").write_text("")
    assert strays(tmp_path / "unit", tmp_path / "src") == ["vm_choice"]
