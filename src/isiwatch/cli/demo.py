"""``isiwatch demo``: the whole product in one command, on the embedded MNIST digits.

Trains a small timm ViT with [`Watch`][isiwatch.Watch] attached (TensorBoard events, ``metrics.jsonl``,
``alerts.jsonl`` in ``--out`` itself, the run's folder (``run_folder: .``), beside the demo's other files, which a
re-run replaces; a Prometheus endpoint on 127.0.0.1 while it runs), analyses the trained model on the
held-out digits (``analysis.json`` with the recommended depth, ``curves.png``), truncates it to the
fewest blocks, as cut or healed, whose accuracy drop is certified within the demo's stated bound (``truncate
--strategy auto`` under the same acceptance rule as the command: ``truncated.pt``, ``truncate_report.json``),
says in one sentence how that cut and the recommended depth relate (`story_lines`) and writes the report
(``report/report.html``), which tells the same story.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn
from tqdm.auto import tqdm

from .._utils.files import write_json
from ..io.checkpoint import save_checkpoint, sha256_of
from ..io.data import DIGITS_TRAIN
from ..measure.analysis import analyze
from ..measure.tables import analysis_table, phases_line, recommendation_text
from ..measure.vocabulary import Glossary, alert_words
from ..truncation.explain import story_lines
from ..truncation.healing import accuracy, train_classifier
from ..truncation.strategies import DEFAULT_CONFIDENCE
from ..truncation.truncate import candidates_table, report_table, truncate
from ..truncation.truncate_report import no_cut_line, verdict_line
from ..watch.config import load_yaml
from ..watch.log_folder import holder
from ..watch.monitor import Watch
from .demo_models import pretrained_model, scratch_model
from .next_steps import next_steps
from .offline import analysis_record, write_analysis
from .report import read_run, write_records_report

if TYPE_CHECKING:
    from ..watch.alerts import Alert
    from ..watch.exporters.prometheus import PrometheusExporter

PROBE_IMAGES = 256
#: The port ``deploy/prometheus/prometheus.yml`` scrapes: the demo serves there unless told otherwise.
PROMETHEUS_PORT = 9108


def _serve(exporter: PrometheusExporter, seconds: float, echo: Callable[[str], None]) -> None:
    """Keep ``exporter``'s HTTP endpoint up for ``seconds`` (Ctrl-C ends it early), then close it."""
    echo(f"serving the run's last Prometheus metrics at http://127.0.0.1:{exporter.port}/metrics for {seconds:g} s "
         f"(Ctrl-C to stop)")
    try:
        time.sleep(seconds)
    except KeyboardInterrupt:
        echo("stopped serving")
    finally:
        exporter.close()


#: Everything a demo writes in its run directory: a re-run removes an earlier demo's files before it starts, so an
#: interrupted run leaves its own partial files and never a mix of two runs (the Watch's log is appended to, and a
#: truncation or report of the earlier model would sit beside the new log). Other files are left alone.
DEMO_FILES = ("metrics.jsonl", "alerts.jsonl", "events.out.tfevents.*", "model.pt", "analysis.json", "curves.png",
              "truncated.pt", "truncated.pt.search.jsonl", "truncate_report.json", "report")


def _start_afresh(out: Path, echo: Callable[[str], None]) -> None:
    """Refuse ``out`` while a Watch writes it (another demo or training run), then remove the files an earlier demo
    wrote there (`DEMO_FILES`), saying so."""
    if (other := holder(out)) is not None:
        raise ValueError(f"{out}/ is in use by {other}: pass --out for another folder")
    earlier = sorted({p for pattern in DEMO_FILES for p in out.glob(pattern)}) if out.is_dir() else []
    if not earlier:
        return
    echo(f"removing the earlier demo run's files in {out}/ ({', '.join(p.name for p in earlier)}) before this run")
    for path in earlier:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _port_free(port: int) -> bool:
    """Whether the Prometheus endpoint can listen on ``port`` of 127.0.0.1, checked before the demo writes anything
    (the exporter itself only warns: a training run must not die of a busy port, but the demo can say so)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the exporter's server: TIME_WAIT is free
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


#: Ports after a taken default that the demo tries before it takes any free one, as Jupyter and TensorBoard do.
PORT_TRIES = 20


def next_free_port(port: int) -> int:
    """The first of ``port``, ``port + 1``, ... (`PORT_TRIES` of them) that 127.0.0.1 can listen on; 0 (any free
    port, which the exporter picks) when none is."""
    return next((p for p in range(port, min(port + PORT_TRIES, 65536)) if _port_free(p)), 0)


class PhaseClock:
    """Wall seconds per phase of the demo (``benchmarks/bench_demo.py`` records them): where its time goes."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the wall time of the ``with`` body to phase ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


