"""The table docs/monitor.md shows for the Watch's ``torch.profiler`` ranges: its example run as written (a fresh
interpreter, one torch thread, as tests/test_readme_snippets.py runs it) and what it printed, with the command.

    python benchmarks/profiler_table.py

writes ``benchmarks/results/profiler/profiler_table.json``; paste its ``table`` under the example in
docs/monitor.md (tests/test_benchmarks_index.py checks the page shows the example and the table as recorded).
Timings move with the machine and its load; the ranges, their nesting and the call counts do not.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from machine import machine  # noqa: E402

from isiwatch._utils.files import write_json  # noqa: E402

RESULT = Path(__file__).parent / "results" / "profiler" / "profiler_table.json"

#: docs/monitor.md's example, as written there: ten training steps with a Watch sampling every fifth under
#: ``torch.profiler``, then the profile's table cut to the Watch's ranges (header, the ``isiwatch.*`` rows, total).
SNIPPET = '''import isiwatch
import timm
import torch
from isiwatch.io.data import embedded_digits
from torch.profiler import ProfilerActivity, profile

torch.manual_seed(0)
images, labels = embedded_digits()
model = timm.create_model("vit_tiny_patch16_224", img_size=28, patch_size=7, in_chans=1, num_classes=10,
                          embed_dim=32, depth=4, num_heads=2)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
with profile(activities=[ProfilerActivity.CPU]) as prof, \\
        isiwatch.Watch(model, images[4000:4064], labels[4000:4064], every_n_steps=5) as watch:
    for step in range(1, 11):
        x, y = images[64 * step:64 * (step + 1)], labels[64 * step:64 * (step + 1)]
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        watch.step(step, loss)
table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=-1).strip().splitlines()
print("\\n".join([*table[:3], *(line for line in table if " isiwatch." in line), table[2], table[-1]]))'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", "import torch; torch.set_num_threads(1)\n" + SNIPPET],
                          capture_output=True, text=True, env=env, check=True)
    # the lines without their trailing blanks, as the page shows them
    table = "\n".join(line.rstrip() for line in done.stdout.strip("\n").splitlines())
    print(table)
    write_json(args.out, {"command": "python benchmarks/profiler_table.py", "machine": machine(1),
                          "snippet": SNIPPET, "table": table})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
