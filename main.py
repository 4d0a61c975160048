#!/usr/bin/env python3
"""Start the CUDA Agent desktop app: python main.py [TASK_OR_PROGRAM_FILE]"""
import sys

from app.main import main

if __name__ == "__main__":  # compile workers are spawned and re-import this file: keep it inert
    sys.exit(main())
