"""Export from the GUI: File > Export Candidate… reads a project, lists its measured candidates
fastest first, and writes the chosen one's files in a worker; every failure is a banner."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytestqt", reason="GUI tests need pytest-qt")
from tests.test_app import LOAD_MS, isolated_settings, make_window  # noqa: E402,F401  (fixtures)

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "resources" / "tasks" / "act_gelu.py"
PROGRAM = ROOT / "resources" / "programs" / "act_gelu.json"


def _project(path: Path, medians_ms: list[list[float]]) -> list[int]:
    """A project with one candidate per entry; an empty entry stays queued (never measured)."""
    from core.evaluation.results import EvalResult, Measurement, Status, Timing
    from core.program import load_solution
    from core.project import CandidateRecord, Project
    from core.tasks import load_task

    ids = []
    with Project.create(path, load_task(TASK), hardware={"name": "NVIDIA H200"}) as project:
        for samples in medians_ms:
            cid = project.add_candidate(CandidateRecord.from_program(load_solution(PROGRAM)))
            if samples:
                # A recorded verdict as the evaluator stores it (the test's numbers, not a measurement).
                m = Measurement(timing=Timing.from_samples(samples), eager_ms=0.13, speedup_eager=0.13 / samples[1])
                project.record_result(cid, EvalResult(Status.MEASURED, measurement=m), reward=1.0)
            ids.append(cid)
    return ids


def test_the_dialog_lists_candidates_fastest_first_and_exports_the_chosen_one(qtbot, make_window, tmp_path):
    project = tmp_path / "run.cuagent"
    slow, fast, _ = _project(project, [[0.2, 0.21, 0.22], [0.1, 0.11, 0.12], []])
    window = make_window()
    window.export_from(project)
    qtbot.waitUntil(lambda: window.export_dialog is not None or window.banner.isVisible(), timeout=LOAD_MS)
    dialog = window.export_dialog
    assert dialog is not None and dialog.isVisible()
    assert dialog.table.rowCount() == 2                       # the queued candidate is not offered
    assert [dialog.table.item(r, 0).text() for r in range(2)] == [str(fast), str(slow)]
    assert dialog.table.item(0, 2).text() == "110.0" and dialog.table.item(0, 3).text() == "1.18x"
    assert dialog.candidate_id() == fast and dialog.export_button.isEnabled()

    dialog.table.selectRow(1)
    out = tmp_path / "shipped"
    dialog.out_edit.setText(str(out))
    dialog.accept()
    qtbot.waitUntil(lambda: window.last_export is not None or window.banner.isVisible(), timeout=LOAD_MS)
    assert not window.banner.isVisible(), window.banner.text()
    assert window.last_export.candidate_id == slow
    names = {p.name for p in out.iterdir()}
    assert {"act_gelu.cu", "act_gelu_loader.py", "act_gelu_modelnew.py", "REPORT.md"} <= names
    assert "PYBIND11_MODULE" in (out / "act_gelu.cu").read_text()
    assert f"Exported candidate {slow}" in window.log_view.toPlainText()


def test_existing_files_are_kept_unless_replacing_is_asked_for(qtbot, make_window, tmp_path):
    project = tmp_path / "run.cuagent"
    _project(project, [[0.1, 0.11, 0.12]])
    out = tmp_path / "out"
    out.mkdir()
    (out / "act_gelu.cu").write_text("// mine")
    window = make_window()
    window.export_candidate(project, None, out)
    qtbot.waitUntil(window.banner.isVisible, timeout=LOAD_MS)
    assert "would overwrite" in window.banner.text() and "Replace files" in window.banner.text()
    assert (out / "act_gelu.cu").read_text() == "// mine"
    window.export_candidate(project, None, out, overwrite=True)
    qtbot.waitUntil(lambda: window.last_export is not None, timeout=LOAD_MS)
    assert "PYBIND11_MODULE" in (out / "act_gelu.cu").read_text()


def test_the_dialog_can_build_the_exported_cu_with_nvcc(qtbot, make_window, tmp_path):
    project = tmp_path / "run.cuagent"
    _project(project, [[0.1, 0.11, 0.12]])
    window = make_window()
    window.export_from(project)
    qtbot.waitUntil(lambda: window.export_dialog is not None, timeout=LOAD_MS)
    dialog = window.export_dialog
    assert not dialog.check_build()                          # off by default: it takes 10-20 s
    dialog.check_box.setChecked(True)
    dialog.out_edit.setText(str(tmp_path / "out"))
    dialog.accept()
    qtbot.waitUntil(lambda: window.last_export is not None or window.banner.isVisible(), timeout=120_000)
    check = window.last_build_check
    assert check is not None and not window.banner.isVisible(), window.banner.text()
    log = window.log_view.toPlainText()
    if check.built is None:                                  # no nvcc or headers on this machine
        assert "build check not made" in log
    else:
        assert check.built and "build check: nvcc built it" in log


@pytest.mark.parametrize("case", ["not a project", "nothing measured"])
def test_a_project_that_cannot_be_exported_is_a_banner(qtbot, make_window, tmp_path, case):
    project = tmp_path / "p.cuagent"
    if case == "not a project":
        project.write_text("not a database")
    else:
        _project(project, [[]])
    window = make_window()
    window.export_from(project)
    qtbot.waitUntil(window.banner.isVisible, timeout=LOAD_MS)
    expected = "could not be read" if case == "not a project" else "no measured candidate"
    assert expected in window.banner.text()
    assert window.export_dialog is None
    if case == "not a project":
        assert project.read_text() == "not a database"      # never overwritten
