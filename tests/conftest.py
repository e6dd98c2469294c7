import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # also what isiwatch._utils.threads honours (the demo)

import torch  # noqa: E402

# One torch thread per test process: the suite also runs subprocesses (DDP ranks, Prometheus, Chromium) and
# with two threads a busy 2-core machine makes every small forward spin-wait.
torch.set_num_threads(1)
