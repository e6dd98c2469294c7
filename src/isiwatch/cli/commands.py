"""The ``isiwatch`` command line: a thin click layer over the Python API."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .. import __version__

if TYPE_CHECKING:
    from ..watch.config import ConfigFile

    _StatsType = click.ParamType[tuple[float, ...]]
else:  # click's annotations make ParamType generic; older clicks cannot subscript it at run time
    _StatsType = click.ParamType


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise click.BadParameter("CUDA requested but no CUDA device is available", param_hint="--device")
    return name


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
            from ..io.checkpoint import CheckpointError
            from ..io.data import DataError
            from ..taps import TapError

            known = (CheckpointError, DataError, TapError, FileNotFoundError, ValueError, OSError)
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


class _Stats(_StatsType):
    """One number or one per channel, separated by commas or spaces: ``--mean 0.5`` or
    ``--mean 0.485,0.456,0.406`` (click options take a fixed number of values)."""

    name = "M[,M,M]"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> tuple[float, ...]:
        if isinstance(value, tuple):
            return value
        parts = value if isinstance(value, (list, tuple)) else str(value).replace(",", " ").split()
        try:
            stats = tuple(float(v) for v in parts)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number or a comma-separated list of numbers", param, ctx)
        if not 1 <= len(stats) <= 4:
            self.fail(f"{value!r}: give one value or one per channel", param, ctx)
        if not all(math.isfinite(v) for v in stats):
            self.fail(f"{value!r}: every value must be a finite number", param, ctx)
        if param is not None and param.name == "std" and not all(v > 0 for v in stats):
            self.fail(f"{value!r}: standard deviations must be positive", param, ctx)
        return stats


MEAN = click.option("--mean", type=_Stats(), help="Per-channel mean to normalise images with, e.g. 0.5 or "
                                                  "0.485,0.456,0.406 (default: the checkpoint's training args, "
                                                  "else the model's pretrained_cfg; MNIST's for --data mnist).")
ARCH = click.option("--arch", metavar="NAME",
                    help="timm architecture name (default: recorded in the checkpoint or inferred).")
STD = click.option("--std", type=_Stats(), help="Per-channel standard deviation, with --mean.")


def _inputs_line(weights: str, norm: Mapping[str, Any]) -> str:
    """Which weights and which normalisation an analysis or cut used (both change every number after it)."""
    def numbers(values: Iterable[float]) -> str:
        return ",".join(f"{v:g}" for v in values)

    return (f"weights: {'EMA (state_dict_ema)' if weights == 'ema' else 'state_dict'}; normalised with mean "
            f"{numbers(norm['mean'])} std {numbers(norm['std'])} ({norm['source']})")


class _FiniteRange(click.FloatRange):
    """click's FloatRange, refusing also nan (which passes its bounds: every comparison with it is false) and
    infinities when the range is open-ended."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{number} is not a finite number", param, ctx)
        return number


#: Upper bounds of the healing options, so that a slip (--heal-steps 1000000000000) is refused when the command
#: line is read instead of running for ever: a heal is a short fine-tune, and 10,000,000 optimizer steps of 128
#: images are more than three 300-epoch trainings on ImageNet-1k's 1,281,167 images (3.0 M steps each).
MAX_HEAL_STEPS = 10_000_000
MAX_HEAL_EPOCHS = 10_000
#: --seed: the range Lightning's seed_everything (and numpy) accept, 0 to 2**32 - 1.
MAX_SEED = 2**32 - 1
#: --serve: a week.
MAX_SERVE_SECONDS = 7 * 24 * 3600


def _check_paths(inputs: Mapping[str, Path | str | None] | None = None,
                 files: Mapping[str, Path | None] | None = None, folders: Mapping[str, Path | None] | None = None
                 ) -> frozenset[Path]:
    """Every path a command reads or writes, checked before any work (``isiwatch._utils.files.check_output``):
    ``inputs`` must be a regular file or a directory, ``files`` are file outputs and ``folders`` folder outputs,
    each in a place that can be written; keys name them in the message ("" for an argument, "--out" for an option).
    ``None`` is an option not given. Returns the files already there that an output may replace (resolved): the
    file outputs and what the output folders hold, for ``_wrote``."""
    from .._utils.files import check_input, check_output

    for name, path in (inputs or {}).items():
        if path is not None:
            check_input(path, name, "checkpoint" if not name else "file or directory")
    existing: set[Path] = set()
    for name, path in (files or {}).items():
        if path is not None and check_output(path, name).exists():
            existing.add(path.resolve())
    for name, path in (folders or {}).items():
        if path is not None and check_output(path, name, folder=True).exists():
            existing.update(p.resolve() for p in path.iterdir())
    return frozenset(existing)


