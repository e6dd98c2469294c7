"""truncate heals at 1e-3 unless told otherwise, or at the lower rate the checkpoint records it was trained at: a
fine-tuned backbone healed at a from-scratch pace forgets its fine-tune."""

import pytest
import torch

from isiwatch.io.checkpoint import load_checkpoint, save_checkpoint
from isiwatch.io.data import embedded_digits
from isiwatch.truncation.healing import DIGITS_VIT_ARCH, make_digits_vit
from isiwatch.truncation.truncate import truncate


@pytest.fixture(scope="module")
def digits():
    images, labels = embedded_digits()
    return images[:300], labels[:300]


def _checkpoint(path, **record):
    model, kwargs = make_digits_vit(seed=0, depth=3, embed_dim=32, num_heads=2)
    if "args" in record:  # timm train.py's layout: its argparse args beside the weights
        torch.save({"state_dict": model.state_dict(), "arch": DIGITS_VIT_ARCH, "args": record["args"],
                    "model_kwargs": kwargs}, path)
        return path
    return save_checkpoint(path, DIGITS_VIT_ARCH, kwargs, model.state_dict(), metadata=record)


def _healed(path, digits, **options):
    result = truncate(path, data=digits, strategy="tail", keep=2, heal_steps=3, images=32, **options)
    return result.report["lr"], result.model.state_dict()


@pytest.mark.parametrize("record", [{"lr": 2e-5}, {"args": {"lr": 2e-5, "mean": None}}], ids=["isiwatch", "timm"])
def test_a_recorded_lower_rate_is_the_default(tmp_path, digits, record):
    lr, healed = _healed(_checkpoint(tmp_path / "tuned.pt", **record), digits)
    assert lr == 2e-5
    plain_lr, plain = _healed(_checkpoint(tmp_path / "plain.pt"), digits, lr=2e-5)  # same weights, no record
    assert plain_lr == 2e-5 and all(torch.equal(v, plain[k]) for k, v in healed.items())


def test_the_default_stays_1e3_without_a_record_or_above_it(tmp_path, digits):
    assert load_checkpoint(_checkpoint(tmp_path / "plain.pt")).training_lr is None
    assert _healed(_checkpoint(tmp_path / "plain.pt"), digits)[0] == 1e-3
    assert _healed(_checkpoint(tmp_path / "fast.pt", lr=3e-3), digits)[0] == 1e-3


def test_an_explicit_rate_wins_over_the_record(tmp_path, digits):
    assert _healed(_checkpoint(tmp_path / "tuned.pt", lr=2e-5), digits, lr=5e-4)[0] == 5e-4


@pytest.mark.parametrize("value", [0, -1e-3, float("nan"), "1e-3", True])
def test_a_recorded_rate_that_is_no_positive_number_is_ignored(tmp_path, value):
    assert load_checkpoint(_checkpoint(tmp_path / "odd.pt", lr=value)).training_lr is None
