"""Watch under torch.distributed: 2 gloo processes on the CPU, with DDP and with FSDP2 (``fully_shard``)."""

import json
import os
import socket

import pytest
import timm
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from isiwatch import Watch

WORLD = 2
KINDS = ("ddp", "fsdp")  # fsdp: FSDP2 ``fully_shard``, whose forward all-gathers, so every rank must probe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_steps(rank, model, opt, x, y, watch, steps):
    """Yields each step after training on a batch of 16 of the first 256 images (drawn with the rank as seed, so
    every rank trains on its own batches) and handing the loss to the Watch."""
    torch.manual_seed(rank)
    for step in range(1, steps + 1):
        idx = torch.randint(0, 256, (16,))
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        watch.step(step, loss)
        yield step


def wrap(model, kind):
    if kind == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def worker(rank, port, out):
    """One process group, one run per kind of wrapper (a spawn costs more than a run)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    for kind in KINDS:
        run(rank, f"{out}/{kind}", kind)
    dist.destroy_process_group()


def run(rank, out, kind):
    """Trains a tiny ViT on this rank's batches of the digits; only rank 1 has a stop criterion (the loss
    falls below 100 after one warm-up sample), so rank 0 stops only by agreeing."""
    from isiwatch.io.data import embedded_digits

    x, y = embedded_digits()
    torch.manual_seed(0)
    model = wrap(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7,
                                   in_chans=1, num_classes=10, embed_dim=16, depth=2, num_heads=2), kind)
    stop = {"monitor": "loss", "warmup": 1, "stopping_threshold": 100.0} if rank == 1 else {}
    watch = Watch(model, x[4000:4032], y[4000:4032], every_n_steps=2, log_dir=f"{out}/rank{rank}", run_folder=".",
                  **stop)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    for step in train_steps(rank, model, opt, x, y, watch, 20):  # noqa: B007  (the result reads the last step)
        if watch.should_stop:
            break
    result = {"step": step, "reason": watch.stop_reason, "samples": [s.step for s in watch.history],
              "isi": watch.history[-1].layers["isi"]}
    watch.close()
    with open(f"{out}/result{rank}.json", "w") as fh:
        json.dump(result, fh)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    for kind in KINDS:
        (out / kind).mkdir()
    mp.spawn(worker, args=(free_port(), str(out)), nprocs=WORLD, join=True)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_ranks_agree_on_the_stop_and_only_rank_0_exports(kind, runs):
    tmp_path = runs / kind
    r0, r1 = (json.loads((tmp_path / f"result{r}.json").read_text()) for r in range(WORLD))
    assert r0["step"] == r1["step"] == 4
    assert r0["reason"] == "another rank requested the stop" and "stopping threshold" in r1["reason"]
    assert r0["samples"] == r1["samples"] == [2, 4]  # the probe pass ran on every rank
    assert r0["isi"] == pytest.approx(r1["isi"], abs=1e-6)  # same probe batch, same (gathered) weights
    assert [json.loads(line)["step"] for line in (tmp_path / "rank0" / "metrics.jsonl").read_text().splitlines()] \
        == [2, 4]
    assert "early_stop" in (tmp_path / "rank0" / "alerts.jsonl").read_text()
    assert not (tmp_path / "rank1").exists()