def _wrote(path: Path, existing: frozenset[Path]) -> str:
    """The line naming an output written, saying when it replaced a file that was there before the command ran
    (atomically: the old file stayed whole until the new one was complete)."""
    return f"wrote {path}" + (" (replaced the existing file)" if Path(path).resolve() in existing else "")


PROGRESS = click.option("--progress/--no-progress", default=None,
                        help="Draw progress bars [default: only when stderr is a terminal].")


def _progress(force: bool | None) -> bool:
    from .._utils.progress import show_progress

    return show_progress(force)


DEVICE = click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
                      help="Where to run the model.")
#: timm train.py's default --workers.
WORKERS = click.option("--workers", type=click.IntRange(min=0), default=4, show_default=True,
                       help="DataLoader worker processes reading images (0: in the main process).")


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
    existing = _check_paths({"": checkpoint}, folders={"--out": out})  # before torch and timm load: seconds
    from ..measure.depth import recommend_depth
    from ..measure.tables import analysis_table, phases_line, recommendation_text
    from .offline import analyze_checkpoint

    result, paths = analyze_checkpoint(checkpoint, arch=arch, num_heads=num_heads, data=data, images=images, out=out,
                                       metric=metric, with_isi_recon=isi_recon, batch_size=batch_size,
                                       prefer_ema=not no_ema, mean=mean, std=std, device=_device(device),
                                       echo=lambda line: click.echo(line, err=True), workers=workers)
    click.echo(_inputs_line(result.model_info["weights"], result.model_info["normalization"]))
    click.echo(analysis_table(result))
    click.echo(phases_line(result))
    click.echo(f"recommended depth: {recommendation_text(recommend_depth(result).to_dict())}")
    for path in paths:
        click.echo(_wrote(path, existing))


@main.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("isiwatch-demo"),
              show_default=True, help="Run directory.")
@click.option("--quick", is_flag=True, help="A smaller, shorter run: fewer training steps, images and candidate "
                                            "cuts.")
@click.option("--config", "watch_config", type=click.Path(dir_okay=False, path_type=Path),
              help="isiwatch.yaml whose Watch options override the demo's defaults.")
@click.option("--prometheus-port", type=click.IntRange(0, 65535), default=9108, show_default=True,
              help="Port for the Prometheus endpoint on 127.0.0.1 while training: 9108 is the one the "
                   "prometheus.yml of 'isiwatch deploy DIR' scrapes (0: any free port).")
@click.option("--serve", type=_FiniteRange(0, MAX_SERVE_SECONDS), default=0, show_default=True, metavar="SECONDS",
              help="Keep the Prometheus endpoint up for SECONDS after the demo finishes (from training on), so a "
                   "scraping Prometheus can fire alerts with a for: delay; Ctrl-C ends it (0: close after training).")
@PROGRESS
@DEVICE
def demo(out: Path, quick: bool, watch_config: Path | None, prometheus_port: int, serve: float, progress: bool | None,
         device: str) -> None:
    """Train a ViT on the embedded MNIST digits with Watch, analyse it, truncate it, write a report.

    The --out folder holds one run: the files an earlier demo wrote there are removed first (other files stay), and a
    folder a Watch is writing is refused."""
    from .._utils.threads import set_torch_threads
    from .demo import run_demo

    _check_paths(folders={"--out": out})
    if watch_config is not None:
        from ..watch.config import load_yaml

        load_yaml(watch_config)  # refused before any work

    click.echo(f"torch threads: {set_torch_threads()} (the idle cores now; OMP_NUM_THREADS overrides)")
    run_demo(out, quick=quick, device=_device(device), config=watch_config, prometheus_port=prometheus_port,
             serve=serve, echo=click.echo, progress=_progress(progress))


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Where to write the plots and report.html (default: RUN_DIR/report).")
def report(run_dir: Path, out: Path | None) -> None:
    """Plots and a self-contained HTML page of a monitored run (a Watch log_dir)."""
    from .report import write_report

    existing = _check_paths(folders={"--out": out if out is not None else run_dir / "report"})
    for path in write_report(run_dir, out, warn=lambda line: click.echo(f"warning: {line}", err=True)):
        click.echo(_wrote(path, existing))


