"""Which isiwatch capability runs on which ViT family: the coverage table of docs/families.md, from what actually runs.

For every family of tests/test_families.py (tiny random-init instances, CPU):
- analyze: ``isiwatch.analyze`` with the fused attention on equals the unfused, hook-read reference (1e-4);
- Watch: one sample with every core curve finite and no hook left behind;
- truncate: cut to 2 blocks, heal one step, save, reload strictly with ``timm.create_model`` and the same output
  (transformers: cut, ``save_pretrained``, ``from_pretrained``, the same output; healing needs a classification head);
- specialize: token-specialised norms that reproduce the model exactly.
A capability that refuses says why, in the one line the user sees.

    python benchmarks/family_coverage.py          # print the table
    python benchmarks/family_coverage.py --write  # and update benchmarks/results/families/coverage.json
                                                  # and the table in docs/families.md
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import tempfile
from pathlib import Path

import timm
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_families import HF, TIMM, TINY, hf_reference, make_hf, make_timm, timm_reference  # noqa: E402

import isiwatch  # noqa: E402
from isiwatch._utils.threads import add_threads_argument, set_torch_threads  # noqa: E402
from isiwatch.io.checkpoint import save_checkpoint  # noqa: E402
from isiwatch.io.pretrained_dir import save_pretrained_dir  # noqa: E402
from isiwatch.taps import vit_parts  # noqa: E402
from isiwatch.truncation.truncate import cut_vit, heal  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "families" / "coverage.json"
PAGE = ROOT / "docs" / "families.md"
BEGIN, END = "<!-- family-coverage -->", "<!-- /family-coverage -->"
CAPABILITIES = ("analyze", "watch", "truncate", "specialize")
IMAGES = torch.randn(6, 1, 28, 28, generator=torch.Generator().manual_seed(0))
LABELS = torch.arange(6) % 2


def _analyze(model, family) -> str:
    result = isiwatch.analyze(model, IMAGES, LABELS)
    expected = timm_reference(model, IMAGES) if family in TIMM else hf_reference(model, IMAGES)[0]
    for i, row in enumerate(expected):
        for metric, value in row.items():
            got = result.layers[metric][i]
            if not (math.isnan(value) and math.isnan(got)) and not math.isclose(got, value, rel_tol=1e-4,
                                                                                  abs_tol=1e-6):
                return f"differs from the reference: {metric} block {i}"
    return "yes"


def _watch(model) -> str:
    with tempfile.TemporaryDirectory() as tmp, isiwatch.Watch(model, IMAGES, LABELS, every_n_steps=1,
                                                              log_dir=tmp) as watch:
        watch.step(1)
        sample = watch.history[-1]
    core = ("attn_token_change", "attn_entropy", "isi", "token_similarity", "block_influence")
    if not all(math.isfinite(v) for m in core for v in sample.layers[m]):
        return "non-finite curves"
    if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):
        return "hooks left behind"
    return "yes"


def _truncate_transformers(model) -> str:
    cut = cut_vit(model, [0, 2])
    with tempfile.TemporaryDirectory() as tmp:
        reloaded = type(model).from_pretrained(save_pretrained_dir(cut, Path(tmp) / "cut", {}),
                                               local_files_only=True)
    with torch.no_grad():
        same = torch.allclose(_tensor(reloaded.eval()(IMAGES)), _tensor(cut.eval()(IMAGES)), atol=1e-5)
    return "yes" if same and vit_parts(reloaded).depth == 2 else "reload differs"


def _tensor(output) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output[0]


def _truncate(model, family) -> str:
    if family not in TIMM:
        return _truncate_transformers(model)
    arch, extra = TIMM[family]
    kwargs = {**{k: v for k, v in TINY.items() if k != "pretrained"}, **extra, "depth": 2}
    try:
        cut = cut_vit(model, [0, 2])
    except ValueError as exc:
        return f"tail cuts only: {exc}"  # the cell reads "tail only", the note the reason
    heal(cut, IMAGES, LABELS, epochs=1)
    with tempfile.TemporaryDirectory() as tmp:
        path = save_checkpoint(Path(tmp) / "cut.pt", arch, kwargs, cut.state_dict())
        reloaded = timm.create_model(arch, pretrained=False, **kwargs)
        timm.models.load_checkpoint(reloaded, str(path), strict=True)
    with torch.no_grad():
        same = torch.allclose(reloaded.eval()(IMAGES), cut.eval()(IMAGES), atol=1e-5)
    return "yes" if same and vit_parts(reloaded).depth == vit_parts(model).depth - 1 else "reload differs"


def _specialize(model) -> str:
    try:
        special = isiwatch.specialize(copy.deepcopy(model))
    except ValueError as exc:
        return f"no: {exc}"
    with torch.no_grad():
        return "yes" if torch.equal(special(IMAGES), model(IMAGES)) else "output changed"


def coverage() -> dict[str, dict[str, str]]:
    """Family → capability → "yes" or why not."""
    table = {}
    for family in [*sorted(TIMM), *sorted(HF)]:
        model = make_timm(family) if family in TIMM else make_hf(family)
        table[family] = {"analyze": _analyze(model, family), "watch": _watch(model),
                         "truncate": _truncate(model, family), "specialize": _specialize(model)}
    return table


def render(table: dict[str, dict[str, str]]) -> str:
    """The coverage table (markdown): ✓, or "no"/"tail only" with a numbered note quoting the one-line reason."""
    names = {**{f: f"timm `{TIMM[f][0]}`" for f in TIMM}, **{f: f"transformers `{type(HF[f]()).__name__}`" for f in HF}}
    notes: list[str] = []

    def cell(value: str) -> str:
        if value == "yes":
            return "✓"
        label, _, reason = value.partition(": ")
        if reason not in notes:
            notes.append(reason)
        return f"{'tail only' if label == 'tail cuts only' else label} ({notes.index(reason) + 1})"

    lines = ["| family | model | analyze | Watch | truncate | specialize |", "|---|---|---|---|---|---|"]
    for family, row in table.items():
        lines.append(f"| {family} | {names[family]} | " + " | ".join(cell(row[c]) for c in CAPABILITIES) + " |")
    lines.append("")
    lines += [f"({i}) {reason}" + ("  " if i < len(notes) else "") for i, reason in enumerate(notes, 1)]
    return "\n".join(lines)


def readme_with(table_md: str, readme: str) -> str:
    start, stop = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:start] + "\n" + table_md + "\n" + readme[stop:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update the JSON and the table in docs/families.md")
    add_threads_argument(parser)
    args = parser.parse_args()
    set_torch_threads(args.threads)
    table = coverage()
    print(render(table))
    if args.write:
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(json.dumps({"machine": "CPU", "torch": torch.__version__, "timm": timm.__version__,
                                      "coverage": table}, indent=1) + "\n")
        PAGE.write_text(readme_with(render(table), PAGE.read_text()))


if __name__ == "__main__":
    main()
