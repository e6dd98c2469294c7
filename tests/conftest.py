import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # also what isiwatch._utils.threads honours (the demo)

import torch  # noqa: E402

# One torch thread per test process (each pytest-xdist worker too: two workers share two cores): the suite also
# runs subprocesses (DDP ranks, Prometheus, Chromium) and with two threads a busy 2-core machine makes every small
# forward spin-wait.
torch.set_num_threads(1)

import pytest  # noqa: E402

#: The quick tier (``pytest -m "not slow"``, CONTRIBUTING.md) leaves out these files: end-to-end runs of the
#: demo, the CLI on every family, documentation blocks, examples, real servers and multi-process jobs (each
#: took 10 s or more in ``pytest --durations=0`` on 2 cores). CI runs everything.
SLOW_FILES = {
    "test_readme_snippets.py", "test_families_cli.py", "test_examples.py", "test_cli_analyze.py",
    "test_demo_report.py", "test_families_watch.py", "test_benchmarks_depth.py", "test_families_coverage.py",
    "test_truncate_auto.py", "test_integrations_distributed.py", "test_readme_claims.py", "test_gpu_check.py",
    "test_results_report.py", "test_integrations_transformers.py", "test_deploy_e2e.py",
    "test_integrations_lightning.py", "test_integrations_timm.py", "test_probes.py", "test_specialize_cli.py",
    "test_integrations_compile.py", "test_faults.py", "test_truncate_fabric.py", "test_truncate_signals.py",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
    # The files that hold a slow test first, each file's tests in their order: the two pytest-xdist workers take
    # whole files in this order (addopts in pyproject.toml), so the long files start early and the quick ones
    # even out the end, instead of a long file starting last while the other worker idles.
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
