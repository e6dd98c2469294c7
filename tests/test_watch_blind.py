"""The Watch never goes blind silently (issue 41, monitor side): the numeric context of the probe pass, refusals at
construction, every record returned by ``step()``, a bounded sampling interval, network deadlines and faults that
heal completely."""

import pytest
import torch
from torch import nn

from isiwatch import Watch
from isiwatch.truncation.healing import make_digits_vit
from isiwatch.watch.config import ConfigError, build_options, load_yaml
from isiwatch.watch.freezing import FreezePolicy


def tiny(seed=0, depth=4):
    return make_digits_vit(seed, depth=depth, embed_dim=32, num_heads=2)[0]


def probe(n=8, seed=1):
    return torch.randn(n, 1, 28, 28, generator=torch.Generator().manual_seed(seed))


def test_step_inside_cpu_autocast_samples_and_leaves_autocast_on():
    model = tiny()
    watch = Watch(model, probe(), every_n_steps=1, strict=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        watch.step(1)
        assert torch.is_autocast_enabled("cpu")  # the caller's context is back as it was
    reference = Watch(tiny(), probe(), every_n_steps=1, strict=True)
    reference.step(1)
    assert watch.history[-1].layers == reference.history[-1].layers  # the same float32 pass, autocast or not


def test_a_bf16_model_inside_autocast_samples():
    model = tiny().to(torch.bfloat16)
    watch = Watch(model, probe(), every_n_steps=1, strict=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        watch.step(1)
    assert len(watch.history) == 1 and all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_shared_block_modules_are_refused_at_construction():
    model = tiny()
    model.blocks = nn.Sequential(model.blocks[0], model.blocks[1], model.blocks[0], model.blocks[3])
    with pytest.raises(ValueError, match=r"^block 2 is the same module as block 0 \(Block\)"):
        Watch(model, probe())


@pytest.mark.parametrize("option", ["patience", "plateau_patience", "history_size", "every_n_steps", "warmup"])
def test_counts_are_bounded(option):
    with pytest.raises(ConfigError, match=rf"option '{option}' must be at most 1,000,000,000, got 1180591620717411"):
        build_options(**{option: 2**70})
    with pytest.raises(ConfigError, match="patience must be an int from 1 to 1,000,000,000"):
        build_options(freeze_settled={"patience": 2**70})


def test_a_freeze_settled_error_names_the_line_of_its_key(tmp_path):
    path = tmp_path / "isiwatch.yaml"
    path.write_text("every_n_steps: 5\nfreeze_settled:\n  tolerance: 0.02\n  patience: 0\n")
    with pytest.raises(ConfigError, match=r"isiwatch.yaml:4: option 'freeze_settled' patience must be an int from 1"):
        load_yaml(path)


def test_step_returns_freeze_and_stop_records():
    model = tiny()
    seen = []
    watch = Watch(model, probe(), every_n_steps=1, freeze_settled=FreezePolicy(patience=1), monitor="loss",
                  patience=0, alert_callback=seen.append)
    returned = []
    for step in (1, 2, 3):
        returned += watch.step(step, loss=1.0)
    kinds = [r.kind for r in returned]
    assert "blocks_frozen" in kinds and "early_stop" in kinds
    assert returned == seen  # every record the Watch emitted at those steps, in order, and nothing else
