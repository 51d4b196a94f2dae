"""The ``shardkit`` command line: a click group, one thin module per command.

Every module in this package that defines ``command`` (a click command) is added to the
group. Exit codes: 0 ok, 1 problems found (any :class:`ShardkitError`, one line saying
what and where), 2 usage.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import click

from shardkit._version import __version__
from shardkit.errors import ShardkitError

__all__ = ["cli", "main", "one_line"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="shardkit")
def cli() -> None:
    """Build, verify and stream WebDataset-format shards with checksum manifests."""


def _register() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        command = getattr(module, "command", None)
        if isinstance(command, click.Command):
            cli.add_command(command)


_register()


def one_line(exc: ShardkitError) -> str:
    """The error's own message: a DataLoader worker's error comes wrapped in the worker's
    whole traceback ("Caught X in DataLoader worker process 0. Original Traceback ..."),
    whose last line is the message that names the shard and offset."""
    text = str(exc)
    if "Original Traceback" not in text:
        return text
    last = text.rstrip().rsplit("\n", 1)[-1]
    _, sep, rest = last.partition(f"{type(exc).__name__}: ")
    return rest if sep else last


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, mapping shardkit errors to exit 1 with one line."""
    try:
        # without standalone mode, click returns ctx.exit(code)'s code instead of raising
        rc = cli.main(args=argv, prog_name="shardkit", standalone_mode=False)
        if isinstance(rc, int) and not isinstance(rc, bool) and rc:
            sys.exit(rc)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except ShardkitError as exc:
        click.echo(f"error: {one_line(exc)}", err=True)
        sys.exit(1)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    sys.exit(0)
