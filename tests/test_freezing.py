"""The freeze policy (``freeze_settled``): the signal, the decision (the longest settled prefix), the action
(parameters bit-identical after the freeze, backward stops at the first trainable block, optimizer state kept), its
alert record, its state across a resume, its options and a failure inside it."""

import math

import pytest
import torch
import torch.nn.functional as F

from isiwatch import Watch
from isiwatch.truncation.healing import make_digits_vit
from isiwatch.watch.config import ConfigError, build_options, load_yaml
from isiwatch.watch.freezing import FreezePolicy, representation_change, settled_prefix


@pytest.fixture(scope="module")
def digits():
    from isiwatch.io.data import embedded_digits

    x, y = embedded_digits()
    return x[:512], y[:512], x[4000:4064], y[4000:4064]


def tiny(seed=0):
    return make_digits_vit(seed, depth=4, embed_dim=32, num_heads=2)[0]


def move_late_blocks(model, step):
    """Change blocks 2 and 3 only, so blocks 0 and 1 settle (their output on the probe batch stays the same)."""
    gen = torch.Generator().manual_seed(step)
    with torch.no_grad():
        for block in model.blocks[2:]:
            for p in block.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)


def settle_first_two(model, probe_x, probe_y, **options):
    """A Watch that sees blocks 0-1 unchanged over three samples (patience 2): it freezes them at step 3."""
    records = []
    watch = Watch(model, probe_x, probe_y, every_n_steps=1, freeze_settled=FreezePolicy(patience=2),
                  alert_callback=records.append, **options)
    for step in (1, 2, 3):
        move_late_blocks(model, step)
        watch.step(step)
    return watch, [r for r in records if r.kind == "blocks_frozen"]


def frozen_names(model):
    return [name for name, p in model.named_parameters() if not p.requires_grad]


def train(model, x, y, steps, first_step=1, watch=None):
    """AdamW with weight decay (which would move a frozen weight that still had a gradient, even a zero one)."""
    torch.manual_seed(first_step)
    opt = torch.optim.AdamW([p for p in model.parameters()], lr=1e-2, weight_decay=0.1)
    inputs = []
    handle = model.blocks[2].register_forward_pre_hook(lambda _m, args: inputs.append(args[0].requires_grad))
    for step in range(first_step, first_step + steps):
        idx = torch.randint(0, len(x), (32,))
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=False)  # a zeroed, not dropped, gradient: the freeze must drop it itself
        loss.backward()
        opt.step()
        if watch is not None:
            watch.step(step, loss)
    handle.remove()
    return opt, inputs


