"""The public API reads in help(): every name in ``isiwatch.__all__`` resolves to an object with a docstring,
the functions take explicit parameters (no ``**options`` catch-all) that their ``Args:`` sections name, and
``recommend_depth`` takes an analysis or its dict."""

import inspect

import pytest
import torch

import isiwatch
from isiwatch.truncation.healing import make_digits_vit

ASKED_FOR = {"analyze", "Watch", "recommend_depth", "truncate", "heal", "cut", "specialize", "WatchOptions",
             "Exporter", "JsonlExporter", "TensorBoardExporter", "PrometheusExporter", "MlflowExporter",
             "WandbExporter"}


def test_the_asked_for_names_are_public_and_resolve():
    assert ASKED_FOR <= set(isiwatch.__all__)
    for name in isiwatch.__all__:
        value = getattr(isiwatch, name)
        if name != "__version__" and not isinstance(value, tuple):
            assert inspect.getdoc(value), f"isiwatch.{name} has no docstring"
    assert not inspect.ismodule(isiwatch.truncate) and not inspect.ismodule(isiwatch.cut)


@pytest.mark.parametrize("name", ["truncate", "cut", "heal", "recommend_depth", "analyze", "specialize"])
def test_functions_have_explicit_parameters_named_in_their_args_section(name):
    function = getattr(isiwatch, name)
    parameters = inspect.signature(function).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in parameters.values()), f"{name} hides options in **kwargs"
    doc = inspect.getdoc(function)
    assert "Args:" in doc
    args = doc.split("Args:", 1)[1]
    for parameter in parameters:
        assert f"    {parameter}:" in "\n" + args or f"{parameter} (" in args, f"{name}: {parameter} undocumented"


def test_a_misspelt_truncate_option_is_python_s_own_type_error():
    with pytest.raises(TypeError, match="max_dorp"):
        isiwatch.truncate("model.pt", max_dorp=1.0)


def test_recommend_depth_takes_an_analysis_or_its_dict():
    torch.manual_seed(0)
    model = make_digits_vit(4)[0]
    analysis = isiwatch.analyze(model, torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,)))
    assert isiwatch.recommend_depth(analysis.to_dict()) == isiwatch.recommend_depth(analysis)
    with pytest.raises(ValueError, match="not an Analysis.to_dict"):
        isiwatch.recommend_depth({"model": {}})
