"""mkdocs hooks (``hooks:`` in mkdocs.yml): the figures the pages show, read from where the benchmark scripts commit
them, so the site and the README show one copy. mkdocs serves only files under ``docs/``; each figure joins the
site's files as ``figures/NAME``, so a page's ``![...](figures/NAME)`` is a checked link and the file is copied into
the built site."""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

#: Site path → the committed figure, relative to the repository root (the folder of mkdocs.yml).
FIGURES = {
    "figures/depth.png": "benchmarks/results/depth/depth.png",  # benchmarks/bench_depth.py
    "figures/report_heatmaps.png": "benchmarks/results/demo/report_heatmaps.png",  # benchmarks/report_figure.py
    "figures/freeze.png": "benchmarks/results/freeze/freeze.png",  # benchmarks/bench_freeze.py
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    root = Path(config.config_file_path).parent
    for uri, source in FIGURES.items():
        files.append(File.generated(config, uri, abs_src_path=str(root / source)))
    return files