def test_the_change_is_relative_and_centred():
    z = torch.randn(16, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert representation_change(z, z) == 0
    assert representation_change(z + 5.0, z) == pytest.approx(0, abs=1e-12)  # a shift common to every image
    assert representation_change(1.01 * (z - z.mean(0)), z - z.mean(0)) == pytest.approx(0.01)
    assert representation_change(z[:8], z) == math.inf
    assert math.isnan(representation_change(z, torch.full_like(z, math.nan)))
    assert settled_prefix([3, 3, 1, 3], 3) == 2 and settled_prefix([3, 3], 3) == 2 and settled_prefix([0], 1) == 0


def test_the_settled_prefix_is_frozen_and_stays_bit_identical(digits):
    x, y, px, py = digits
    model = tiny()
    watch, records = settle_first_two(model, px, py)
    assert watch.freezer.frozen == 2 and watch.freezer.streaks == [2, 2, 0, 0]
    early = [n for n, _ in model.named_parameters() if n.startswith(("blocks.0.", "blocks.1."))]
    assert frozen_names(model) == ["cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias", *early]
    [record] = records
    assert record.step == 3 and record.data["blocks"] == [0, 1] and record.data["frozen_blocks"] == 2
    assert 0.25 < record.data["step_flops_saved"] < 0.45  # half the blocks: their backward (2 of a block's 3 parts)
    assert "the embeddings and blocks 0–1" in record.message

    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    late = model.blocks[3].mlp.fc1.weight.detach().clone()
    opt, inputs = train(model, x, y, 5)
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert all(p.grad is None for n, p in model.named_parameters() if n in frozen)
    assert not torch.equal(model.blocks[3].mlp.fc1.weight, late)
    assert inputs == [False] * 5  # the first trainable block's input needs no gradient: backward stops there
    watch.close()


def test_optimizer_state_is_kept(digits):
    x, y, px, py = digits
    model = tiny()
    opt, _ = train(model, x, y, 3)
    watch, _ = settle_first_two(model, px, py)
    weight = model.blocks[0].attn.qkv.weight
    before = {k: v.clone() for k, v in opt.state[weight].items()}
    opt.step()  # the step right after the freeze: the gradient left from training is dropped, so nothing moves
    assert all(torch.equal(opt.state[weight][k], v) for k, v in before.items())
    watch.close()


def test_a_resumed_watch_freezes_the_same_prefix(digits):
    _, _, px, py = digits
    watch, _ = settle_first_two(tiny(), px, py)
    state = watch.state_dict()
    assert state["freezer"] == {"frozen": 2, "streaks": [2, 2, 0, 0]}
    watch.close()

    resumed_model = tiny()
    resumed = Watch(resumed_model, px, py, every_n_steps=1, freeze_settled=FreezePolicy(patience=2))
    resumed.load_state_dict(state)
    assert frozen_names(resumed_model) == frozen_names(watch.model)
    assert resumed.freezer.frozen == 2 and resumed.freezer.streaks == [2, 2, 0, 0]
    resumed.close()


def test_a_bad_freezer_state_changes_nothing(digits):
    _, _, px, py = digits
    model = tiny()
    watch = Watch(model, px, py, freeze_settled=True)
    state = watch.state_dict()
    with pytest.raises(ValueError, match=r"Watch state\['freezer'\]: 'frozen' must be an int between 0 and 4"):
        watch.load_state_dict({**state, "freezer": {"frozen": 9, "streaks": [0] * 4}, "last_step": 5})
    assert watch.last_step is None and not frozen_names(model)
    watch.close()


def test_never_unfreezes_unless_asked(digits):
    x, y, px, py = digits
    model = tiny()
    watch, _ = settle_first_two(model, px, py)
    train(model, x, y, 3, first_step=4, watch=watch)  # every block moves now: the frozen prefix stays frozen
    assert watch.freezer.frozen == 2 and len(frozen_names(model)) == 28
    watch.freezer.unfreeze()
    assert not frozen_names(model) and watch.freezer.frozen == 0
    watch.close()


def test_a_failing_freeze_is_reported_once_and_changes_nothing(digits):
    """A forward that fails only where the policy runs one (eval mode with gradients: its plan) is a contained
    failure: nothing frozen, one monitor_error record, cleared once the plan works."""
    _, _, px, py = digits
    model = tiny()

    def fail_in_the_plan(module, _args):
        if torch.is_grad_enabled() and not module.training:
            raise RuntimeError("injected")

    handle = model.blocks[0].register_forward_pre_hook(fail_in_the_plan)
    watch, records = settle_first_two(model, px, py)
    assert not records and not frozen_names(model)
    faults = [r for r in watch.faults.failing.values()]
    assert [r.data["source"] for r in faults] == ["freeze policy"] and "injected" in faults[0].message
    handle.remove()
    watch.step(4)
    assert watch.freezer.frozen == 2 and watch.faults.failing  # an episode clears after two successes in a row
    watch.step(5)
    assert not watch.faults.failing
    watch.close()


def test_the_option_in_yaml_and_keywords(tmp_path):
    assert build_options(freeze_settled=True).freeze_settled is True
    assert build_options({"freeze_settled": {"patience": 5}}).freeze_settled == FreezePolicy(0.01, 5)
    path = tmp_path / "isiwatch.yaml"
    path.write_text("freeze_settled:\n  tolerance: 0.02\n")
    assert load_yaml(path).watch["freeze_settled"] == FreezePolicy(tolerance=0.02)
    path.write_text("every_n_steps: 5\nfreeze_settled:\n  tolerence: 0.02\n")
    with pytest.raises(ConfigError, match=r"isiwatch.yaml:3: option 'freeze_settled' has no key 'tolerence'"):
        load_yaml(path)
    with pytest.raises(ConfigError, match="option 'freeze_settled' patience must be an int from 1 to 1,000,000,000"):
        build_options(freeze_settled={"patience": 0})
    with pytest.raises(ConfigError, match="option 'freeze_settled' must be bool or FreezePolicy, got str"):
        build_options(freeze_settled="yes")
