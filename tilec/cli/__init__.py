"""The command line, the top layer: `tilec check|show|compile|run|bench|tune|taxes|calibrate`."""

from tilec.cli.commands import EXIT_CODES, main

__all__ = ["EXIT_CODES", "main"]
