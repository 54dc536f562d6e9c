"""``dualtrain`` command line: a root group that only registers subcommands and maps errors.

User mistakes (UserError, click usage errors) print one line and exit 2; a failed run (RunFailed)
prints one line and exits 1. No traceback for either.
"""

from __future__ import annotations

import signal
import sys

import click

from dualtrain import __version__
from dualtrain.cli.compare import compare
from dualtrain.cli.diff_models import diff_models
from dualtrain.cli.env import env
from dualtrain.cli.export import export
from dualtrain.cli.run import run
from dualtrain.errors import RunFailed, UserError
from dualtrain.launch.local import Terminated


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="dualtrain")
def cli() -> None:
    """Compile one experiment spec into a PyTorch DDP run and a TensorFlow/Keras 3 run, and check
    that they train the same way.

    \b
    Examples:
      dualtrain run --backend torch --config configs/mnist_mlp.yaml --world-size 2
      dualtrain run --backend tf --config configs/mnist_mlp.yaml --set tf.strategy=multi_worker
      dualtrain compare --config configs/mnist_mlp.yaml --world-size 2
      dualtrain compare runs/a runs/b
      dualtrain run --resume runs/a
      dualtrain export runs/a --format keras
      dualtrain env
      dualtrain diff-models --config configs/port_resnet.yaml
    """


cli.add_command(run)
cli.add_command(compare)
cli.add_command(export)
cli.add_command(env)
cli.add_command(diff_models)


def _interrupted(cause: BaseException | None) -> None:
    """Ctrl-C (exit 130) or SIGTERM (exit 143); the launcher has stopped the workers either way."""
    if isinstance(cause, Terminated):
        click.echo(f"dualtrain: stopped by {signal.Signals(cause.signum).name}", err=True)
        sys.exit(128 + cause.signum)
    click.echo("dualtrain: interrupted", err=True)
    sys.exit(130)


def main(argv: list[str] | None = None) -> None:
    try:
        code = cli.main(args=argv, prog_name="dualtrain", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # "dualtrain" alone: show the help
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        sys.exit(0)
    except click.UsageError as exc:
        click.echo(f"dualtrain: error: {exc.format_message()}", err=True)
        sys.exit(2)
    except UserError as exc:
        click.echo(f"dualtrain: error: {exc}", err=True)
        sys.exit(2)
    except RunFailed as exc:
        click.echo(f"dualtrain: error: {exc}", err=True)
        if exc.hard_exit:  # a rank of an external launcher whose collective failed (RunFailed)
            from dualtrain.runtime.entry import exit_now  # lazy: heavy (+60 ms on dualtrain --help)

            exit_now(1)
        sys.exit(1)
    except click.exceptions.Abort as exc:  # click turns KeyboardInterrupt into Abort
        _interrupted(exc.__cause__)
    except KeyboardInterrupt as exc:
        _interrupted(exc)
    sys.exit(code if isinstance(code, int) else 0)
