"""The `linstream` command line."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="linstream")
    parser.add_subparsers(dest="command", required=True)
    parser.parse_args(sys.argv[1:] if argv is None else argv)
    return 0
