"""What a benchmark ran on, recorded in its JSON: timing figures mean little without the machine and its load.

    from machine import machine
    write_json(path, {..., "machine": machine(threads)})
"""

from __future__ import annotations

import platform

import torch

from isiwatch._utils.threads import current_load, usable_cpus


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` knows."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(threads: int | None, device: str = "cpu") -> dict:
    """The CPU, usable cores, torch threads (None: each timed child process chooses its own), the 1-minute load
    average now, versions and the accelerator."""
    return {"cpu": cpu_model(), "usable_cores": usable_cpus(), "torch_threads": threads,
            "load_1min": round(current_load(), 2), "torch": torch.__version__, "python": platform.python_version(),
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}


def describe(record: dict | None) -> str:
    """One line for RESULTS.md: the machine and the load a run recorded, or that it recorded none."""
    if not record:
        return "machine and load not recorded in the JSON (the run predates the record)"
    load = record.get("load_1min_end")
    load_text = f"load average {record['load_1min']}"
    if load is not None:
        load_text += f" at the start, {load} at the end"
    threads = record["torch_threads"]
    # 0 is how runs before the None convention recorded "chosen per child process"
    threads_text = "torch threads chosen in each timed process" if not threads else f"{threads} torch threads"
    return (f"{record['cpu']}, {record['usable_cores']} usable cores, {threads_text}, "
            f"{load_text}, torch {record['torch']}, device {record['device']}")
