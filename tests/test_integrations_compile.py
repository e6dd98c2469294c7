"""Watch on a torch.compile'd training model: it probes through the original module (``_orig_mod``), so the
compiled training graph is never recompiled.

Backend "aot_eager": it traces forward and backward through AOTAutograd like inductor does, but skips code
generation, which takes over a minute for this tiny ViT on 2 busy CPU cores; guards and recompilation
work the same for every backend.
"""

import pytest
import timm
import torch
import torch._dynamo as dynamo
import torch.nn.functional as F
from torch._dynamo.utils import counters

from isiwatch import Watch, analyze


@pytest.fixture
def fresh_dynamo():
    dynamo.reset()
    counters.clear()
    yield
    dynamo.reset()


def test_sampling_a_compiled_model_does_not_recompile(fresh_dynamo):
    from isiwatch.io.data import embedded_digits

    x, y = embedded_digits()
    px, py = x[4000:4032], y[4000:4032]
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                              num_classes=10, embed_dim=16, depth=2, num_heads=2, drop_path_rate=0.1)
    compiled = torch.compile(model, backend="aot_eager")
    watch = Watch(compiled, px, py, every_n_steps=2)
    opt = torch.optim.AdamW(compiled.parameters(), 1e-3)
    with dynamo.config.patch(error_on_recompile=True):  # the first compile is not a recompile
        for step in range(1, 7):
            loss = F.cross_entropy(compiled(x[:16]), y[:16])
            opt.zero_grad()
            loss.backward()
            opt.step()
            watch.step(step, loss)

    assert [s.step for s in watch.history] == [2, 4, 6]
    assert counters["stats"]["unique_graphs"] == 1
    assert watch.history[-1].layers["isi"] == analyze(model, px, py).layers["isi"]
    with dynamo.config.patch(error_on_recompile=True), pytest.raises(Exception, match="[Rr]ecompil"):
        compiled.eval()(px)  # control: probing through the compiled module itself would recompile
