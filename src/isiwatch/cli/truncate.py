"""``isiwatch truncate``: the command over [`truncate`][isiwatch.truncate]. Its options are ``truncate``'s keyword
options under the same names (`TruncateOptions`, whose defaults they show) and are passed on as they are; the
command adds only what a command line needs: ``--dataset`` and its splits, ``--no-ema``, ``--device auto``, the
journal beside ``--out``, its own exit status when nothing was certified (`NO_CERTIFIED_CUT`) and an answer to
SIGTERM and SIGINT (`_interrupted_line`; exit 128 + the signal's number)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .._utils.option_error import OptionError
from .._utils.wording import counted
from ..truncation.engine import DIST_STRATEGIES, PRECISIONS  # choices; lightning loads lazily
from ..truncation.journal import finished_candidates, journal_path
from ..truncation.options import OPTION_DEFAULTS, REPORT_FORMATS, report_format  # free of torch and timm
from ..truncation.strategies import BRIDGE_METHODS, DEFAULT_STRATEGY, STRATEGIES
from . import shared
from .interrupts import Interrupted, raising_interrupts

if TYPE_CHECKING:
    from ..truncation.truncate import TruncateResult

__all__ = ["NO_CERTIFIED_CUT", "truncate"]

#: Exit status of ``isiwatch truncate`` when ``auto`` certified no cut (no model written); bad input exits 1.
NO_CERTIFIED_CUT = 3


def _python_default(name: str) -> dict[str, Any]:
    """click's ``default`` (shown in the help) of the option that sets ``truncate``'s keyword ``name``: its own."""
    return {"default": OPTION_DEFAULTS[name], "show_default": True}


@click.command(epilog=f"Exit status: 0 a cut was written; 1 bad input or an error (one line, nothing written); "
                     f"{NO_CERTIFIED_CUT} auto certified no cut (no model written, --report still written; the last "
                     "line says what --max-drop or how many validation images would certify the nearest candidate); "
                     "143 SIGTERM, 130 SIGINT (one line says what was kept: auto's journal resumes with --resume; "
                     "nothing else written).")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Where to write the truncated checkpoint (a new directory for a Hugging Face model).")
@click.option("--analysis", type=click.Path(dir_okay=False, path_type=Path),
              help="analysis.json of this checkpoint (default: analyse it on --data).")
@click.option("--data", **_python_default("data"), metavar="mnist|DIR",
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
@click.option("--max-drop", type=shared.FiniteRange(0, 100, max_open=True), **_python_default("max_drop"),
              help="auto: accuracy points a cut may lose.")
@click.option("--confidence", type=shared.FiniteRange(0, 1, max_open=True), **_python_default("confidence"),
              help="auto: confidence that no certified cut loses more than --max-drop: exact upper bounds of the "
                   "paired validation drop, one sequence tested in a fixed order from the fewest blocks dropped, "
                   "each cut repaired as the healing images choose, stopping at its first failure; refused before "
                   "any healing when the validation images cannot certify a cut that changes nothing; 0: the "
                   "observed drop.")
@click.option("--budget", type=click.IntRange(min=1), **_python_default("budget"),
              help="auto: candidates healed at most (each in full).")
@click.option("--train-last", type=click.IntRange(min=0),
              help="Kept blocks to fine-tune, counted from the end (default: half; auto's cuts that keep fewer train "
                   "all of theirs).")
@click.option("--epochs", type=click.IntRange(0, shared.MAX_HEAL_EPOCHS), **_python_default("epochs"),
              help="Healing epochs (0: cut only), unless --heal-steps is given.")
@click.option("--heal-steps", type=click.IntRange(1, shared.MAX_HEAL_STEPS),
              help="Optimizer steps of a full heal (batches of 128; default: --epochs); the bound refuses a slip that "
                   "would heal for ever (more steps than three 300-epoch ImageNet-1k trainings).")
@click.option("--bridge", type=click.Choice(BRIDGE_METHODS), **_python_default("bridge"),
              help="auto: repair a cut without training by a linear map fitted on --images healing images "
                   "(least squares, or refined on cosine distance) and merged into the block before the dropped "
                   "ones; each cut is tested as it is, bridged or healed, the least repair that would qualify "
                   "with its rates of discordant images among those images (no validation image is read); none: "
                   "cuts as they are and healed only.")
@click.option("--resume", is_flag=True,
              help="auto: continue the search journalled in OUT.search.jsonl without healing its finished "
                   "candidates again.")
@click.option("--lr", type=shared.FiniteRange(min=0, min_open=True), **_python_default("lr"),
              help="Peak healing learning rate (default: 1e-3, or the rate the checkpoint records it was trained at "
                   "when that is lower).")
@click.option("--distill", is_flag=True, help="Also distil the uncut model's logits while healing.")
@click.option("--metric", help="Curve whose plateau sets the cut (default: the analysis's, else token_similarity).")
@click.option("--images", type=click.IntRange(min=4), **_python_default("images"),
              help="Images for the analysis and the block scores.")
@click.option("--format", "fmt", type=click.Choice(["pt", "safetensors"]), **_python_default("fmt"))
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Also write the report, in the format the extension names: "
                   + ", ".join(f"{k} {v}" for k, v in REPORT_FORMATS.items())
                   + " (a self-contained page, the truncation as isiwatch report shows it).")
@shared.ARCH
@click.option("--num-heads", type=click.IntRange(min=1),
              help="Attention heads, for a checkpoint that records neither them nor an architecture.")
@click.option("--no-ema", is_flag=True, help="Use state_dict even when state_dict_ema is present.")
@click.option("--seed", type=click.IntRange(0, shared.MAX_SEED), **_python_default("seed"),
              help="Healing order and random strategy seed (Lightning's seed_everything range).")
@shared.MEAN
@shared.STD
@shared.PROGRESS
@click.option("--accelerator", "--device", "device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True, help="Where to heal and evaluate (Lightning Fabric's accelerator).")
@click.option("--devices", type=click.IntRange(min=1), **_python_default("devices"),
              help="Processes per node, each healing and evaluating its shard of the images; Fabric starts them "
                   "(or torchrun/SLURM did).")
@click.option("--num-nodes", type=click.IntRange(min=1), **_python_default("num_nodes"),
              help="Nodes, under torchrun or SLURM.")
@click.option("--dist-strategy", type=click.Choice(DIST_STRATEGIES), **_python_default("dist_strategy"),
              help="Lightning Fabric's strategy over several devices (--strategy chooses the blocks).")
@click.option("--precision", type=click.Choice(PRECISIONS),
              help="Healing and evaluation precision [default: bf16-mixed on CUDA, else 32].")
@click.option("--batch-size", type=click.IntRange(min=1), **_python_default("batch_size"),
              help="Images per batch over all processes (each of --devices takes its share), so a run heals "
                   "alike on any number of processes.")
@shared.WORKERS
def truncate(checkpoint: Path, out: Path, dataset: str | None, train_split: str, val_split: str, no_ema: bool,
             device: str, progress: bool | None, **options: Any) -> None:
    """Cut a trained ViT to the cheapest depth within an accuracy bound (or by a fixed strategy) and heal it by
    fine-tuning its late blocks."""
    ctx = click.get_current_context()
    search_only = ("max_drop", "confidence", "budget", "bridge", "resume")
    typed = any(ctx.get_parameter_source(n) is click.core.ParameterSource.COMMANDLINE for n in search_only)
    auto = (options["strategy"] or ("auto" if options["keep"] is None else "")) == "auto"
    if typed and not auto:  # a config file's default is no request
        raise click.UsageError("--max-drop, --confidence, --budget, --bridge and --resume apply to "
                               "--strategy auto only")
    splits = [n for n in ("train_split", "val_split")
              if ctx.get_parameter_source(n) is click.core.ParameterSource.COMMANDLINE]
    if splits and dataset is None:
        raise click.UsageError("--train-split and --val-split name the splits of a --dataset")
    flags = {p.name: p.opts[0] for p in ctx.command.params if p.name}
    try:
        if options["report"] is not None:
            report_format(options["report"])
    except OptionError as exc:
        raise click.ClickException(exc.worded(flags)) from None
    hugging_face = checkpoint.is_dir()  # a save_pretrained directory: --out is a new directory
    existing = shared.check_paths({"": checkpoint},
                                  files={"--report": options["report"], **({} if hugging_face else {"--out": out})},
                                  folders={"--out": out} if hugging_face else {})  # before torch and timm: seconds
    outputs = [p for p in (out, options["report"]) if p is not None]
    before = {p for p in outputs if p.exists()}
    journal = journal_path(out) if auto else None
    with raising_interrupts():
        try:
            result = _run(checkpoint, out, None if dataset is None else (dataset, train_split, val_split), device,
                          progress, flags, {**options, "journal": journal, "prefer_ema": not no_ema})
        except Interrupted as exc:
            for path in outputs:  # one of two outputs written when the signal came: neither stays
                if path not in before and path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                elif path not in before:
                    path.unlink(missing_ok=True)
            click.echo(_interrupted_line(exc.name, journal), err=True)
            ctx.exit(exc.status)
    if not result.writer:  # another process of a distributed run prints and writes
        return
    from ..truncation.explain import story_lines
    from ..truncation.truncate import candidates_table, report_table
    from ..truncation.truncate_report import no_cut_line, verdict_line

    click.echo(shared.inputs_line(result.report["weights"], result.report["normalization"]))
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
        click.echo(shared.wrote(path, existing))
    if result.report.get("validate_command"):
        click.echo("evaluate it with timm's validate.py (in timm's source repository, not its wheel: git clone "
                   f"https://github.com/huggingface/pytorch-image-models): {result.report['validate_command']}")
    if not result.cut:
        click.echo(no_cut_line(result.report))
        ctx.exit(NO_CERTIFIED_CUT)


def _run(checkpoint: Path, out: Path, splits: tuple[str, str, str] | None, device: str, progress: bool | None,
         flags: dict[str, str], options: dict[str, Any]) -> TruncateResult:
    """Read, cut, heal and write, as [`truncate`][isiwatch.truncate] does (``splits``: ``--dataset`` with its
    training and validation splits); torch and timm load here."""
    from ..io.timm_data import TimmDataset
    from ..truncation.truncate import truncate as truncate_model

    if splits is not None:
        dataset, train_split, val_split = splits
        options["data"], options["eval_data"] = (TimmDataset(dataset, options["data"], train_split),
                                                 TimmDataset(dataset, options["eval_data"] or options["data"],
                                                             val_split))
    try:
        return truncate_model(checkpoint, out, device=shared.resolve_device(device),
                              progress=shared.progress_shown(progress), echo=click.echo, **options)
    except OptionError as exc:  # worded with this command's flags (--keep K), not Python's parameters (keep=K)
        raise click.ClickException(exc.worded(flags)) from None


def _interrupted_line(signal: str, journal: Path | None) -> str:
    """The one line ``isiwatch truncate`` prints when ``signal`` (SIGTERM, SIGINT) stopped it: what was kept (the
    ``auto`` search's ``journal`` when it holds a finished candidate) and how to go on."""
    finished = 0 if journal is None else finished_candidates(journal)
    if finished:
        return (f"{signal}: stopped; kept the search journal {journal} ({counted(finished, 'finished candidate')}) "
                "and wrote nothing else; run the same command with --resume to continue the search from it")
    before = "the search finished a candidate" if journal is not None else "the cut was written"
    return f"{signal}: stopped before {before}; nothing was written; run the same command to start again"