@main.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
def deploy(folder: Path) -> None:
    """Write the Prometheus configuration and alert rules, the Grafana dashboard and the docker-compose file that
    runs both into FOLDER (new or empty); then: docker compose -f FOLDER/docker-compose.yml up -d."""
    from .deploy import write_deployment

    _check_paths(folders={"": folder})
    from .._utils.files import shell_word, shown_path

    written = write_deployment(folder)  # refuses a folder that holds files before writing
    click.echo(f"wrote {len(written)} files to {shown_path(folder)}; start them with: docker compose -f "
               f"{shell_word(folder / 'docker-compose.yml')} up -d")


from ..truncation.engine import DIST_STRATEGIES, PRECISIONS  # noqa: E402  (choices; lightning loads lazily)
from ..truncation.strategies import (  # noqa: E402  (option defaults, from a module free of torch and timm)
    BRIDGE_METHODS,
    DEFAULT_BRIDGE,
    DEFAULT_BUDGET,
    DEFAULT_CONFIDENCE,
    DEFAULT_MAX_DROP,
    DEFAULT_STRATEGY,
    HEAL_EPOCHS,
    HEAL_LR,
    STRATEGIES,
)

#: Exit status of ``isiwatch truncate`` when ``auto`` certified no cut (no model written); bad input exits 1.
NO_CERTIFIED_CUT = 3


@main.command(epilog=f"Exit status: 0 a cut was written; 1 bad input or an error (one line, nothing written); "
                     f"{NO_CERTIFIED_CUT} auto certified no cut (no model written, --report still written; the last "
                     "line says what --max-drop or how many validation images would certify the nearest candidate).")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Where to write the truncated checkpoint (a new directory for a Hugging Face model).")
@click.option("--analysis", type=click.Path(dir_okay=False, path_type=Path),
              help="analysis.json of this checkpoint (default: analyse it on --data).")
@click.option("--data", default="mnist", show_default=True, metavar="mnist|DIR",
              help="Healing and held-out images: 'mnist' (the embedded digits) or a folder tree or tar file that timm "
                   "reads (20 % held out, unless it has train/ and validation/ sub-folders: heal on train, evaluate "
                   "on validation); streamed, with timm's train-time transform for healing and its eval transform "
                   "for validation and test, as train.py and validate.py build them for this checkpoint.")
@click.option("--eval-data", metavar="DIR",
              help="Folder tree or tar file to validate and test on (halved); all of --data heals.")
@click.option("--dataset", metavar="NAME",
              help="A dataset timm's create_dataset reads, named as train.py's --dataset, with --data its root: "
                   "torch/<name> (a torchvision dataset already under --data; nothing is downloaded), hfds/<name> "
                   "(needs the datasets package) or '' (a folder tree); --train-split heals, --val-split (of "
                   "--eval-data when given) is halved into validation and test.")
@click.option("--train-split", default="train", show_default=True, metavar="SPLIT",
              help="With --dataset: the split that heals.")
@click.option("--val-split", default="validation", show_default=True, metavar="SPLIT",
              help="With --dataset: the split validated and tested on.")
@click.option("--class-map", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="JSON object of class folder name to model output index (or a JSON list of the names in output "
                   "order) [default: the checkpoint's recorded map, else numeric folder names as indices, else "
                   "timm's sorted-name numbering]. auto stops before any healing when the uncut model is not above "
                   "chance on the validation images (one-sided exact test at --confidence): labels that do not "
                   "match.")
@click.option("--strategy", type=click.Choice(("auto", *STRATEGIES)),
              help=f"Which blocks to drop [default: auto; {DEFAULT_STRATEGY} with --keep]. auto: the cheapest "
                   "healed cut within --max-drop; "
                   + "; ".join(f"{name}: {s.description}" for name, s in STRATEGIES.items()) + ".")
@click.option("--keep", type=click.IntRange(min=1),
              help="Blocks to keep (default: the plateau cut's depth for plateau, the recommended depth for the other "
                   "fixed strategies).")
@click.option("--max-drop", type=_FiniteRange(0, 100, max_open=True), default=DEFAULT_MAX_DROP, show_default=True,
              help="auto: accuracy points a cut may lose.")
@click.option("--confidence", type=_FiniteRange(0, 1, max_open=True), default=DEFAULT_CONFIDENCE, show_default=True,
              help="auto: confidence that no certified cut loses more than --max-drop: exact upper bounds of the "
                   "paired validation drop, one sequence tested in a fixed order from the fewest blocks dropped, "
                   "each cut repaired as the healing images choose, stopping at its first failure; refused before "
                   "any healing when the validation images cannot certify a cut that changes nothing; 0: the "
                   "observed drop.")
