"""isiwatch.yaml: one-to-one Watch options, command sections, errors naming key and line."""

import pytest
import torch
from click.testing import CliRunner

from isiwatch import Watch
from isiwatch.cli import main
from isiwatch.config import ConfigError, WatchOptions, build_options, load_yaml


def write(tmp_path, text, name="isiwatch.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_yaml_maps_one_to_one_onto_watch_options(tmp_path):
    path = write(tmp_path, "every_n_steps: 25\nmonitor: probe_cls/last\nmode: max\nmin_delta: 0\n"
                           "stop_on_plateau: true\nprometheus_port: null\n")
    opts = build_options(path, every_n_steps=50)
    assert opts == WatchOptions(every_n_steps=50, monitor="probe_cls/last", mode="max", min_delta=0.0,
                                stop_on_plateau=True)
    every_field = {f: getattr(WatchOptions(), f) for f in WatchOptions.__dataclass_fields__}
    assert build_options(every_field) == WatchOptions()


@pytest.mark.parametrize("text, message", [
    ("every_n_steps: 10\n\nbogus: 1\n", ":3: unknown option 'bogus'"),
    ("every_n_steps: ten\n", ":1: option 'every_n_steps' must be int, got str 'ten'"),
    ("stop_on_plateau: 1\n", ":1: option 'stop_on_plateau' must be bool"),
    ("every_n_steps: true\n", ":1: option 'every_n_steps' must be int, got bool"),
    ("every_n_steps: [1\n", ": invalid YAML"),
    ("- 1\n- 2\n", ":1: the config must be a mapping"),
    ("patience: 2\npatience: 3\n", ":2: option 'patience' given twice"),
])
def test_bad_yaml_names_key_and_line(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_yaml(path)
    assert str(err.value).startswith(str(path)) and message in str(err.value)


def test_watch_accepts_config_file_and_explicit_arguments_win(tmp_path):
    path = write(tmp_path, "every_n_steps: 7\nplateau_patience: 5\n")
    import timm

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                              embed_dim=16, depth=2, num_heads=2)
    watch = Watch(model, torch.randn(8, 1, 28, 28), config=path, plateau_patience=2)
    assert watch.options.every_n_steps == 7 and watch.tracker.patience == 2
    with pytest.raises(ConfigError, match="unknown option 'every_steps'"):
        Watch(model, torch.randn(8, 1, 28, 28), every_steps=3)


def test_cli_config_check_and_command_sections(tmp_path):
    good = write(tmp_path, "every_n_steps: 20\nanalyze:\n  images: 64\n  batch-size: 32\n", "good.yaml")
    result = CliRunner().invoke(main, ["config", "check", str(good)])
    assert result.exit_code == 0 and "OK (1 Watch options; command sections: analyze)" in result.output
    bad = write(tmp_path, "every_n_steps: 20\nanalyze:\n  imagez: 3\n", "bad.yaml")
    result = CliRunner().invoke(main, ["config", "check", str(bad)])
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {bad}:3: unknown option 'imagez' for 'isiwatch analyze'"
    result = CliRunner().invoke(main, ["--config", str(bad), "analyze", "x.pt"])
    assert result.exit_code == 1 and "imagez" in result.output
    result = CliRunner().invoke(main, ["config", "check", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 1 and "cannot read config" in result.output
