"""Healing and evaluation on Lightning Fabric: one process or many (``ddp``, ``fsdp``; launched by Fabric itself,
torchrun or SLURM as Fabric detects them), each reading its shard of the images through a ``DistributedSampler``;
predictions are gathered back into dataset order on every process, so every process takes the same decisions and
process 0 alone writes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._utils.option_error import OptionError
from .._utils.threads import usable_cpus

if TYPE_CHECKING:  # torch and lightning load when used: the command line imports this module for its choices
    from lightning_fabric import Fabric
    from torch import Tensor
    from torch.utils.data import DataLoader

#: Distributed strategies ``--dist-strategy`` offers (Fabric's names; "auto": one device, or ddp over several).
DIST_STRATEGIES = ("auto", "ddp", "fsdp")
#: Precisions ``--precision`` offers (Fabric's names).
PRECISIONS = ("32", "16-mixed", "bf16-mixed")


def launched_on_every_node() -> bool:
    """Whether a launcher started this job on every node, recognised by its environment variables as Lightning
    Fabric's cluster environments recognise it: torchrun (TorchElastic), a SLURM job (not an interactive ``bash``
    allocation, where Fabric starts the processes itself), LSF, Open MPI, or a rendezvous set by hand
    (``MASTER_ADDR`` with ``NODE_RANK``, Lightning's way without a cluster manager, or ``RANK``, Kubeflow's).
    Without one, Fabric would start this node's processes and wait for the other nodes for ever."""
    env = os.environ
    return ("TORCHELASTIC_RUN_ID" in env or "LSB_JOBID" in env or "OMPI_COMM_WORLD_SIZE" in env
            or ("SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"))
            or ("MASTER_ADDR" in env and ("NODE_RANK" in env or "RANK" in env)))


@dataclass(frozen=True)
class FabricOptions:
    """Where healing and evaluation run, in Lightning Fabric's terms: ``accelerator`` ("cpu", "cuda", "auto"),
    ``devices`` per node, ``num_nodes``, ``strategy`` (`DIST_STRATEGIES`) and ``precision``
    (`PRECISIONS`; None: bf16-mixed on CUDA, else 32)."""

    accelerator: str = "auto"
    devices: int = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str | None = None

    def __post_init__(self) -> None:
        if self.strategy not in DIST_STRATEGIES:
            raise OptionError("{dist_strategy} must be one of " + ", ".join(DIST_STRATEGIES) + ", got {value!r}",
                              value=self.strategy)
        if self.precision is not None and self.precision not in PRECISIONS:
            raise OptionError("{precision} must be one of " + ", ".join(PRECISIONS) + ", got {value!r}",
                              value=self.precision)
        if self.devices < 1 or self.num_nodes < 1:
            raise OptionError("{devices} and {num_nodes} must be at least 1, got {devices_value} and {nodes}",
                              devices_value=self.devices, nodes=self.num_nodes)
        if self.num_nodes > 1 and not launched_on_every_node():
            raise OptionError("{num_nodes:{nodes}}: no launcher started this job on every node; run it under "
                              "torchrun or SLURM (srun), or set MASTER_ADDR and NODE_RANK on each node",
                              nodes=self.num_nodes)

    def launch(self) -> Fabric:
        """A launched Fabric: with several devices and no torchrun/SLURM around it, Fabric starts the other
        processes by re-running this command; more devices than the machine has are refused in one line."""
        import torch
        from lightning_fabric import Fabric

        accelerator = self.accelerator
        if accelerator == "auto":
            accelerator = "cuda" if torch.cuda.is_available() else "cpu"
        available = torch.cuda.device_count() if accelerator == "cuda" else usable_cpus()
        if self.devices > available:
            raise OptionError("{devices} {count}: this machine has {available} {kind}", count=self.devices,
                              available=available, kind="CUDA devices" if accelerator == "cuda" else "CPU cores")
        precision = self.precision or ("bf16-mixed" if accelerator == "cuda" else "32")
        try:
            fabric = Fabric(accelerator=accelerator, devices=self.devices, num_nodes=self.num_nodes,
                            strategy=self.strategy, precision=precision)  # type: ignore[arg-type]
            fabric.launch()
        except (ValueError, RuntimeError, TypeError) as exc:  # Lightning's MisconfigurationException is one
            raise OptionError("{accelerator}/{devices}/{dist_strategy}/{precision}: " + str(exc).splitlines()[0]
                              .replace("{", "(").replace("}", ")")) from None
        return fabric


class ShardedLoader:
    """A DataLoader set up by ``fabric``: each process iterates its shard (a ``DistributedSampler`` when there are
    several), batches already on ``fabric.device``; `gather` puts per-image results back in dataset order."""

    def __init__(self, fabric: Fabric, loader: DataLoader[Any]):
        self.fabric, self.size = fabric, len(loader.dataset)  # type: ignore[arg-type]
        self.loader = fabric.setup_dataloaders(loader)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    def __len__(self) -> int:
        """Batches per process."""
        return len(self.loader)

    def gather(self, local: Tensor) -> Tensor:
        """Every process's per-image ``local`` results, in dataset order: a ``DistributedSampler`` without shuffling
        gives process ``r`` the images ``r, r + world, ...`` (padded with the first ones to equal lengths)."""
        if self.fabric.world_size == 1:
            return local
        gathered: Tensor = self.fabric.all_gather(local.to(self.fabric.device))  # type: ignore[assignment]
        return gathered.T.reshape(-1)[:self.size].cpu()
