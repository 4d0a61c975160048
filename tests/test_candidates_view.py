"""Candidate table and lineage tree (pytest-qt, offscreen): formatting, sorting, filters, selection, speed."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("pytestqt", reason="GUI tests need pytest-qt")
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QColor  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from app.candidates_view import (  # noqa: E402
    COL_BRANCH,
    COL_ID,
    COL_MEDIAN,
    COL_REASON,
    COL_REWARD,
    COL_STATUS,
    COLUMNS,
    SORT_ROLE,
    STATUS_COLORS,
    CandidateFilterProxy,
    CandidateRow,
    CandidateTable,
    CandidateTableModel,
    LineageTree,
)

DISPLAY = Qt.ItemDataRole.DisplayRole


def row(cid: int, *, branch: int = 0, parent: int | None = None, status: str = "measured",
        median_ms: float | None = 0.5, reward: float | None = 0.25, speedup: float | None = 1.5,
        action: str = "set BLOCK=256", reason: str = "") -> CandidateRow:
    return CandidateRow(cid, branch, parent, status, median_ms, reward, speedup, action, reason)


def proxy_column(proxy, column: int) -> list[str]:
    return [proxy.index(r, column).data(DISPLAY) for r in range(proxy.rowCount())]


def proxy_ids(proxy) -> list[int]:
    return [int(value) for value in proxy_column(proxy, COL_ID)]


def make_proxy(rows: list[CandidateRow]) -> tuple[CandidateTableModel, CandidateFilterProxy]:
    model = CandidateTableModel()
    model.add_rows(rows)
    proxy = CandidateFilterProxy()
    proxy.setSourceModel(model)
    return model, proxy


# -- model ---------------------------------------------------------------------------------------
def test_columns_and_formatting():
    model = CandidateTableModel()
    model.add_rows([
        row(7, branch=2, parent=3, median_ms=0.01234, reward=0.123456, speedup=1.234, action="set VEC=4"),
        row(8, parent=None, status="wrong", median_ms=None, reward=None, speedup=None,
            action="start", reason="max abs error 0.5 > atol"),
    ])
    model.set_branch_name(2, "main")
    assert model.columnCount() == 9 and model.rowCount() == 2
    headers = [model.headerData(c, Qt.Orientation.Horizontal, DISPLAY) for c in range(9)]
    assert headers == list(COLUMNS)
    assert headers[:4] == ["id", "branch", "parent", "status"] and headers[4].startswith("median")
    first = [model.index(0, c).data(DISPLAY) for c in range(9)]
    assert first == ["7", "main", "3", "measured", "12.3", "1.23x", "0.123", "set VEC=4", ""]
    second = [model.index(1, c).data(DISPLAY) for c in range(9)]
    assert second == ["8", "0", "", "wrong", "", "", "", "start", "max abs error 0.5 > atol"]
    # numbers under SORT_ROLE, colour on the status cell, the reason as a tooltip
    assert model.index(0, COL_MEDIAN).data(SORT_ROLE) == pytest.approx(0.01234)
    assert model.index(0, COL_ID).data(SORT_ROLE) == 7
    status_colour = model.index(1, COL_STATUS).data(Qt.ItemDataRole.ForegroundRole)
    assert QColor(status_colour).name() == QColor(STATUS_COLORS["wrong"]).name()
    assert QColor(status_colour).name() != QColor(STATUS_COLORS["measured"]).name()
    assert model.index(1, COL_REASON).data(Qt.ItemDataRole.ToolTipRole) == "max abs error 0.5 > atol"
    assert model.index(1, COL_STATUS).data(Qt.ItemDataRole.ToolTipRole) == "max abs error 0.5 > atol"


def test_add_rows_is_one_insert_per_batch_and_row_for():
    model = CandidateTableModel()
    inserts: list[tuple[int, int]] = []
    model.rowsInserted.connect(lambda _parent, first, last: inserts.append((first, last)))
    model.add_rows([row(i) for i in range(10)])
    model.add_rows([row(i) for i in range(10, 15)])
    assert inserts == [(0, 9), (10, 14)]
    assert model.row_for(12) == row(12)
    assert model.row_for(99) is None
    model.clear()
    assert model.rowCount() == 0 and model.row_for(12) is None


def test_update_row_changes_the_cell_and_signals_that_row():
    model = CandidateTableModel()
    model.add_rows([row(1), row(2, status="queued", median_ms=None)])
    changed: list[tuple[int, int]] = []
    model.dataChanged.connect(lambda top, bottom, _roles=None: changed.append((top.row(), bottom.row())))
    model.update_row(row(2, status="measured", median_ms=0.002))
    assert changed == [(1, 1)]
    assert model.index(1, COL_STATUS).data(DISPLAY) == "measured"
    assert model.index(1, COL_MEDIAN).data(DISPLAY) == "2.0"
    assert model.row_for(2).status == "measured"
    assert model.rowCount() == 2
    model.update_row(row(3))   # an unknown id is appended, not lost
    assert model.rowCount() == 3 and model.row_for(3) is not None


# -- proxy ---------------------------------------------------------------------------------------
def test_proxy_sorts_numbers_as_numbers():
    rows = [row(10, median_ms=0.010, reward=0.5), row(9, median_ms=0.009, reward=0.05),
            row(100, median_ms=None, reward=None), row(2, median_ms=0.1, reward=1.5)]
    _model, proxy = make_proxy(rows)
    proxy.sort(COL_ID, Qt.SortOrder.AscendingOrder)
    assert proxy_ids(proxy) == [2, 9, 10, 100]          # as text it would be 10, 100, 2, 9
    proxy.sort(COL_MEDIAN, Qt.SortOrder.AscendingOrder)
    assert proxy_column(proxy, COL_MEDIAN) == ["9.0", "10.0", "100.0", ""]   # missing last
    proxy.sort(COL_REWARD, Qt.SortOrder.DescendingOrder)
    assert proxy_ids(proxy) == [2, 10, 9, 100]


def test_dynamic_sort_places_streamed_rows_in_order():
    model, proxy = make_proxy([row(1, median_ms=0.5), row(2, median_ms=0.09)])
    proxy.sort(COL_MEDIAN, Qt.SortOrder.AscendingOrder)
    model.add_rows([row(3, median_ms=0.1), row(4, median_ms=0.0095)])
    assert proxy_ids(proxy) == [4, 2, 3, 1]
    model.update_row(row(1, median_ms=0.001))
    assert proxy_ids(proxy)[0] == 1


def test_proxy_status_and_branch_filters():
    rows = [row(1, branch=0), row(2, branch=0, status="wrong"), row(3, branch=1),
            row(4, branch=1, status="compile_error"), row(5, branch=2, status="timeout")]
    _model, proxy = make_proxy(rows)
    proxy.set_statuses({"measured"})
    assert sorted(proxy_ids(proxy)) == [1, 3]
    proxy.set_branches({1})
    assert proxy_ids(proxy) == [3]
    proxy.set_statuses(None)
    assert sorted(proxy_ids(proxy)) == [3, 4]
    proxy.set_branches(None)
    assert proxy.rowCount() == 5
    proxy.set_statuses(set())
    assert proxy.rowCount() == 0


# -- table widget --------------------------------------------------------------------------------
@pytest.fixture
def table(qtbot):
    widget = CandidateTable()
    qtbot.addWidget(widget)
    widget.resize(900, 400)
    widget.show()
    return widget


def test_table_filter_combos(table):
    table.add_rows([row(1, branch=0), row(2, branch=0, status="wrong"), row(3, branch=1, status="rejected"),
                    row(4, branch=1, status="queued", median_ms=None)])
    table.add_rows([row(5, branch=3, status="crashed")])
    statuses = [table.status_combo.itemText(i) for i in range(table.status_combo.count())]
    assert statuses[:3] == ["All statuses", "measured", "failed"]
    assert {"wrong", "compile_error", "crashed", "timeout", "rejected", "queued"} <= set(statuses[3:])
    assert [table.branch_combo.itemText(i) for i in range(table.branch_combo.count())] == [
        "All branches", "branch 0", "branch 1", "branch 3"]

    table.set_status_filter("failed")
    assert sorted(proxy_ids(table.proxy)) == [2, 3, 5]
    table.set_status_filter("measured")
    assert proxy_ids(table.proxy) == [1]
    table.set_status_filter("queued")
    assert proxy_ids(table.proxy) == [4]
    table.set_status_filter("All statuses")
    table.set_branch_filter(1)
    assert sorted(proxy_ids(table.proxy)) == [3, 4]
    assert "2 of 5" in table.count_label.text()

    table.set_branch_name(1, "fork-a")
    assert table.branch_combo.findText("branch fork-a") >= 0
    assert proxy_column(table.proxy, COL_BRANCH) == ["fork-a", "fork-a"]

    table.clear()
    assert table.branch_combo.count() == 1 and table.model.rowCount() == 0
    table.add_rows([row(6, branch=7)])
    assert table.proxy.rowCount() == 1   # the old branch filter does not hide new runs


def test_table_update_row_changes_the_visible_cell(table):
    table.add_rows([row(1, status="queued", median_ms=None)])
    table.update_row(row(1, branch=4, status="measured", median_ms=0.25))
    assert proxy_column(table.proxy, COL_MEDIAN) == ["250.0"]
    assert proxy_column(table.proxy, COL_STATUS) == ["measured"]
    assert table.branch_combo.findData(4) >= 0


def test_column_chooser_hides_and_shows_columns(table):
    menu = table.column_menu()
    actions = menu.actions()
    assert [a.text() for a in actions] == list(COLUMNS)
    assert all(a.isCheckable() and a.isChecked() for a in actions)
    actions[COL_REASON].trigger()
    assert table.view.isColumnHidden(COL_REASON)
    assert not table.column_menu().actions()[COL_REASON].isChecked()
    actions[COL_REASON].trigger()
    assert not table.view.isColumnHidden(COL_REASON)
    for column in range(1, len(COLUMNS)):
        table.set_column_visible(column, False)
    table.set_column_visible(0, False)   # the last visible column stays
    assert table.visible_columns() == [0]


def test_selecting_a_row_emits_its_candidate_id(table, qtbot):
    table.add_rows([row(i) for i in (3, 9, 10, 42)])
    table.view.sortByColumn(COL_ID, Qt.SortOrder.DescendingOrder)
    assert proxy_ids(table.proxy) == [42, 10, 9, 3]
    with qtbot.waitSignal(table.candidate_selected, timeout=1000) as blocker:
        table.view.selectRow(2)
    assert blocker.args == [9]
    assert table.selected_id() == 9

    with qtbot.waitSignal(table.candidate_selected, timeout=1000) as blocker:
        assert table.select_candidate(42)
    assert blocker.args == [42]
    assert table.view.currentIndex().row() == 0
    assert not table.select_candidate(12345)
    table.set_status_filter("failed")
    assert not table.select_candidate(3)   # hidden by the filter


# -- lineage -------------------------------------------------------------------------------------
def ids_under(item) -> list[int]:
    return [int(item.child(i).text(0)) for i in range(item.childCount())]


def test_lineage_parents_children_and_late_parents(qtbot):
    tree = LineageTree()
    qtbot.addWidget(tree)
    tree.set_branch_name(0, "main")
    tree.add_rows([row(1, parent=None), row(2, parent=1), row(3, parent=1)])
    # a grandchild, then its parent, arrive before the great-grandparent chain is complete
    tree.add_rows([row(7, parent=6, status="wrong", reason="bad"), row(6, parent=5), row(8, branch=1, parent=None)])
    assert tree.item_for(7) is None and tree.orphan_count() == 2
    tree.add_rows([row(5, parent=2)])
    assert tree.orphan_count() == 0

    assert tree.topLevelItemCount() == 2
    root = tree.topLevelItem(0)
    assert root.text(0) == "branch main" and ids_under(root) == [1]
    assert tree.topLevelItem(1).text(0) == "branch 1" and ids_under(tree.topLevelItem(1)) == [8]
    assert ids_under(tree.item_for(1)) == [2, 3]
    assert ids_under(tree.item_for(2)) == [5]
    assert ids_under(tree.item_for(5)) == [6]
    assert ids_under(tree.item_for(6)) == [7]
    seven = tree.item_for(7)
    assert [seven.text(c) for c in range(4)] == ["7", "wrong", "500.0", "set BLOCK=256"]
    assert seven.toolTip(1) == "bad"

    tree.update_row(row(7, parent=6, status="measured", median_ms=0.1))
    assert tree.item_for(7).text(1) == "measured" and tree.item_for(7).text(2) == "100.0"

    with qtbot.waitSignal(tree.candidate_selected, timeout=1000) as blocker:
        assert tree.select_candidate(7)
    assert blocker.args == [7]
    assert tree.selected_id() == 7
    assert tree.item_for(5).isExpanded()   # ancestors open so the selection shows
    with qtbot.waitSignal(tree.candidate_selected, timeout=1000) as blocker:
        tree.setCurrentItem(tree.item_for(3))
    assert blocker.args == [3]
    assert not tree.select_candidate(999)

    tree.clear()
    assert tree.topLevelItemCount() == 0 and tree.item_for(1) is None


def test_lineage_cap_shows_a_note(qtbot):
    tree = LineageTree(max_items=10)
    qtbot.addWidget(tree)
    tree.add_rows([row(i, parent=None if i == 0 else i - 1) for i in range(15)])
    assert tree.is_capped() and tree.item_for(9) is not None and tree.item_for(10) is None
    note = tree.topLevelItem(tree.topLevelItemCount() - 1)
    assert "capped at 10" in note.text(0) and "5 more" in note.text(0)


# -- speed ---------------------------------------------------------------------------------------
def streamed_rows(count: int) -> list[CandidateRow]:
    statuses = ("measured", "measured", "wrong", "rejected", "compile_error")
    out = []
    for i in range(count):
        status = statuses[i % len(statuses)]
        out.append(CandidateRow(i, i % 4, None if i < 4 else (i * 7919) % i, status,
                                0.001 * ((i * 37) % 1000 + 1) if status == "measured" else None,
                                ((i * 13) % 100) / 100, 1.0 + (i % 50) / 25, f"set BLOCK={64 << (i % 4)}",
                                "" if status == "measured" else "reason"))
    return out


def test_fifty_thousand_rows_in_batches_stay_fast(table):
    rows = streamed_rows(50_000)
    table.set_status_filter("measured")   # the filter runs on every streamed row too
    times = []
    for start in range(0, len(rows), 500):
        began = time.perf_counter()
        table.add_rows(rows[start:start + 500])
        QApplication.processEvents()   # let the view lay out and paint, as the 30 Hz drain would
        times.append(time.perf_counter() - began)
    assert table.model.rowCount() == 50_000
    assert table.proxy.rowCount() == 20_000
    first, last = sum(times[:10]) / 10, sum(times[-10:]) / 10
    # One batch is ~2-15 ms here (2-core machine). Per-row work that scans all earlier rows would
    # cost 500 x 50k steps per batch at the end: seconds, and far above the first batches.
    assert max(times) < 0.25, f"slowest batch {max(times) * 1000:.0f} ms"
    assert last < 3 * first + 0.02, f"batches slowed from {first * 1000:.1f} to {last * 1000:.1f} ms"


def test_five_thousand_lineage_items_are_fast(qtbot):
    tree = LineageTree()
    qtbot.addWidget(tree)
    tree.show()
    rows = streamed_rows(5_000)
    began = time.perf_counter()
    for start in range(0, len(rows), 500):
        tree.add_rows(rows[start:start + 500])
    elapsed = time.perf_counter() - began
    assert tree.item_for(4_999) is not None and tree.orphan_count() == 0
    assert elapsed < 2.0, f"5,000 lineage items took {elapsed:.2f} s"
