"""Images of ``truncate`` and ``analyze`` through timm's data layer: the uncut accuracy equals timm validate.py's
evaluation of the same folder (create_dataset + resolve_data_config + create_loader, model.eval()); a cut file
records its data config so timm resolves the same preprocessing from the model; unreadable images are refused in
one line naming the file."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import struct
import tarfile
from collections import Counter
from pathlib import Path

import pytest
import timm
import torch
from click.testing import CliRunner
from PIL import Image
from timm.data import create_dataset, create_loader, create_transform, resolve_data_config

from isiwatch.cli.commands import main
from isiwatch.io.checkpoint import load_checkpoint
from isiwatch.io.models import build_model
from isiwatch.io.timm_data import DigitsSource
from isiwatch.truncation.truncate import truncate

KWARGS = {"img_size": 28, "patch_size": 7, "in_chans": 1, "num_classes": 10, "embed_dim": 32, "depth": 4,
          "num_heads": 2}


def write_digits(root: Path, start: int, count: int) -> Path:
    """``count`` real MNIST digits (the embedded ones, shuffled) as PNGs in a folder tree, one folder per class."""
    source = DigitsSource()
    for i in range(start, start + count):
        label = int(source.labels()[i])
        (root / str(label)).mkdir(parents=True, exist_ok=True)
        source.image(i, "L").save(root / str(label) / f"{i}.png")
    return root


@pytest.fixture
def folders(tmp_path: Path) -> Path:
    """timm train.py's layout: train/ (40 digits) and validation/ (30 other digits)."""
    write_digits(tmp_path / "digits" / "train", 0, 40)
    write_digits(tmp_path / "digits" / "validation", 40, 30)
    return tmp_path / "digits"


@pytest.fixture
def train_py_ckpt(tmp_path: Path) -> Path:
    """A timm train.py checkpoint of a 1-channel ViT whose args record no mean/std (train.py then takes the
    model's pretrained_cfg: 0.5/0.5), bicubic interpolation and crop_pct 0.875 (resize to 32, centre crop 28)."""
    torch.manual_seed(3)
    model = timm.create_model("vit_tiny_patch16_224", **KWARGS)
    digits = DigitsSource()  # a class-mean head, so predictions differ from image to image (and beat chance)
    images = (digits.pixels[1000:2000].float().div(255).unsqueeze(1) - 0.5) / 0.5
    with torch.no_grad():
        features = model.forward_head(model.forward_features(images), pre_logits=True)
        means = torch.stack([features[digits.labels()[1000:2000] == c].mean(0) for c in range(10)])
        model.head.weight.copy_(means - means.mean(0))
        model.head.bias.copy_(-0.5 * ((means - means.mean(0)) ** 2).sum(1))
    args = argparse.Namespace(model="vit_tiny_patch16_224", model_kwargs={"num_heads": 2}, mean=None, std=None,
                              interpolation="bicubic", crop_pct=0.875, img_size=28, in_chans=1, input_size=None,
                              hflip=0.0, color_jitter=0.0, scale=[0.9, 1.0], aa=None, reprob=0.0)
    path = tmp_path / "model_best.pth.tar"
    torch.save({"arch": "vit_tiny_patch16_224", "args": args, "state_dict": model.state_dict()}, path)
    return path


def validate_py(model: torch.nn.Module, root: Path, args: dict) -> tuple[float, Counter]:
    """timm validate.py's evaluation of ``root``: its dataset, data config and loader (prefetcher on CPU)."""
    config = resolve_data_config(args, model=model)
    dataset = create_dataset("", root=str(root), split="", input_img_mode="RGB" if config["input_size"][0] == 3
                             else "L")
    loader = create_loader(dataset, input_size=config["input_size"], batch_size=16, use_prefetcher=True,
                           interpolation=config["interpolation"], mean=config["mean"], std=config["std"],
                           num_workers=0, crop_pct=config["crop_pct"], crop_mode=config["crop_mode"],
                           device=torch.device("cpu"))
    model.eval()
    pairs: Counter = Counter()
    with torch.no_grad():
        for x, y in loader:
            pairs.update(zip(y.tolist(), model(x).argmax(-1).tolist()))
    return sum(n for (y, p), n in pairs.items() if y == p) / sum(pairs.values()), pairs


