"""isiwatch.yaml: one-to-one Watch options, command sections, errors naming key and line."""

import pytest
import torch
from click.testing import CliRunner

from isiwatch import Watch
from isiwatch.cli.commands import main
from isiwatch.watch.config import ConfigError, WatchOptions, build_options, load_yaml


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
    ("patience: 2\npatience: 3\n", ":2: duplicate key 'patience' (first given on line 1)"),
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


def check(path, *args):
    """``isiwatch [ARGS] config check PATH``: exit code and output."""
    result = CliRunner().invoke(main, [*args, "config", "check", str(path)])
    return result.exit_code, result.output


def assert_one_line_error(path, code, output, message):
    assert code == 1 and "Traceback" not in output
    assert output.count("\n") == 1 and output.startswith(f"Error: {path}:") and message in output, output


@pytest.mark.parametrize("text, message", [
    ("every_n_steps: !!python/object/apply:os.system ['echo owned']\n", ":1: invalid YAML (could not determine"),
    ("analyze:\n  images: !!python/name:os.system\n", ":2: invalid YAML (could not determine"),
    ("every_n_steps: !!python/object:pathlib.Path {}\n", ":1: invalid YAML (could not determine"),
    ("every_n_steps: !!int abc\n", ":1: invalid YAML value (invalid literal for int()"),
    ("? [a, b]\n: 1\n", ":1: the config has a key that is not a name"),
    ("every_n_steps: " + "[" * 5000 + "\n", "invalid YAML"),
], ids=["python-object-apply", "python-name", "python-object", "bad-int", "list-key", "deep"])
def test_unsafe_or_odd_yaml_is_one_line_error_in_config_check_and_config_option(tmp_path, text, message):
    path = write(tmp_path, text)
    assert_one_line_error(path, *check(path), message)
    assert_one_line_error(path, *check(path, "--config", str(path)), message)
    with pytest.raises(ConfigError, match="^" + str(path)):
        load_yaml(path)


def test_alias_bomb_is_refused_without_expanding(tmp_path):
    rows = ["&a0 [" + ", ".join(["lol"] * 9) + "]"]
    rows += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 7)]  # 9**6 lols once expanded
    path = write(tmp_path, "every_n_steps: [\n" + ",\n".join(rows) + "]\n")
    for args in ((), ("--config", str(path))):
        code, output = check(path, *args)
        assert_one_line_error(path, code, output, ":3: YAML aliases (*a0) are not supported")
    write(tmp_path, "analyze:\n  arch: &x vit_tiny_patch16_224\ntruncate:\n  arch: *x\n", "scalar.yaml")
    assert "YAML aliases (*x)" in check(tmp_path / "scalar.yaml")[1]


@pytest.mark.parametrize("text, message", [
    ("? " + "x" * 100_000 + "\n: 1\n", ":1: unknown option 'xxx"),
    ("every_n_steps: " + "y" * 100_000 + "\n", ":1: option 'every_n_steps' must be int, got str 'yyy"),
    ("every_n_steps: [" + ", ".join(["[1, 2, 3]"] * 20_000) + "]\n", "must be int, got list"),
    ("every_n_steps: !!" + "t" * 100_000 + " 1\n", ":1: invalid YAML (could not determine"),
    ("analyze:\n  images: " + "z" * 100_000 + "\n", ":2: option 'images' for 'isiwatch analyze': 'zzz"),
], ids=["key", "string", "list", "tag", "section"])
def test_error_messages_quote_at_most_a_few_hundred_characters(tmp_path, text, message):
    path = write(tmp_path, text)
    code, output = check(path)
    assert_one_line_error(path, code, output, message)
    assert len(output) < len(str(path)) + 400


@pytest.mark.parametrize("key, value, message", [
    ("every_n_steps", -5, "must be at least 1, got -5"),
    ("every_n_steps", 0, "must be at least 1, got 0"),
    ("probe_batch_size", -1, "must be at least 1, got -1"),
    ("history_size", 0, "must be at least 1, got 0"),
    ("isi_stall_window", 1, "must be at least 2, got 1"),
    ("min_layers", 1, "must be at least 2, got 1"),
    ("warmup", -1, "must be at least 0, got -1"),
    ("prometheus_port", 70000, "must be a port 0-65535, got 70000"),
    ("mode", "sideways", "must be one of min, max; got 'sideways'"),
    ("phase_metric", "nope", "must be one of attn_token_change"),
    ("min_delta", float("nan"), "must be a finite number, got nan"),
])
def test_config_check_and_watch_share_range_and_choice_checks(tmp_path, key, value, message):
    path = write(tmp_path, f"plateau_patience: 2\n{key}: {'.nan' if value != value else value}\n")
    assert_one_line_error(path, *check(path), f":2: option {key!r} {message}")
    for build in (lambda: WatchOptions(**{key: value}), lambda: build_options({key: value}),
                  lambda: build_options(None, **{key: value}), lambda: build_options(path)):
        with pytest.raises(ConfigError, match=f"option {key!r} {message}"):
            build()


