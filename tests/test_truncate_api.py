"""The Python API of truncation: ``truncate`` on a model object with tensors or a DataLoader, ``cut`` (surgery
only) and ``heal`` (the late blocks only), with errors that name Python parameters."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from isiwatch.io.data import embedded_digits
from isiwatch.measure.boundary_distances import boundary_distances
from isiwatch.truncation.healing import heal, make_digits_vit
from isiwatch.truncation.strategies import choose_blocks
from isiwatch.truncation.surgery import cut
from isiwatch.truncation.truncate import truncate


@pytest.fixture(scope="module")
def digits():
    """600 model-ready digits (normalised 28×28) and their labels."""
    images, labels = embedded_digits()
    return images[:600], labels[:600]


@pytest.fixture
def vit():
    """A small random 4-block digits ViT."""
    model, _ = make_digits_vit(seed=0, depth=4, embed_dim=32, num_heads=2)
    return model.eval()


def state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_truncate_takes_a_model_object_and_tensors(vit, digits):
    before = state(vit)
    result = truncate(vit, data=digits, strategy="tail", keep=2, epochs=1, images=64)
    assert len(result.model.blocks) == 2 and result.report["kept_blocks"] == [0, 1]
    assert result.paths == [] and result.report["output"] is None and result.report["normalization"] is None
    assert result.report["data"]["heal"] == {"source": "tensors", "images": 480, "of": 600}
    assert all(torch.equal(v, before[k]) for k, v in vit.state_dict().items())  # the source is not healed


def test_truncate_takes_a_dataloader(vit, digits):
    loader = DataLoader(TensorDataset(*digits), batch_size=100)
    result = truncate(vit, data=loader, strategy="bi", keep=3, epochs=1, images=64)
    assert len(result.model.blocks) == 3 and result.report["healing_steps"] == 5  # 480 images in its batches of 100
    assert result.report["data"]["validation"]["source"] == "DataLoader"


def test_a_misspelt_option_is_a_type_error_naming_it(vit, digits):
    with pytest.raises(TypeError, match="kep"):
        truncate(vit, data=digits, kep=2)


def test_errors_name_python_parameters_not_flags(vit, digits, tmp_path):
    with pytest.raises(ValueError, match=r"^keep fixes the depth; it cannot be combined with strategy='auto'$"):
        truncate(vit, data=digits, strategy="auto", keep=2)
    with pytest.raises(ValueError, match=r"^max_drop must be at least 0 points"):
        truncate(vit, data=digits, max_drop=-1)
    with pytest.raises(ValueError, match="^out writes a checkpoint"):
        truncate(vit, tmp_path / "cut.pt", data=digits, keep=2)
    with pytest.raises(ValueError, match="^keep must be between 1 and 3"):
        truncate(vit, data=digits, keep=4, epochs=0)


def test_cut_drops_the_strategys_blocks_and_leaves_the_source(vit, digits):
    images = digits[0][:64]
    before = state(vit)
    tail = cut(vit, 2, strategy="tail")
    assert len(tail.blocks) == 2
    for i in range(2):
        assert all(torch.equal(a, b) for a, b in zip(tail.blocks[i].parameters(), vit.blocks[i].parameters()))
    kept = choose_blocks("bi", 4, 2, distances=boundary_distances(vit, images))
    small = cut(vit, 2, strategy="bi", images=images)
    for position, i in enumerate(kept):
        assert all(torch.equal(a, b) for a, b in zip(small.blocks[position].parameters(), vit.blocks[i].parameters()))
    with torch.no_grad():
        assert small(images).shape == (64, 10) and torch.isfinite(small(images)).all()
    assert all(torch.equal(v, before[k]) for k, v in vit.state_dict().items())
    with pytest.raises(ValueError, match="^the bi strategy measures the model: pass images$"):
        cut(vit, 2, strategy="bi")


def test_heal_trains_only_the_late_blocks_and_lowers_the_loss(vit, digits):
    model = cut(vit, 3, strategy="tail")
    loader = DataLoader(TensorDataset(*digits), batch_size=50, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    x, y = digits

    def loss():
        with torch.no_grad():
            return float(F.cross_entropy(model(x), y))

    before, start = state(model), loss()
    steps = heal(model, loader, train_last=1, epochs=2, lr=3e-3)
    assert steps == 24
    after = model.state_dict()
    early = [k for k in before if not k.startswith(("blocks.2.", "norm.", "fc_norm.", "head."))]
    late = [k for k in before if k.startswith(("blocks.2.", "head."))]
    assert early and all(torch.equal(after[k], before[k]) for k in early)  # embeddings, blocks 0 and 1
    assert all(not torch.equal(after[k], before[k]) for k in late if k.endswith("weight"))
    assert loss() < start
    assert not model.training and all(p.requires_grad for p in model.parameters())


def test_checkpoint_and_image_errors_name_python_parameters_and_cli_flags(tmp_path):
    """The same refusal names ``num_heads=N`` for a Python caller and ``--num-heads N`` on the command line."""
    from click.testing import CliRunner

    from isiwatch.cli.commands import main
    from isiwatch.io.checkpoint import load_checkpoint, save_checkpoint
    from isiwatch.io.timm_data import resolve_data_config

    model, kwargs = make_digits_vit(2)
    path = save_checkpoint(tmp_path / "m.pt", "vit_tiny_patch16_224", kwargs, model.state_dict())
    with pytest.raises(ValueError, match=r"m\.pt: num_heads 5 does not divide the embed_dim 64") as exc:
        load_checkpoint(path, num_heads=5)
    assert "--" not in str(exc.value)
    with pytest.raises(ValueError, match="^mean and std go together"):
        resolve_data_config(model, "mnist", mean=(0.5,))
    result = CliRunner().invoke(main, ["analyze", str(path), "--num-heads", "5"])
    assert result.exit_code == 1 and "--num-heads 5 does not divide the embed_dim 64" in result.output
