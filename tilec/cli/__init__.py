"""The command line, the top layer: `tilec check|show|compile|run|bench|tune|taxes|calibrate`."""

from tilec.cli.commands import main

__all__ = ["main"]
