"""Where a Watch with ``log_dir`` wrote: each run has its own folder there (`isiwatch.watch.run_folder`)."""

from pathlib import Path


def run_dir(log_dir: str | Path) -> Path:
    """The one run folder under ``log_dir`` (a test that made several names the one it means)."""
    folders = [p for p in Path(log_dir).iterdir() if p.is_dir()]
    assert len(folders) == 1, f"{log_dir} holds {len(folders)} run folders: {folders}"
    return folders[0]