def test_uncut_accuracy_equals_timm_validate_py_on_the_same_folder(folders, train_py_ckpt, tmp_path):
    result = truncate(train_py_ckpt, tmp_path / "cut.pt", data=str(folders), strategy="tail", keep=2, epochs=1,
                      images=16, workers=0)
    report = result.report
    assert report["data"]["validation"]["source"] == str(folders / "validation")
    assert report["held_out_images"] == 30
    model = build_model(load_checkpoint(train_py_ckpt))
    args = {"interpolation": "bicubic", "crop_pct": 0.875, "img_size": 28, "in_chans": 1}
    expected, pairs = validate_py(model, folders / "validation", args)
    assert report["accuracy"]["uncut"] == pytest.approx(expected, abs=1e-6)  # float32 mean of 30
    assert len({p for _, p in pairs.elements()}) > 1  # predictions differ by image: the check is not vacuous
    assert ("--input-size 1 28 28 --mean 0.5 --std 0.5 --interpolation bicubic --crop-pct 0.875"
            in report["validate_command"])  # timm validate.py's flags for the cut file
    norm = report["normalization"]
    assert (norm["mean"], norm["std"], norm["source"]) == ([0.5], [0.5], "pretrained_cfg")
    assert (norm["interpolation"], norm["crop_pct"], norm["input_size"]) == ("bicubic", 0.875, [1, 28, 28])
    assert norm["augment"] == {"scale": [0.9, 1.0], "hflip": 0.0, "color_jitter": 0.0, "re_prob": 0.0}

    # the cut file carries the data config: timm resolves it from the model alone, and validate.py agrees
    cut = build_model(load_checkpoint(tmp_path / "cut.pt"))
    config = resolve_data_config(model=cut)
    assert config == {"input_size": [1, 28, 28], "interpolation": "bicubic", "mean": [0.5], "std": [0.5],
                      "crop_pct": 0.875, "crop_mode": "center"}
    healed, _ = validate_py(cut, folders / "validation", {})
    assert healed == pytest.approx(report["accuracy"]["healed"], abs=1e-6)


