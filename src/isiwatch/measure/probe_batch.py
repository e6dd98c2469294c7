"""What is fixed with a probe batch, computed once: content order, probe split, label codes, device copies.

The Watch probes the same images at every sample, so none of this is redone per sample (the content hash reads
every image on the host; the label codes need a host read).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .probes import label_codes, split_images


@dataclass
class ProbeTargets:
    """The probes' targets on one device: label ``codes`` (n,), their ``onehot`` (n,C) and the ``train``/``test``
    image indices of the probe split."""

    codes: Tensor
    onehot: Tensor
    train: Tensor
    test: Tensor


class ProbeBatch:
    """Probe ``images`` (B,C,H,W) and optional ``labels`` (B,), with the probe split of ``train_fraction`` and
    ``seed`` (`split_images`), the label codes and the per-chunk splits of ``isi_recon``; device copies are made on
    first use and kept (one per device)."""

    def __init__(self, images: Tensor, labels: Tensor | None = None, train_fraction: float = 0.7, seed: int = 0):
        self.images = images
        self.labels = labels
        self.seed = seed
        self.split = split_images(images, train_fraction, seed) if labels is not None else None
        self._codes = label_codes(labels) if labels is not None else None
        self._images: dict[tuple[torch.device, torch.dtype], Tensor] = {}
        self._targets: dict[torch.device, ProbeTargets] = {}
        self._chunk_splits: dict[tuple[int, int, torch.device], tuple[Tensor, Tensor]] = {}

    def __len__(self) -> int:
        return len(self.images)

    def images_on(self, device: torch.device, dtype: torch.dtype) -> Tensor:
        """The images on ``device`` in ``dtype`` (one kept copy per device: a model moved elsewhere drops it)."""
        key = (device, dtype)
        if key not in self._images:
            self._images = {key: self.images.to(device, dtype)}
        return self._images[key]

    def targets_on(self, device: torch.device) -> ProbeTargets:
        """The probes' `ProbeTargets` on ``device``; needs labels."""
        if self._codes is None or self.split is None:
            raise ValueError("this probe batch has no labels")
        if device not in self._targets:
            codes, classes = self._codes
            codes = codes.to(device)
            train, test = self.split
            self._targets = {device: ProbeTargets(codes, F.one_hot(codes, classes).float(), train.to(device),
                                                  test.to(device))}
        return self._targets[device]

    def chunk_split(self, offset: int, size: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """The seeded train/held-out split of the chunk of images [offset, offset + size) (``isi_recon``)."""
        key = (offset, size, device)
        if key not in self._chunk_splits:
            train, test = split_images(self.images[offset:offset + size], seed=self.seed)
            self._chunk_splits[key] = (train.to(device), test.to(device))
        return self._chunk_splits[key]
