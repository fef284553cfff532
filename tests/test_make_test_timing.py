"""benchmarks/make_test_timing.py without running make: pytest's summary line, the durations, and the
table it writes between docs/development.md's markers (newest first, ``--keep`` rows)."""
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_test_timing", REPO / "benchmarks" / "make_test_timing.py")
timing = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(timing)


def test_the_summary_line_and_durations_are_read_as_printed():
    assert timing.pytest_summary("x\n1245 passed, 3 deselected in 257.12s (0:04:17)\n") == "1245 passed, 3 deselected"
    assert timing.pytest_summary("==== 2 failed, 9 passed in 3.0s ====") == "2 failed, 9 passed"
    assert timing.pytest_summary("make: *** [test] Error 2") == "-"
    assert (timing.minutes(257.4), timing.minutes(59.6), timing.minutes(3.2)) == ("4 min 17 s", "1 min 00 s", "3 s")


def test_rows_go_first_between_the_markers_and_the_oldest_drops_out(tmp_path):
    doc = tmp_path / "development.md"
    doc.write_text(f"# Dev\n\n{timing.BEGIN}\n{timing.HEADER}\n{timing.END}\n\n## Next\n", encoding="utf-8")
    stamp = {"date": "2026-11-28 10:00", "commit": "abc+dirty", "load": (1.0, 0.5, 0.25), "cpus": 2}
    for i in range(3):
        timing.write_row(timing.table_row(stamp, 60.0 + i, 100.0, 0, f"{i} passed in 1.0s"), keep=2, doc=doc)
    text = doc.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| 2026")]
    assert [r.split("|")[7].strip() for r in rows] == ["2 passed", "1 passed"]
    assert "| 1.00 / 0.50 / 0.25 | 2 | 1 min 02 s | 1 min 40 s |" in rows[0] and "`abc+dirty`" in rows[0]
    assert text.startswith("# Dev\n") and text.endswith("## Next\n") and text.count("| date (UTC)") == 1


def test_a_doc_without_the_markers_is_refused_and_left_as_it_was(tmp_path):
    doc = tmp_path / "development.md"
    doc.write_text("# Dev\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="markers"):
        timing.write_row("| row |", keep=5, doc=doc)
    assert doc.read_text(encoding="utf-8") == "# Dev\n"


def test_the_shipped_doc_has_the_markers_and_the_header():
    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    assert f"{timing.BEGIN}\n{timing.HEADER}\n" in text and timing.END in text