def test_analyze_reads_the_folder_as_validate_py_does(folders, train_py_ckpt, tmp_path):
    result = CliRunner().invoke(main, ["analyze", str(train_py_ckpt), "--data", str(folders / "validation"),
                                       "--images", "30", "--workers", "0", "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert "normalised with mean 0.5 std 0.5 (pretrained_cfg)" in result.output


def test_mnist_is_normalised_as_the_checkpoint_was_trained(tmp_path):
    """``--data mnist`` keeps the embedded digits but uses the statistics train.py recorded."""
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", **KWARGS)
    args = argparse.Namespace(model="vit_tiny_patch16_224", model_kwargs={"num_heads": 2}, mean=[0.3], std=[0.2],
                              img_size=28, in_chans=1)
    path = tmp_path / "c.pth.tar"
    torch.save({"arch": "vit_tiny_patch16_224", "args": args, "state_dict": model.state_dict()}, path)
    result = truncate(path, strategy="tail", keep=2, epochs=0, images=16, workers=0)
    assert result.report["normalization"]["mean"] == [0.3] and result.report["normalization"]["std"] == [0.2]
    assert result.report["normalization"]["source"] == "checkpoint args"
    plain = tmp_path / "plain.pth.tar"
    torch.save({"arch": "vit_tiny_patch16_224", "model_kwargs": {"num_heads": 2}, "state_dict": model.state_dict()},
               plain)
    norm = truncate(plain, strategy="tail", keep=2, epochs=0, images=16, workers=0).report["normalization"]
    assert (norm["mean"], norm["source"], norm["crop_pct"]) == ([0.1307], "mnist", 1.0)  # the demo's digits


def test_mnist_of_a_train_py_checkpoint_is_normalised_as_train_py_trained_it(train_py_ckpt):
    """A train.py checkpoint whose args leave mean/std unset was trained at its pretrained_cfg's 0.5/0.5: ``--data
    mnist`` reads the embedded digits under that normalisation (and the args' bicubic resize and 0.875 crop), not
    MNIST's own statistics, and scores the uncut model as timm's eval transform of those digits does."""
    result = truncate(train_py_ckpt, strategy="tail", keep=2, epochs=0, images=16, workers=0)
    norm = result.report["normalization"]
    assert (norm["mean"], norm["std"], norm["source"]) == ([0.5], [0.5], "pretrained_cfg")
    assert (norm["interpolation"], norm["crop_pct"]) == ("bicubic", 0.875)
    model = build_model(load_checkpoint(train_py_ckpt)).eval()
    digits = DigitsSource()
    held_out = range(4000, 5000)  # the held-out digits a fixed strategy reports on
    labels = digits.labels()[4000:]

    def accuracy_under(mean: float, std: float) -> float:
        config = resolve_data_config({"interpolation": "bicubic", "crop_pct": 0.875, "img_size": 28, "in_chans": 1,
                                      "mean": (mean,), "std": (std,)}, model=model)
        transform = create_transform(**config)
        with torch.no_grad():
            images = torch.stack([transform(digits.image(i, "L")) for i in held_out])
            return float((model(images).argmax(-1) == labels).float().mean())
    own = accuracy_under(0.5, 0.5)
    assert result.report["accuracy"]["uncut"] == pytest.approx(own, abs=1e-6)
    assert own > accuracy_under(0.1307, 0.3081) + 0.02  # MNIST's statistics score this model worse


@pytest.mark.parametrize("workers", [0, 2])
def test_a_truncated_png_is_named_in_one_line(folders, train_py_ckpt, tmp_path, workers):
    bad = next((folders / "validation").rglob("*.png"))
    bad.write_bytes(bad.read_bytes()[:60])
    before = bad.read_bytes()
    result = CliRunner().invoke(main, ["truncate", str(train_py_ckpt), "--out", str(tmp_path / "cut.pt"), "--data",
                                       str(folders), "--strategy", "tail", "--keep", "2", "--epochs", "1",
                                       "--images", "8", "--workers", str(workers)])
    assert result.exit_code == 1
    lines = [line for line in re.split(r"[\r\n]", result.output)  # the healing bar and its stage line aside
             if line.strip() and not line.startswith(("heal:", "healing the 2-block cut"))]
    assert len(lines) == 1 and str(bad) in lines[0] and "internal error" not in lines[0], result.output
    assert bad.read_bytes() == before and not (tmp_path / "cut.pt").exists()


def test_a_decompression_bomb_is_one_line_and_large_images_load_quietly(folders, train_py_ckpt, tmp_path,
                                                                        monkeypatch, recwarn):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # PIL warns above 1,000 pixels, refuses above 2,000
    Image.new("L", (40, 40), 3).save(folders / "train" / "0" / "large.png")  # 1,600 pixels: loads, no warning
    ok = CliRunner().invoke(main, ["analyze", str(train_py_ckpt), "--data", str(folders / "train"), "--images", "41",
                                   "--workers", "0", "--out", str(tmp_path / "a")])
    assert ok.exit_code == 0, ok.output
    assert not [w for w in recwarn if issubclass(w.category, Image.DecompressionBombWarning)]
    bomb = folders / "validation" / "0" / "bomb.png"
    bomb.parent.mkdir(exist_ok=True)
    Image.new("L", (100, 100), 0).save(bomb)
    result = CliRunner().invoke(main, ["analyze", str(train_py_ckpt), "--data", str(folders / "validation"),
                                       "--images", "31", "--workers", "0", "--out", str(tmp_path / "b")])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and str(bomb) in lines[0] and "DecompressionBombError" not in lines[0], result.output
    assert "too many pixels" in lines[0] and not (tmp_path / "b").exists()


def test_bad_inputs_are_one_line_errors(folders, train_py_ckpt, tmp_path):
    def run(*extra: str) -> list[str]:
        result = CliRunner().invoke(main, ["truncate", str(train_py_ckpt), "--out", str(tmp_path / "c.pt"),
                                           "--strategy", "tail", "--keep", "2", "--epochs", "0", "--images", "8",
                                           "--workers", "0", *extra])
        assert result.exit_code != 0
        return [line for line in result.output.splitlines() if line.strip()]

    empty = tmp_path / "empty"
    empty.mkdir()
    lines = run("--data", str(empty))
    assert len(lines) == 1 and str(empty) in lines[0] and "internal error" not in lines[0], lines
    lines = run("--data", str(tmp_path / "missing"))
    assert len(lines) == 1 and "no such data folder" in lines[0], lines
    for i in range(11):  # 11 classes for a 10-class head
        (tmp_path / "eleven" / f"class{i:02d}").mkdir(parents=True)
        DigitsSource().image(i, "L").save(tmp_path / "eleven" / f"class{i:02d}" / "digit.png")
    lines = run("--data", str(tmp_path / "eleven"))
    assert len(lines) == 1 and "11 classes but the model's head has 10 outputs" in lines[0], lines
    lines = run("--data", str(folders), "--devices", "64", "--accelerator", "cpu")
    assert len(lines) == 1 and "--devices 64: this machine has" in lines[0], lines
    assert not (tmp_path / "c.pt").exists()


def test_an_empty_or_missing_class_folder_is_refused_in_one_line(folders, train_py_ckpt, tmp_path):
    """timm's folder reader numbers only the classes it finds images of: with ``train/7/`` empty it would label
    the 8s as 7 and the 9s as 8 while validation keeps 0-9. Each case is refused in one line naming the folder
    or class, and nothing is written."""
    import shutil

    for image in (folders / "train" / "7").iterdir():
        image.unlink()  # train/7/ is there, empty
    code, lines = truncate_cli(train_py_ckpt, tmp_path / "c.pt", "--data", str(folders))
    assert code == 1 and len(lines) == 1, lines
    assert f"{folders / 'train' / '7'}: an empty class folder" in lines[0]
    (folders / "train" / "7").rmdir()  # no 7/ at all: a gap among the numbered classes
    code, lines = truncate_cli(train_py_ckpt, tmp_path / "c.pt", "--data", str(folders / "train"))
    assert code == 1 and len(lines) == 1 and "no class folder 7 among the numbered class folders 0–9" in lines[0]

    named = tmp_path / "named"  # classes named by words, validation without one of them
    for split, names in (("train", ("cat", "dog", "owl")), ("validation", ("cat", "owl"))):
        for i, name in enumerate(names):
            (named / split / name).mkdir(parents=True)
            shutil.copy(next((folders / "validation" / str(i)).iterdir()), named / split / name / "a.png")
    code, lines = truncate_cli(train_py_ckpt, tmp_path / "c.pt", "--data", str(named))
    assert code == 1 and len(lines) == 1, lines
    assert (f"{named / 'validation'}: its classes differ from the healing images': no dog (which "
            f"{named / 'train'} has)") in lines[0]
    assert not (tmp_path / "c.pt").exists()


def write_torchvision_mnist(root: Path) -> Path:
    """torchvision's MNIST files under ``root/MNIST/raw`` (idx format, as its download leaves them): 40 of the embedded
    digits as the train split, 30 others as the test split; nothing is downloaded."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    digits = DigitsSource()
    for prefix, start, count in (("train", 0, 40), ("t10k", 40, 30)):
        pixels, labels = digits.pixels[start:start + count], digits.labels()[start:start + count]
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">4i", 0x803, count, 28, 28) + pixels.numpy().tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            struct.pack(">2i", 0x801, count) + labels.to(torch.uint8).numpy().tobytes())
    return root


def truncate_cli(ckpt: Path, out: Path, *extra: str) -> tuple[int, list[str]]:
    """``isiwatch truncate`` of a fixed cut without healing; its exit code and non-blank output lines."""
    result = CliRunner().invoke(main, ["truncate", str(ckpt), "--out", str(out), "--strategy", "tail", "--keep", "2",
                                       "--epochs", "0", "--images", "8", "--workers", "0", *extra])
    return result.exit_code, [line for line in result.output.splitlines() if line.strip()]


def test_dataset_names_a_timm_reader_and_its_splits(folders, train_py_ckpt, tmp_path):
    """``--dataset torch/folder`` (torchvision's ImageFolder through timm's create_dataset) heals on the train split
    and evaluates on the validation split: the uncut accuracy is validate.py's on that folder."""
    code, lines = truncate_cli(train_py_ckpt, tmp_path / "cut.pt", "--dataset", "torch/folder", "--data", str(folders),
                               "--report", str(tmp_path / "r.json"))
    assert code == 0, lines
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["data"]["heal"] == {"source": f"torch/folder (train) in {folders}", "images": 40, "of": 40}
    assert report["data"]["validation"]["source"] == f"torch/folder (validation) in {folders}"
    assert report["held_out_images"] == 30
    expected, _ = validate_py(build_model(load_checkpoint(train_py_ckpt)), folders / "validation",
                              {"interpolation": "bicubic", "crop_pct": 0.875, "img_size": 28, "in_chans": 1})
    assert report["accuracy"]["uncut"] == pytest.approx(expected, abs=1e-6)
    assert f"validate.py {folders} --dataset torch/folder --split validation" in report["validate_command"]


def test_a_torchvision_dataset_is_read_from_its_root(train_py_ckpt, tmp_path):
    """``--dataset torch/mnist``: torchvision's MNIST files (held as its arrays, labels from its targets), train for
    healing and the test split (``--val-split test``) halved into validation and test; the uncut accuracy is that of
    the same digits written as a folder tree."""
    root = write_torchvision_mnist(tmp_path / "tv")
    code, lines = truncate_cli(train_py_ckpt, tmp_path / "cut.pt", "--dataset", "torch/mnist", "--data", str(root),
                               "--val-split", "test", "--report", str(tmp_path / "r.json"))
    assert code == 0, lines
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["data"]["heal"]["images"], report["held_out_images"]) == (40, 30)
    code, lines = truncate_cli(train_py_ckpt, tmp_path / "cut2.pt", "--data", str(write_digits(tmp_path / "f", 0, 40)),
                               "--eval-data", str(write_digits(tmp_path / "v", 40, 30)),
                               "--report", str(tmp_path / "r2.json"))
    assert code == 0, lines
    assert report["accuracy"] == json.loads((tmp_path / "r2.json").read_text())["accuracy"]


def test_dataset_errors_are_one_line(folders, train_py_ckpt, tmp_path):
    def refused(*extra: str) -> str:
        code, lines = truncate_cli(train_py_ckpt, tmp_path / "c.pt", *extra)
        assert code != 0 and len(lines) == 1 and "Traceback" not in lines[0], lines
        return lines[0]

    data = ("--data", str(folders))
    assert "unknown dataset reader foo/" in refused("--dataset", "foo/bar", *data)
    assert "Unknown torchvision dataset nonesuch" in refused("--dataset", "torch/nonesuch", *data)
    if importlib.util.find_spec("datasets") is None:
        assert "needs the datasets package (pip install datasets)" in refused("--dataset", "hfds/mnist", *data)
    assert "streams images in one order" in refused("--dataset", "wds/shards", *data)
    assert f"{folders}: no nope/ sub-folder" in refused("--dataset", "", "--val-split", "nope", *data)
    assert "not found under" in refused("--dataset", "torch/mnist", "--data", str(tmp_path))
    assert "name the splits of a --dataset" in refused("--train-split", "train", *data)
    assert not (tmp_path / "c.pt").exists()


def test_a_split_indexes_one_tensor_of_image_indices(folders, train_py_ckpt):
    """The parts of a folder's split index its images through views of one int64 tensor, not Python lists of ints:
    every forked DataLoader worker would write those ints' reference counts and so copy their pages."""
    from isiwatch.truncation.data_split import load_split

    split = load_split(build_model(load_checkpoint(train_py_ckpt)), str(folders / "train"), workers=0)
    heal, held = split.train_x.dataset, split.held_out_x.dataset
    assert isinstance(heal.indices, torch.Tensor) and heal.indices.dtype == torch.long
    assert heal.indices.untyped_storage().data_ptr() == held.indices.untyped_storage().data_ptr()
    assert sorted(torch.cat([heal.indices, held.indices]).tolist()) == list(range(40))


def test_tar_files_are_read_by_timms_image_tar_reader(folders, train_py_ckpt, tmp_path):
    """``--data train.tar --eval-data validation.tar`` (timm's image-in-tar reader) scores as the folders they pack."""
    tars = {}
    for split in ("train", "validation"):
        tars[split] = tmp_path / f"{split}.tar"
        with tarfile.open(tars[split], "w") as tar:
            for path in sorted((folders / split).rglob("*.png")):
                tar.add(path, arcname=str(path.relative_to(folders / split)))
    code, lines = truncate_cli(train_py_ckpt, tmp_path / "cut.pt", "--data", str(tars["train"]), "--eval-data",
                               str(tars["validation"]), "--report", str(tmp_path / "tar.json"))
    assert code == 0, lines
    code, lines = truncate_cli(train_py_ckpt, tmp_path / "cut2.pt", "--data", str(folders),
                               "--report", str(tmp_path / "folder.json"))
    assert code == 0, lines
    packed, unpacked = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("tar", "folder"))
    assert packed["data"]["heal"] == {"source": str(tars["train"]), "images": 40, "of": 40}
    assert packed["accuracy"] == unpacked["accuracy"]