@click.option("--budget", type=click.IntRange(min=1), default=DEFAULT_BUDGET, show_default=True,
              help="auto: candidates healed at most (each in full).")
@click.option("--train-last", type=click.IntRange(min=0),
              help="Kept blocks to fine-tune, counted from the end (default: half; auto's cuts that keep fewer train "
                   "all of theirs).")
@click.option("--epochs", type=click.IntRange(0, MAX_HEAL_EPOCHS), default=HEAL_EPOCHS, show_default=True,
              help="Healing epochs (0: cut only), unless --heal-steps is given.")
@click.option("--heal-steps", type=click.IntRange(1, MAX_HEAL_STEPS),
              help="Optimizer steps of a full heal (batches of 128; default: --epochs); the bound refuses a slip that "
                   "would heal for ever (more steps than three 300-epoch ImageNet-1k trainings).")
@click.option("--bridge", type=click.Choice(BRIDGE_METHODS), default=DEFAULT_BRIDGE, show_default=True,
              help="auto: repair a cut without training by a linear map fitted on --images healing images "
                   "(least squares, or refined on cosine distance) and merged into the block before the dropped "
                   "ones; each cut is tested as it is, bridged or healed, the least repair that would qualify "
                   "with its rates of discordant images among those images (no validation image is read); none: "
                   "cuts as they are and healed only.")
@click.option("--resume", is_flag=True,
              help="auto: continue the search journalled in OUT.search.jsonl without healing its finished "
                   "candidates again.")
@click.option("--lr", type=_FiniteRange(min=0, min_open=True), default=HEAL_LR, show_default=True,
              help="Peak healing learning rate.")
@click.option("--distill", is_flag=True, help="Also distil the uncut model's logits while healing.")
@click.option("--metric", help="Curve whose plateau sets the cut (default: the analysis's, else token_similarity).")
@click.option("--images", type=click.IntRange(min=4), default=1000, show_default=True,
              help="Images for the analysis and the block scores.")
@click.option("--format", "fmt", type=click.Choice(["pt", "safetensors"]), default="pt", show_default=True)
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path), help="Also write the report as JSON.")
@ARCH
@click.option("--num-heads", type=click.IntRange(min=1),
              help="Attention heads, for a checkpoint that records neither them nor an architecture.")
@click.option("--no-ema", is_flag=True, help="Use state_dict even when state_dict_ema is present.")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
              help="Healing order and random strategy seed (Lightning's seed_everything range).")
