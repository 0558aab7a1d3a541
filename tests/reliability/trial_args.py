"""What the reliability trials share on their command line."""

import argparse
import os


def webhook_binary(path: str) -> str:
    """argparse type of the trials' first argument: the webhook binary, refused with one line
    naming it where it is not an executable file (a traceback from deep in a trial before)."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise argparse.ArgumentTypeError(
            f"{path} is not an executable file: build it first (make build), or give the "
            "path of build/webhook/kv-offload-webhook")
    return path