def test_watch_refuses_out_of_range_options_at_construction():
    import timm

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                              embed_dim=16, depth=2, num_heads=2)
    for options, message in (({"history_size": 0}, "option 'history_size' must be at least 1, got 0"),
                             ({"mode": "sideways"}, "option 'mode' must be one of min, max"),
                             ({"probe_batch_size": -1}, "option 'probe_batch_size' must be at least 1, got -1")):
        with pytest.raises(ConfigError, match=message):
            Watch(model, torch.randn(8, 1, 28, 28), **options)


@pytest.mark.parametrize("text, message", [
    ("analyze:\n  images: abc\n", ":2: option 'images' for 'isiwatch analyze': 'abc' is not a valid integer"),
    ("analyze:\n  images: 2\n", ":2: option 'images' for 'isiwatch analyze': 2 is not in the range x>=4"),
    ("analyze:\n  out: [1, 2]\n", ":2: option 'out' for 'isiwatch analyze' must be a single value, got list"),
    ("analyze:\n  isi-recon: {a: 1}\n", ":2: option 'isi_recon' for 'isiwatch analyze' must be a single value"),
    ("truncate:\n  fmt: zip\n", ":2: option 'fmt' for 'isiwatch truncate': 'zip' is not one of 'pt', 'safetensors'"),
    ("specialize:\n  norms: maybe\n", ":2: option 'norms' for 'isiwatch specialize': 'maybe' is not a valid boolean"),
    ("demo:\n  prometheus_port: -1\n", ":2: option 'prometheus_port' for 'isiwatch demo': -1 is not in the range"),
    ("analyze:\n  images: 64\n  images: 32\n", ":3: duplicate key 'images' (first given on line 2)"),
    ("analyze: {images: 64, images: 32}\n", ":1: duplicate key 'images' (first given on line 1)"),
    ("analyze:\n  batch-size: 8\n  batch_size: 9\n", ":3: duplicate key 'batch_size' in section 'analyze' "
                                                       "(first given on line 2)"),
    ("analyze:\n  images: 64\nanalyze:\n  images: 32\n", ":3: duplicate key 'analyze' (first given on line 1)"),
    ("truncate:\n  arch: {a: 1, a: 2}\n", ":2: duplicate key 'a' (first given on line 2)"),
])
def test_config_check_converts_command_sections_like_the_command(tmp_path, text, message):
    path = write(tmp_path, text)
    assert_one_line_error(path, *check(path), message)
    assert_one_line_error(path, *check(path, "--config", str(path)), message)


def test_command_section_values_reach_the_command_and_null_keeps_its_default(tmp_path):
    path = write(tmp_path, "analyze:\n  images: null\n  batch-size: 32\n  isi_recon: yes\n"
                           "truncate:\n  fmt: safetensors\n")
    assert check(path) == (0, f"{path}: OK (0 Watch options; command sections: analyze, truncate)\n")
    ctx = main.make_context("isiwatch", ["--config", str(path), "config", "check", str(path)])
    assert ctx.default_map == {"analyze": {"batch_size": 32, "isi_recon": True}, "truncate": {"fmt": "safetensors"}}


def test_an_oversized_config_is_refused_before_yaml_builds_it_in_the_watch_too(tmp_path):
    """A 25 MB list in a config once took 6 GB of memory before its error: the Watch's own ``config=`` path is
    bounded as the command line's is, one line naming the file and its size."""
    path = tmp_path / "isiwatch.yaml"
    path.write_text("every_n_steps: 5\nmetrics: [" + "isi, " * 300_000 + "isi]\n")
    size = path.stat().st_size
    import timm

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                              embed_dim=16, depth=2, num_heads=2)
    with pytest.raises(ConfigError) as info:
        Watch(model, torch.randn(8, 1, 28, 28), config=str(path))
    assert str(info.value) == (f"{path}: {size:,} bytes is too large for an isiwatch.yaml (at most {1 << 20:,})")
    assert path.stat().st_size == size
