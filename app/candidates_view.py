"""The run's candidates: a sortable, filterable table and a lineage tree, both fed in batches.

A search run streams tens of thousands of evaluated candidates; the GUI drains them from a buffer
on a timer and hands each batch to `add_rows`. Everything here is built so one batch costs work
proportional to the batch, not to the rows already shown.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from PySide6.QtCore import (
    QAbstractTableModel,
    QItemSelection,
    QItemSelectionModel,
    QModelIndex,
    QPoint,
    QSortFilterProxyModel,
    Qt,
    Signal,
)
from PySide6.QtGui import QAction, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMenu,
    QTableView,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

SORT_ROLE = Qt.ItemDataRole.UserRole + 1
# Plain ints: data() runs once per cell per comparison while sorting, and enum compares are slow.
_DISPLAY = int(Qt.ItemDataRole.DisplayRole.value)
_FOREGROUND = int(Qt.ItemDataRole.ForegroundRole.value)
_TOOLTIP = int(Qt.ItemDataRole.ToolTipRole.value)
_ALIGNMENT = int(Qt.ItemDataRole.TextAlignmentRole.value)

STATUSES = ("measured", "wrong", "compile_error", "crashed", "timeout", "rejected", "queued")
# "failed" in the filter: everything that finished without a measurement (queued has not finished).
FAILED_STATUSES = frozenset(s for s in STATUSES if s not in ("measured", "queued"))

STATUS_COLORS = {
    "measured": "#1a7f37",
    "wrong": "#cf222e",
    "compile_error": "#9a6700",
    "crashed": "#82071e",
    "timeout": "#bc4c00",
    "rejected": "#57606a",
    "queued": "#0969da",
}


@dataclass(frozen=True)
class CandidateRow:
    id: int
    branch_id: int
    parent_id: int | None
    status: str              # "measured", "wrong", "compile_error", "crashed", "timeout", "rejected", "queued"
    median_ms: float | None
    reward: float | None
    speedup_eager: float | None
    action: str              # e.g. "set BLOCK=256" or "start"
    reason: str              # why rejected, "" when measured


COL_ID, COL_BRANCH, COL_PARENT, COL_STATUS, COL_MEDIAN, COL_SPEEDUP, COL_REWARD, COL_ACTION, COL_REASON = range(9)
COLUMNS = ("id", "branch", "parent", "status", "median (µs)", "speedup", "reward", "action", "reason")
NUMERIC_COLUMNS = frozenset({COL_ID, COL_PARENT, COL_MEDIAN, COL_SPEEDUP, COL_REWARD})


def format_median_us(median_ms: float | None) -> str:
    return "" if median_ms is None else f"{median_ms * 1000:.1f}"


def _number_or(value: float | None, missing: float) -> float:
    """Sort key for an optional number: missing values go to one end instead of comparing as None."""
    return missing if value is None or math.isnan(value) else float(value)


class CandidateTableModel(QAbstractTableModel):
    """Rows in arrival order; an id -> row index map makes updates and look-ups O(1)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self._rows: list[CandidateRow] = []
        self._index: dict[int, int] = {}
        self._branch_names: dict[int, str] = {}
        self._status_brushes = {s: QColor(c) for s, c in STATUS_COLORS.items()}
        self._right = int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)

    # -- Qt model interface -------------------------------------------------------------------
    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        return None

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        role = int(role)
        if role == SORT_ROLE:
            return self._sort_key(self._rows[index.row()], index.column())
        if role == _DISPLAY:
            return self._display(self._rows[index.row()], index.column())
        col = index.column()
        if role == _FOREGROUND and col == COL_STATUS:
            return self._status_brushes.get(self._rows[index.row()].status)
        if role == _TOOLTIP and col in (COL_STATUS, COL_REASON, COL_ACTION):
            row = self._rows[index.row()]
            return (row.reason or None) if col != COL_ACTION else (row.action or None)
        if role == _ALIGNMENT and col in NUMERIC_COLUMNS:
            return self._right
        return None

    def _display(self, row: CandidateRow, col: int) -> str:
        if col == COL_ID:
            return str(row.id)
        if col == COL_BRANCH:
            return self.branch_name(row.branch_id)
        if col == COL_PARENT:
            return "" if row.parent_id is None else str(row.parent_id)
        if col == COL_STATUS:
            return row.status
        if col == COL_MEDIAN:
            return format_median_us(row.median_ms)
        if col == COL_SPEEDUP:
            return "" if row.speedup_eager is None else f"{row.speedup_eager:.2f}x"
        if col == COL_REWARD:
            return "" if row.reward is None else f"{row.reward:.3f}"
        if col == COL_ACTION:
            return row.action
        return row.reason

    @staticmethod
    def _sort_key(row: CandidateRow, col: int):
        # Always one type per column so comparisons are numeric; missing values sort last in the
        # direction people usually read each column (fast medians first, high rewards first).
        if col == COL_ID:
            return row.id
        if col == COL_BRANCH:
            return row.branch_id
        if col == COL_PARENT:
            return -1 if row.parent_id is None else row.parent_id
        if col == COL_STATUS:
            return row.status
        if col == COL_MEDIAN:
            return _number_or(row.median_ms, math.inf)
        if col == COL_SPEEDUP:
            return _number_or(row.speedup_eager, -math.inf)
        if col == COL_REWARD:
            return _number_or(row.reward, -math.inf)
        if col == COL_ACTION:
            return row.action
        return row.reason

    # -- feeding ------------------------------------------------------------------------------
    def add_rows(self, rows: list[CandidateRow]) -> None:
        """Append a batch with one insert notification. Ids already present are updated instead."""
        fresh: list[CandidateRow] = []
        seen_in_batch: dict[int, int] = {}
        for row in rows:
            if row.id in self._index:
                self.update_row(row)
            elif row.id in seen_in_batch:
                fresh[seen_in_batch[row.id]] = row   # a later version in the same batch wins
            else:
                seen_in_batch[row.id] = len(fresh)
                fresh.append(row)
        if not fresh:
            return
        first = len(self._rows)
        self.beginInsertRows(QModelIndex(), first, first + len(fresh) - 1)
        self._rows.extend(fresh)
        for offset, row in enumerate(fresh):
            self._index[row.id] = first + offset
        self.endInsertRows()

    def update_row(self, row: CandidateRow) -> None:
        """Replace the row with the same id (appending it if it is new)."""
        position = self._index.get(row.id)
        if position is None:
            self.add_rows([row])
            return
        self._rows[position] = row
        self.dataChanged.emit(self.index(position, 0), self.index(position, len(COLUMNS) - 1))

    def row_for(self, candidate_id: int) -> CandidateRow | None:
        position = self._index.get(candidate_id)
        return None if position is None else self._rows[position]

    def row_at(self, position: int) -> CandidateRow:
        return self._rows[position]

    def position_of(self, candidate_id: int) -> int | None:
        return self._index.get(candidate_id)

    def branch_name(self, branch_id: int) -> str:
        return self._branch_names.get(branch_id, str(branch_id))

    def set_branch_name(self, branch_id: int, name: str) -> None:
        self._branch_names[branch_id] = name
        if self._rows:
            self.dataChanged.emit(self.index(0, COL_BRANCH), self.index(len(self._rows) - 1, COL_BRANCH))

    def clear(self) -> None:
        self.beginResetModel()
        self._rows = []
        self._index = {}
        self._branch_names = {}
        self.endResetModel()