@MEAN
@STD
@PROGRESS
@click.option("--accelerator", "--device", "device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True, help="Where to heal and evaluate (Lightning Fabric's accelerator).")
@click.option("--devices", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes per node, each healing and evaluating its shard of the images; Fabric starts them "
                   "(or torchrun/SLURM did).")
@click.option("--num-nodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Nodes, under torchrun or SLURM.")
@click.option("--dist-strategy", type=click.Choice(DIST_STRATEGIES), default="auto", show_default=True,
              help="Lightning Fabric's strategy over several devices (--strategy chooses the blocks).")
@click.option("--precision", type=click.Choice(PRECISIONS),
              help="Healing and evaluation precision [default: bf16-mixed on CUDA, else 32].")
@click.option("--batch-size", type=click.IntRange(min=1), default=128, show_default=True,
              help="Images per batch over all processes (each of --devices takes its share), so a run heals "
                   "alike on any number of processes.")
@WORKERS
def truncate(checkpoint: Path, out: Path, analysis: Path | None, data: str, eval_data: str | None, dataset: str | None,
             train_split: str, val_split: str, class_map: Path | None, strategy: str | None, keep: int | None,
             max_drop: float, confidence: float, budget: int, train_last: int | None, epochs: int,
             heal_steps: int | None, bridge: str, resume: bool, lr: float, distill: bool,
             metric: str | None, images: int, fmt: str, report: Path | None, arch: str | None,
             num_heads: int | None, no_ema: bool, seed: int, mean: tuple[float, ...] | None,
             std: tuple[float, ...] | None, progress: bool | None, device: str, devices: int, num_nodes: int,
             dist_strategy: str, precision: str | None, batch_size: int, workers: int) -> None:
    """Cut a trained ViT to the cheapest depth within an accuracy bound (or by a fixed strategy) and heal it by
    fine-tuning its late blocks."""
    ctx = click.get_current_context()
    search_only = ("max_drop", "confidence", "budget", "bridge", "resume")
    typed = any(ctx.get_parameter_source(n) is click.core.ParameterSource.COMMANDLINE for n in search_only)
    auto = (strategy or ("auto" if keep is None else "")) == "auto"
    if typed and not auto:  # a config file's default is no request
        raise click.UsageError("--max-drop, --confidence, --budget, --bridge and --resume apply to "
                               "--strategy auto only")
    splits = [n for n in ("train_split", "val_split")
              if ctx.get_parameter_source(n) is click.core.ParameterSource.COMMANDLINE]
    if splits and dataset is None:
        raise click.UsageError("--train-split and --val-split name the splits of a --dataset")
    hugging_face = checkpoint.is_dir()  # a save_pretrained directory: --out is a new directory
    existing = _check_paths({"": checkpoint}, files={"--report": report, **({} if hugging_face else {"--out": out})},
                            folders={"--out": out} if hugging_face else {})  # before torch and timm load: seconds
    from .._utils.option_error import OptionError
    from ..io.timm_data import TimmDataset
    from ..truncation.data_split import Data
    from ..truncation.explain import story_lines
    from ..truncation.journal import journal_path
    from ..truncation.truncate import candidates_table, report_table, truncate
    from ..truncation.truncate_report import no_cut_line, verdict_line

    heal_data: Data = data if dataset is None else TimmDataset(dataset, data, train_split)
    evaluation: Data | None = eval_data if dataset is None else TimmDataset(dataset, eval_data or data, val_split)
    try:
        result = truncate(checkpoint, out, analysis=analysis, data=heal_data, eval_data=evaluation, strategy=strategy,
                          keep=keep, max_drop=max_drop, confidence=confidence, budget=budget, train_last=train_last,
                          epochs=epochs, heal_steps=heal_steps, bridge=bridge,
                          journal=journal_path(out) if auto else None, resume=resume, lr=lr, distill=distill,
                          metric=metric, images=images, fmt=fmt, report=report, arch=arch, num_heads=num_heads,
                          prefer_ema=not no_ema, mean=mean, std=std, device=_device(device), seed=seed,
                          progress=_progress(progress), devices=devices, num_nodes=num_nodes,
                          dist_strategy=dist_strategy, precision=precision, batch_size=batch_size, workers=workers,
                          echo=click.echo, class_map=class_map)
    except OptionError as exc:  # worded with this command's flags (--keep K), not Python's parameters (keep=K)
        raise click.ClickException(exc.worded({p.name: p.opts[0] for p in ctx.command.params if p.name})) from None
    if not result.writer:  # another process of a distributed run prints and writes
        return
    click.echo(_inputs_line(result.report["weights"], result.report["normalization"]))
    click.echo("images: " + "; ".join(f"{part} {d['images']} of {d['of']} in {d['source']}"
                                      for part, d in result.report["data"].items()))
    if result.report["search"]:
        click.echo(candidates_table(result.report))
    click.echo(report_table(result.report))
    if result.report["search"]:
        click.echo(verdict_line(result.report))
    for line in story_lines(result.report):
        click.echo(line)
    for path in result.paths:
        click.echo(_wrote(path, existing))
    if result.report.get("validate_command"):
        click.echo("evaluate it with timm's validate.py (in timm's source repository, not its wheel: git clone "
                   f"https://github.com/huggingface/pytorch-image-models): {result.report['validate_command']}")
    if not result.cut:
        click.echo(no_cut_line(result.report))
        ctx.exit(NO_CERTIFIED_CUT)


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
    from ..io.models import specialize_checkpoint
    from ..specialization.convert import parse_qkv_blocks

    existing = _check_paths({"": checkpoint}, files={"--out": out})

    report = specialize_checkpoint(checkpoint, out, arch=arch, num_heads=num_heads, norms=norms,
                                   qkv_blocks=parse_qkv_blocks(qkv_blocks), lora_rank=lora_rank,
                                   layer_scale=layer_scale, fmt=fmt, prefer_ema=not no_ema)
    click.echo(f"specialised {report['arch']}: {report['options']}")
    click.echo(f"parameters {report['base']:,} + {report['added']:,} prefix-token ({100 * report['fraction']:.2f} %); "
               f"max |output change| at conversion {report['max_abs_diff']:.1e}")
    click.echo(_wrote(report["out"], existing))

