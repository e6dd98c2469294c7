"""2,000 Watch samples in a fresh interpreter, for ``test_watch``'s memory test: the objects, tensors and RSS it
counts are this Watch's alone, not those of threads an earlier test left running in the same worker.

Prints one JSON object: growth from sample 500 to sample 2,000 (objects, tensors, RSS bytes, the object types that
grew most), the history's length and whether any hook is left on the model after the Watch closed.
"""

import collections
import gc
import json
import os
import sys

import torch
from prometheus_client import CollectorRegistry
from test_watch import tiny_vit  # this file's folder is first on sys.path when it runs as a script

from isiwatch import Watch
from isiwatch.io.data import embedded_digits


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def census() -> tuple[collections.Counter[str], int, int]:
    """(objects by type, tensors, RSS) after a full collection."""
    gc.collect()
    objects = gc.get_objects()
    return (collections.Counter(type(o).__name__ for o in objects), sum(torch.is_tensor(o) for o in objects),
            rss_bytes())


def main(log_dir: str) -> None:
    torch.set_num_threads(1)
    model = tiny_vit(depth=2, dim=16)
    x, y = embedded_digits()
    with Watch(model, x[4000:4016], y[4000:4016], every_n_steps=1, log_dir=log_dir, run_folder=".",
               registry=CollectorRegistry(),
               history_size=50, heatmap_every=500) as watch:
        for step in range(1, 501):
            watch.step(step)
        watch.exporters[1].wait_for_heatmaps()  # the render of step 500 runs on its thread: let it end
        types, tensors, rss = census()
        for step in range(501, 2001):
            watch.step(step)
        watch.exporters[1].wait_for_heatmaps()
        types_after, tensors_after, rss_after = census()
    grew = types_after.copy()
    grew.subtract(types)
    print(json.dumps({"object_growth": sum(types_after.values()) - sum(types.values()),
                      "grew_most": dict(grew.most_common(8)), "tensor_growth": tensors_after - tensors,
                      "rss_growth": rss_after - rss, "history": len(watch.history),
                      "hooks_left": any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())}))


if __name__ == "__main__":
    main(sys.argv[1])