@contextmanager
def explicit_attention(model: nn.Module) -> Iterator[None]:
    """Train with timm's explicit softmax attention instead of torch's fused kernel: for the digits' 17 tokens it is
    faster on CPU (the fused kernel's per-call cost is made for long sequences). A runtime flag, restored on exit, so
    that the demo's evaluation and analysis take the same path as ``isiwatch analyze model.pt``."""
    modules = [m for m in model.modules() if hasattr(m, "fused_attn")]
    fused = [bool(m.fused_attn) for m in modules]
    for m in modules:
        m.__dict__["fused_attn"] = False  # a plain attribute (timm's Final[bool]), not a parameter or submodule
    try:
        yield
    finally:
        for m, flag in zip(modules, fused):
            m.__dict__["fused_attn"] = flag


def run_demo(out: str | Path, *, quick: bool = False, device: str = "cpu", config: str | Path | None = None,
             prometheus_port: int | None = PROMETHEUS_PORT, serve: float = 0, seed: int = 0,
             echo: Callable[[str], None] = print, progress: bool = True,
             take_next_port: bool = True, pretrained: str | None = None) -> dict[str, Any]:
    """Train with Watch, analyse, truncate, report; returns a summary dict (``phase_seconds``: wall seconds of data,
    the Watch, training alone, evaluation, analysis, truncate and report; `PhaseClock`). ``config``: Watch
    options (isiwatch.yaml) that override the demo's defaults. ``serve``: seconds to keep the Prometheus endpoint up
    after the demo has finished (it then stays up from training on), so a scraping Prometheus sees open alert
    episodes long enough for rules with a ``for:`` delay to fire; 0 closes it when training ends. ``progress``:
    draw progress bars while training and healing. ``take_next_port``: when ``prometheus_port`` is taken, serve on
    the next free port and say so (`next_free_port`); False refuses it (a port the user named). ``pretrained``:
    fine-tune this pretrained backbone (`isiwatch.cli.demo_models.PRETRAINED`) instead of training a ViT from
    scratch; fetched before anything is written, `BackboneUnavailable` when it cannot be had."""
    if pretrained is not None and quick:
        raise ValueError("--quick trains the small ViT from scratch; it does not apply to --pretrained")
    if serve < 0 or serve != serve:
        raise ValueError(f"serve must be a number of seconds >= 0, got {serve}")
    if serve and prometheus_port is None:
        raise ValueError("serve needs the Prometheus endpoint (a prometheus_port)")
    if prometheus_port and not _port_free(prometheus_port):
        if not take_next_port:
            raise ValueError(f"port {prometheus_port} on 127.0.0.1 is taken (another demo or training run?): pass "
                             f"--prometheus-port P for another port (0: any free one)")
        taken, prometheus_port = prometheus_port, next_free_port(prometheus_port)
        echo(f"port {taken} on 127.0.0.1 is taken: serving Prometheus metrics on "
             + (f"port {prometheus_port}" if prometheus_port else "any free port")
             + f" instead (the prometheus.yml of 'isiwatch deploy DIR' scrapes {taken}; --prometheus-port P chooses)")
    out = Path(out)
    clock = PhaseClock()
    with clock.phase("data"):  # a backbone that cannot be had is refused here, before anything is written
        demo_model = pretrained_model(pretrained, seed, echo) if pretrained else scratch_model(quick, seed)
    _start_afresh(out, echo)  # before any work: a folder in use is refused, an earlier demo's files go
    settings, images, labels = demo_model.settings, demo_model.images, demo_model.labels
    train_x, train_y = images[:DIGITS_TRAIN], labels[:DIGITS_TRAIN]
    test_x, test_y = images[DIGITS_TRAIN:], labels[DIGITS_TRAIN:]
    model, kwargs = demo_model.model, demo_model.kwargs
    model.to(device)
    options = {"every_n_steps": settings.every_n_steps, "log_dir": str(out), "run_folder": ".", "run_name": "demo",
               "prometheus_port": prometheus_port, **(load_yaml(config).watch if config else {})}

    glossary = Glossary()  # each phase word and alert kind is defined the first time it is printed
    hinted: set[str] = set()  # and each kind's hint given the first time

    def print_alert(alert: Alert) -> None:
        defined = glossary.new(alert_words(alert.kind))
        hint = alert.hint if alert.hint and alert.kind not in hinted else ""
        hinted.add(alert.kind)
        tqdm.write(f"  [{alert.severity}] step {alert.step}: {alert.kind}: {alert.message}"
                   + (f"\n    hint: {hint}" if hint else "") + (f"\n    ({defined})" if defined else ""))

    head = f", head {settings.head_lr:g}" if settings.head_lr is not None else ""
    echo(f"training {demo_model.what} on {len(train_x)} embedded MNIST digits for {settings.epochs} "
         f"epoch{'s' if settings.epochs != 1 else ''} of batch {settings.batch_size} (peak lr {settings.lr:g}{head}) "
         f"on {device}; Watch samples every {options['every_n_steps']} steps"
         + (" from the pretrained model on" if demo_model.sample_first else " on")
         + f" {PROBE_IMAGES} held-out digits")
    start = time.perf_counter()
    with clock.phase("watch"):
        watch = Watch(model, test_x[:PROBE_IMAGES], test_y[:PROBE_IMAGES], config=options,
                      alert_callback=print_alert)
    with watch, explicit_attention(model):
        if watch.prometheus and watch.prometheus.port:
            echo(f"Prometheus metrics at http://127.0.0.1:{watch.prometheus.port}/metrics while training")
        last_span = "not sampled"

        def show_span(step: int) -> None:
            """Say the plateau span when the sample at ``step`` (if one was taken) changed it."""
            nonlocal last_span
            if watch.last_step == step:
                ph = watch.history[-1].phases
                span = f"{ph.plateau_name} {ph.plateau[0]}–{ph.plateau[1]}" if ph else "no flat stretch"
                if span != last_span:
                    defined = glossary.new([ph.plateau_name] if ph else [])
                    tqdm.write(f"  step {step}: {span} ({watch.options.phase_metric})"
                               + (f"\n    ({defined})" if defined else ""))
                    last_span = span

        def on_step(step: int, loss: float) -> bool:
            with clock.phase("watch"):
                watch.step(step, loss)
            show_span(step)
            return watch.should_stop

        if demo_model.sample_first:  # the pretrained model, before the first update
            with clock.phase("watch"):
                watch.sample(0)
            show_span(0)
        steps = train_classifier(model, train_x, train_y, epochs=settings.epochs, lr=settings.lr, seed=seed,
                                 on_step=on_step, progress=progress, batch_size=settings.batch_size,
                                 head_lr=settings.head_lr)
        with clock.phase("watch"):
            watch.finish()  # the final sample reaches the exporter before it may be kept past the Watch
        samples = len(watch.history)
        stop_reason = watch.stop_reason
        exporter = watch.prometheus if serve and watch.prometheus and watch.prometheus.port else None
        if exporter:
            watch.exporters.remove(exporter)  # closing the Watch leaves a kept one serving
    try:
        train_seconds = time.perf_counter() - start
        clock.seconds["training"] = train_seconds - clock.seconds["watch"]  # the optimizer steps alone
        with clock.phase("evaluation"):
            half = len(test_y) // 2  # truncate's validation and test images below: the held-out digits halved
            val_acc, test_acc = (accuracy(model, test_x[:half], test_y[:half]),
                                 accuracy(model, test_x[half:], test_y[half:]))
            acc = (val_acc * half + test_acc * (len(test_y) - half)) / len(test_y)
            ckpt = save_checkpoint(out / "model.pt", demo_model.arch, kwargs, model.state_dict(),
                                   metadata={**demo_model.metadata, "held_out_accuracy": acc, "steps": steps})
        echo(f"trained {steps} steps in {train_seconds:.1f} s ({samples} samples, {clock.seconds['watch']:.1f} s of "
             f"it the Watch's); accuracy validation n={half} {val_acc:.3f}, test n={len(test_y) - half} "
             f"{test_acc:.3f} (the held-out digits halved, as truncate scores them below)"
             + (f"; stopped early: {stop_reason}" if stop_reason else ""))

        with clock.phase("analysis"):
            result = analyze(model, test_x, test_y, batch_size=settings.analysis_batch or len(test_x))
            result.model_info.update({"arch": demo_model.arch, "model_kwargs": kwargs, "checkpoint": str(ckpt),
                                      "sha256": sha256_of(ckpt), "held_out_accuracy": acc, "data": "mnist"})
            record = analysis_record(result)
            analysis_path = write_analysis(result, out)[0]
        echo(analysis_table(result))
        echo(phases_line(result))
        echo(f"recommended depth: {recommendation_text(record['recommendation'])}: a signal from one analysis "
             "pass of the trained (uncut) model, no healing; truncate checks real cuts below")

        echo(f"truncate --strategy auto --max-drop {settings.max_drop:g} --confidence {DEFAULT_CONFIDENCE:g} "
             f"--budget {settings.cut_budget} --heal-steps "
             f"{settings.heal_steps}" + (" --distill" if settings.distill else "") + ": the fewest blocks, as cut, "
             "bridged or healed, whose accuracy drop on the validation digits is certified within "
             f"{settings.max_drop:g} points at {100 * DEFAULT_CONFIDENCE:g} % confidence")
        with clock.phase("truncate"):
            # the digits as the tensors already in memory: the same 4,000 healing / 1,000 held-out split, pixels and
            # normalisation as `truncate --data mnist`, without parsing the CSV again and a PIL transform per image
            truncated = truncate(ckpt, out / "truncated.pt", data=(images, labels), analysis=analysis_path,
                                 max_drop=settings.max_drop, confidence=DEFAULT_CONFIDENCE, budget=settings.cut_budget,
                                 heal_steps=settings.heal_steps,
                                 distill=settings.distill, report=out / "truncate_report.json", device=device,
                                 seed=seed, progress=progress, echo=echo)
        echo(candidates_table(truncated.report))
        echo(report_table(truncated.report))
        echo(verdict_line(truncated.report))
        for line in story_lines(truncated.report):
            echo(line)
        if not truncated.cut:  # truncate wrote nothing; the run's record of why is the demo's own
            echo(str(no_cut_line(truncated.report)))
            write_json(out / "truncate_report.json", truncated.report)
        with clock.phase("report"):
            records = read_run(out)
            report_paths = write_records_report(records, out / "report")
        echo(f"wrote {out}/: model.pt, analysis.json, curves.png, metrics.jsonl, alerts.jsonl, TensorBoard events, "
             f"{'truncated.pt, ' if truncated.cut else ''}truncate_report.json, {report_paths[-1].relative_to(out)}")
        for line in next_steps(records, report_paths[-1]):
            echo(line)
        if exporter:
            _serve(exporter, serve, echo)
    finally:
        if exporter:
            exporter.close()  # closed early when the demo fails; idempotent
    return {"accuracy": acc, "steps": steps, "train_seconds": train_seconds, "analysis": result,
            "truncation": truncated.report, "samples": samples, "phase_seconds": clock.seconds}