class CandidateFilterProxy(QSortFilterProxyModel):
    """Filters by status and branch; sorts by SORT_ROLE so numbers compare as numbers."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self._statuses: frozenset[str] | None = None
        self._branches: frozenset[int] | None = None
        self.setSortRole(SORT_ROLE)
        self.setDynamicSortFilter(True)

    def set_statuses(self, statuses: set[str] | None) -> None:
        self._change_filter("_statuses", None if statuses is None else frozenset(statuses))

    def set_branches(self, branches: set[int] | None) -> None:
        self._change_filter("_branches", None if branches is None else frozenset(branches))

    def statuses(self) -> frozenset[str] | None:
        return self._statuses

    def branches(self) -> frozenset[int] | None:
        return self._branches

    def _change_filter(self, attribute: str, value) -> None:
        if getattr(self, attribute) == value:
            return
        if hasattr(self, "beginFilterChange"):   # Qt >= 6.9; invalidateRowsFilter is deprecated there
            self.beginFilterChange()
            setattr(self, attribute, value)
            self.endFilterChange(QSortFilterProxyModel.Direction.Rows)
        else:
            setattr(self, attribute, value)
            self.invalidateRowsFilter()

    def filterAcceptsRow(self, source_row: int, source_parent: QModelIndex) -> bool:
        if self._statuses is None and self._branches is None:
            return True
        row = self.sourceModel().row_at(source_row)   # direct access: no QVariant round trip per row
        if self._statuses is not None and row.status not in self._statuses:
            return False
        return self._branches is None or row.branch_id in self._branches


class CandidateTable(QWidget):
    """Filter combos over a sortable table of candidates; emits the id of the selected candidate."""

    candidate_selected = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model = CandidateTableModel(self)
        self.proxy = CandidateFilterProxy(self)
        self.proxy.setSourceModel(self.model)
        self._branch_ids: set[int] = set()

        self.status_combo = QComboBox()
        self.status_combo.addItem("All statuses", None)
        self.status_combo.addItem("measured", frozenset({"measured"}))
        self.status_combo.addItem("failed", FAILED_STATUSES)
        for status in STATUSES:
            if status != "measured":
                self.status_combo.addItem(status, frozenset({status}))
        self.status_combo.currentIndexChanged.connect(self._status_filter_changed)

        self.branch_combo = QComboBox()
        self.branch_combo.addItem("All branches", None)
        self.branch_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.branch_combo.currentIndexChanged.connect(self._branch_filter_changed)

        self.count_label = QLabel()
        self.count_label.setObjectName("hint")

        toolbar = QHBoxLayout()
        toolbar.setContentsMargins(4, 4, 4, 0)
        toolbar.addWidget(QLabel("Status"))
        toolbar.addWidget(self.status_combo)
        toolbar.addWidget(QLabel("Branch"))
        toolbar.addWidget(self.branch_combo)
        toolbar.addStretch(1)
        toolbar.addWidget(self.count_label)

        self.view = QTableView()
        self.view.setModel(self.proxy)
        self.view.setSortingEnabled(True)
        # Start unsorted: arrival order is id order, and an unsorted proxy appends a batch without
        # comparing rows (each comparison is a call into Python; sorting 50k rows takes seconds).
        self.view.horizontalHeader().setSortIndicator(-1, Qt.SortOrder.AscendingOrder)
        self.proxy.sort(-1)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.view.setAlternatingRowColors(True)
        self.view.setWordWrap(False)
        self.view.verticalHeader().setVisible(False)
        # Fixed row heights: the view never measures 50k rows to lay them out.
        self.view.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.view.verticalHeader().setDefaultSectionSize(self.view.fontMetrics().height() + 6)
        header = self.view.horizontalHeader()
        header.setStretchLastSection(True)
        header.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        header.customContextMenuRequested.connect(self._show_column_menu)
        self.view.selectionModel().selectionChanged.connect(self._selection_changed)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        layout.addLayout(toolbar)
        layout.addWidget(self.view, 1)
        self.proxy.rowsInserted.connect(self._update_count)
        self.proxy.rowsRemoved.connect(self._update_count)
        self.proxy.modelReset.connect(self._update_count)
        self.proxy.layoutChanged.connect(self._update_count)
        self._update_count()

    # -- feeding (forwarded to the model) -----------------------------------------------------
    def add_rows(self, rows: list[CandidateRow]) -> None:
        self.model.add_rows(rows)
        self._note_branches({row.branch_id for row in rows})

    def update_row(self, row: CandidateRow) -> None:
        self.model.update_row(row)
        self._note_branches({row.branch_id})

    def set_branch_name(self, branch_id: int, name: str) -> None:
        self.model.set_branch_name(branch_id, name)
        self._note_branches({branch_id})
        position = self.branch_combo.findData(branch_id)
        if position >= 0:
            self.branch_combo.setItemText(position, self._branch_label(branch_id))

    def clear(self) -> None:
        self.model.clear()
        self._branch_ids.clear()
        self.branch_combo.blockSignals(True)
        while self.branch_combo.count() > 1:
            self.branch_combo.removeItem(1)
        self.branch_combo.setCurrentIndex(0)
        self.branch_combo.blockSignals(False)
        self.proxy.set_branches(None)

    # -- selection ----------------------------------------------------------------------------
    def selected_id(self) -> int | None:
        rows = self.view.selectionModel().selectedRows()
        if not rows:
            return None
        source = self.proxy.mapToSource(rows[0])
        return self.model.row_at(source.row()).id if source.isValid() else None

    def select_candidate(self, candidate_id: int) -> bool:
        """Select and show a candidate; False when it is unknown or hidden by the filters."""
        if self.selected_id() == candidate_id:
            return True
        position = self.model.position_of(candidate_id)
        if position is None:
            return False
        index = self.proxy.mapFromSource(self.model.index(position, 0))
        if not index.isValid():
            return False
        flags = QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows
        self.view.selectionModel().setCurrentIndex(index, flags)
        self.view.scrollTo(index)
        return True

    def _selection_changed(self, _selected: QItemSelection, _deselected: QItemSelection) -> None:
        candidate_id = self.selected_id()
        if candidate_id is not None:
            self.candidate_selected.emit(candidate_id)

    # -- filters ------------------------------------------------------------------------------
    def set_status_filter(self, label: str) -> None:
        """Choose a status filter by its combo text ("All statuses", "measured", "failed", a status)."""
        position = self.status_combo.findText(label)
        if position < 0:
            raise ValueError(f"no status filter named {label!r}")
        self.status_combo.setCurrentIndex(position)

    def set_branch_filter(self, branch_id: int | None) -> None:
        position = 0 if branch_id is None else self.branch_combo.findData(branch_id)
        if position < 0:
            raise ValueError(f"no branch {branch_id} in the table")
        self.branch_combo.setCurrentIndex(position)

    def _status_filter_changed(self, position: int) -> None:
        statuses = self.status_combo.itemData(position)
        self.proxy.set_statuses(None if statuses is None else set(statuses))

    def _branch_filter_changed(self, position: int) -> None:
        branch_id = self.branch_combo.itemData(position)
        self.proxy.set_branches(None if branch_id is None else {branch_id})

    def _branch_label(self, branch_id: int) -> str:
        return f"branch {self.model.branch_name(branch_id)}"

    def _note_branches(self, branch_ids: set[int]) -> None:
        for branch_id in sorted(branch_ids - self._branch_ids):
            self._branch_ids.add(branch_id)
            self.branch_combo.addItem(self._branch_label(branch_id), branch_id)

    def _update_count(self, *_args) -> None:
        shown, total = self.proxy.rowCount(), self.model.rowCount()
        self.count_label.setText(f"{total:,} candidates" if shown == total else f"{shown:,} of {total:,} shown")

    # -- column chooser -----------------------------------------------------------------------
    def column_menu(self) -> QMenu:
        """A menu of checkable actions, one per column, that hide and show columns."""
        menu = QMenu(self)
        for column, title in enumerate(COLUMNS):
            action = QAction(title, menu)
            action.setCheckable(True)
            action.setChecked(not self.view.isColumnHidden(column))
            action.setData(column)
            action.toggled.connect(lambda checked, c=column: self.set_column_visible(c, checked))
            menu.addAction(action)
        return menu

    def set_column_visible(self, column: int, visible: bool) -> None:
        if not visible and self.visible_columns() == [column]:
            return   # keep at least one column, or the header (and its menu) disappears
        self.view.setColumnHidden(column, not visible)

    def visible_columns(self) -> list[int]:
        return [c for c in range(len(COLUMNS)) if not self.view.isColumnHidden(c)]

    def _show_column_menu(self, position: QPoint) -> None:
        menu = self.column_menu()
        menu.exec(self.view.horizontalHeader().mapToGlobal(position))
        menu.deleteLater()


class LineageTree(QTreeWidget):
    """Candidates under their parents, each branch under a root item; built incrementally.

    A child can arrive before its parent (parallel evaluation): it waits in an orphan map and is
    attached when the parent arrives. Past `max_items` candidates the tree stops growing and says so.
    """

    candidate_selected = Signal(int)
    ID_ROLE = Qt.ItemDataRole.UserRole

    def __init__(self, parent: QWidget | None = None, max_items: int = 20_000):
        super().__init__(parent)
        self.max_items = max_items
        self.setColumnCount(4)
        self.setHeaderLabels(["id", "status", "median (µs)", "action"])
        self.setUniformRowHeights(True)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setAlternatingRowColors(True)
        self.header().setStretchLastSection(True)
        self._items: dict[int, QTreeWidgetItem] = {}
        self._orphans: dict[int, list[CandidateRow]] = {}
        self._roots: dict[int, QTreeWidgetItem] = {}
        self._branch_names: dict[int, str] = {}
        self._cap_note: QTreeWidgetItem | None = None
        self._dropped = 0
        self._status_colors = {s: QColor(c) for s, c in STATUS_COLORS.items()}
        self.itemSelectionChanged.connect(self._selection_changed)

    # -- feeding ------------------------------------------------------------------------------
    def add_rows(self, rows: list[CandidateRow]) -> None:
        for row in rows:
            item = self._items.get(row.id)
            if item is not None:
                self._fill(item, row)
            elif len(self._items) >= self.max_items:
                self._dropped += 1   # full: new rows are neither shown nor kept waiting as orphans
            elif row.parent_id is None or row.parent_id in self._items:
                self._attach(row)
            else:
                self._orphans.setdefault(row.parent_id, []).append(row)
        if self._dropped:
            self._show_cap_note()

    def update_row(self, row: CandidateRow) -> None:
        self.add_rows([row])

    def set_branch_name(self, branch_id: int, name: str) -> None:
        self._branch_names[branch_id] = name
        root = self._roots.get(branch_id)
        if root is not None:
            root.setText(0, f"branch {name}")

    def clear(self) -> None:
        super().clear()
        self._items.clear()
        self._orphans.clear()
        self._roots.clear()
        self._branch_names.clear()
        self._cap_note = None
        self._dropped = 0

    def item_for(self, candidate_id: int) -> QTreeWidgetItem | None:
        return self._items.get(candidate_id)

    def orphan_count(self) -> int:
        return sum(len(waiting) for waiting in self._orphans.values())

    def is_capped(self) -> bool:
        return self._dropped > 0

    def _attach(self, first: CandidateRow) -> None:
        pending = [first]
        while pending:   # a stack, not recursion: a long chain of orphans must not hit the limit
            row = pending.pop()
            if len(self._items) >= self.max_items:
                self._dropped += 1
                continue
            parent = self._root(row.branch_id) if row.parent_id is None else self._items[row.parent_id]
            item = QTreeWidgetItem()
            item.setData(0, self.ID_ROLE, row.id)
            self._fill(item, row)
            parent.addChild(item)
            self._items[row.id] = item
            pending.extend(self._orphans.pop(row.id, ()))

    def _fill(self, item: QTreeWidgetItem, row: CandidateRow) -> None:
        item.setText(0, str(row.id))
        item.setText(1, row.status)
        item.setForeground(1, self._status_colors.get(row.status, QColor("#1f2328")))
        item.setText(2, format_median_us(row.median_ms))
        item.setText(3, row.action)
        if row.reason:
            item.setToolTip(1, row.reason)

    def _root(self, branch_id: int) -> QTreeWidgetItem:
        root = self._roots.get(branch_id)
        if root is None:
            root = QTreeWidgetItem([f"branch {self._branch_names.get(branch_id, branch_id)}"])
            font = root.font(0)
            font.setBold(True)
            root.setFont(0, font)
            self.addTopLevelItem(root)
            root.setExpanded(True)
            self._roots[branch_id] = root
        return root

    def _show_cap_note(self) -> None:
        text = (f"Lineage capped at {self.max_items:,} candidates; {self._dropped:,} more are only in the table.")
        if self._cap_note is None:
            self._cap_note = QTreeWidgetItem([text])
            self._cap_note.setFlags(Qt.ItemFlag.ItemIsEnabled)
            self._cap_note.setForeground(0, QColor("#9a6700"))
            self.addTopLevelItem(self._cap_note)
            self._cap_note.setFirstColumnSpanned(True)
        else:
            self._cap_note.setText(0, text)

    # -- selection ----------------------------------------------------------------------------
    def selected_id(self) -> int | None:
        items = self.selectedItems()
        if not items:
            return None
        value = items[0].data(0, self.ID_ROLE)
        return None if value is None else int(value)

    def select_candidate(self, candidate_id: int) -> bool:
        item = self._items.get(candidate_id)
        if item is None:
            return False
        if self.currentItem() is not item or not item.isSelected():
            self.setCurrentItem(item)
        self.scrollToItem(item)   # also expands the ancestors
        return True

    def _selection_changed(self) -> None:
        candidate_id = self.selected_id()
        if candidate_id is not None:
            self.candidate_selected.emit(candidate_id)


__all__ = [
    "CandidateFilterProxy",
    "CandidateRow",
    "CandidateTable",
    "CandidateTableModel",
    "LineageTree",
    "SORT_ROLE",
]
