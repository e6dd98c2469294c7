"""The ``isiwatch`` command line: a thin click layer over the Python API."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from . import __version__


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise click.BadParameter("CUDA requested but no CUDA device is available", param_hint="--device")
    return name


class _Cli(click.Group):
    """Turns every error into one line and a non-zero exit (set ISIWATCH_DEBUG=1 for tracebacks)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            if os.environ.get("ISIWATCH_DEBUG"):
                raise
            from .checkpoint import CheckpointError
            from .data import DataError
            from .taps import TapError

            known = (CheckpointError, DataError, TapError, FileNotFoundError, ValueError, OSError)
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if not isinstance(exc, known):
                message = f"internal error ({type(exc).__name__}): {message}"
            raise click.ClickException(message) from None


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="isiwatch")
def main() -> None:
    """Watch Vision Transformers while they train: ISI, probes, Cliff → Plateau → Climb."""


DEVICE = click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
                      help="Where to run the model.")


@main.command()
@click.argument("checkpoint", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--arch", help="timm architecture name (default: recorded in the checkpoint or inferred).")
@click.option("--data", default="mnist", show_default=True,
              help="'mnist' (the embedded digits) or an ImageFolder directory.")
@click.option("--images", type=click.IntRange(min=4), default=1000, show_default=True,
              help="Number of probe images.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("isiwatch-analysis"),
              show_default=True, help="Output directory for analysis.json and curves.png.")
@click.option("--metric", default="token_similarity", show_default=True, help="Curve used for the phases.")
@click.option("--isi-recon", is_flag=True, help="Also compute the reconstruction form of ISI (slower).")
@click.option("--batch-size", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--no-ema", is_flag=True, help="Use state_dict even when state_dict_ema is present.")
@DEVICE
def analyze(checkpoint, arch, data, images, out, metric, isi_recon, batch_size, no_ema, device) -> None:
    """Per-layer diagnostics of a trained ViT checkpoint."""
    from .offline import analyze_checkpoint
    from .tables import analysis_table, phases_line

    result, paths = analyze_checkpoint(checkpoint, arch=arch, data=data, images=images, out=out, metric=metric,
                                       with_isi_recon=isi_recon, batch_size=batch_size, prefer_ema=not no_ema,
                                       device=_device(device))
    click.echo(analysis_table(result))
    click.echo(phases_line(result))
    for path in paths:
        click.echo(f"wrote {path}")


@main.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("isiwatch-demo"),
              show_default=True, help="Run directory.")
@click.option("--epochs", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--quick", is_flag=True, help="A shorter run (2 epochs) for smoke tests.")
@DEVICE
def demo(out, epochs, quick, device) -> None:
    """Train a small ViT on the embedded MNIST digits and analyse it."""
    from .demo import run_demo

    run_demo(out, epochs=2 if quick else epochs, device=_device(device), echo=click.echo)


# --- truncate command (issue 6) goes here ---

# --- specialize command (issue 8) goes here ---


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
