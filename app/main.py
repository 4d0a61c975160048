"""Entry point of the desktop app: `python main.py [FILE]` or `cuda-agent-gui [FILE]`.

Arguments are parsed before Qt is imported, so --help works anywhere, fast.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Sequence


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("cuda-agent")
    except PackageNotFoundError:
        return "development checkout"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cuda-agent-gui",
        description="CUDA Agent desktop app: open a PyTorch reference task, view a kernel program "
                    "next to it, check that it compiles, run a search and follow it live, open a "
                    "project and export its kernels. Without FILE a welcome page lists the example "
                    "tasks and recent files.")
    parser.add_argument("file", nargs="?", metavar="FILE",
                        help="a task file (.py, KernelBench format), a program file (.json kernel "
                             "program, or a .py defining ModelNew) or a project (.cuagent)")
    parser.add_argument("--quit-after", type=float, metavar="SECONDS",
                        help="close the window after SECONDS (for smoke tests of the installation)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def display_problem() -> str | None:
    """Why no window can be shown here, or None. Qt itself would abort with a plugin message."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return None
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return None
    return ("No display found (neither DISPLAY nor WAYLAND_DISPLAY is set). Run the app on a desktop "
            "session, use the headless CLI (`cuda-agent --help`), or set QT_QPA_PLATFORM=offscreen "
            "to start it without a screen.")


def create_application(argv: Sequence[str] | None = None):
    """The QApplication (reused when one exists), with the app's names and look."""
    from PySide6.QtWidgets import QApplication

    from app.settings import APPLICATION, ORGANIZATION
    from app.theme import apply_theme

    app = QApplication.instance()
    if app is None:
        app = QApplication(list(argv) if argv is not None else sys.argv[:1])
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    apply_theme(app)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (already printed)
        return exc.code if isinstance(exc.code, int) else 2
    problem = display_problem()
    if problem:
        print(f"cuda-agent-gui: {problem}", file=sys.stderr)
        return 2

    app = create_application()
    from PySide6.QtCore import QTimer

    from app.main_window import MainWindow

    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl+C in the terminal ends the app
    window = MainWindow()
    window.show()
    if args.file:
        window.open_path(args.file)
    if args.quit_after is not None:
        QTimer.singleShot(max(0, int(args.quit_after * 1000)), window.close)
    return app.exec()
