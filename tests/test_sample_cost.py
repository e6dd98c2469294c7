"""What a Watch sample asks of the device, counted on the CPU (deterministic): aten ops against a plain forward of
the probe batch, their growth with the number of probe images, and the scalar reads (host–device syncs on a GPU).
The wall-time ratios are measured by ``benchmarks/bench_sample_cost.py``, not here."""

import sys
from pathlib import Path

import pytest
import timm
import torch

import isiwatch

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from op_count import OpCount  # noqa: E402


def vit_tiny():
    """vit_tiny's 12 blocks, 3 heads and width, on 32 px images (the op counts do not depend on the image size)."""
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=10).eval()


def counted_sample(model, images: int) -> tuple[OpCount, OpCount]:
    """(forward, sample) counts: a plain no-grad forward of the probe batch and one Watch sample with a loss tensor
    (the second sample: the first makes what a probe batch keeps)."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(images, 3, 32, 32, generator=gen), torch.arange(images) % 10
    with OpCount() as forward, torch.no_grad():
        model(x)
    watch = isiwatch.Watch(model, x, y, every_n_steps=1, strict=True)
    watch.sample(0)
    with OpCount() as sample:
        watch.sample(1, torch.tensor(0.5))
    watch.close(final_sample=False)
    assert watch.history[-1].loss == 0.5
    return forward, sample


def test_a_sample_costs_ops_that_do_not_grow_with_the_probe_images_and_reads_the_host_once_or_twice():
    """16 and 128 probe images: the sample's op count is the same (the per-image attention and per-chunk metric
    loops made it 22x and 87x a forward's), at most 5.4x a plain forward's (5.45x before the attention statistics
    were kept per block and the host read joined the values in one op, which left room for the per-token table's
    own norms and products instead of a stacked copy of five token tensors; the issue's goal is 4x: the probes' 12
    conjugate-gradient steps alone are about 1.6x a vit_tiny forward's ops), and the host is read twice: the one
    read of every number (loss included) and the ridge's batched eigh, which checks its result."""
    model = vit_tiny()
    (fwd16, s16), (fwd128, s128) = counted_sample(model, 16), counted_sample(model, 128)
    assert fwd16.ops == fwd128.ops
    assert s128.ops <= 1.1 * s16.ops, (s16.ops, s128.ops)
    assert s16.ops <= 5.4 * fwd16.ops, (s16.ops, fwd16.ops)
    for count in (s16, s128):
        assert count.scalar_reads <= 2, (dict(count.syncs), dict(count.reads))
        assert dict(count.reads) == {"tolist": 1}  # read_back's one read; nothing else reads the host
        assert set(count.syncs) <= {"_linalg_eigh"}


def test_the_host_read_costs_the_same_ops_for_2_or_20_values():
    """read_back joins the values in their own dtypes (a 0-d loss, a bf16 tensor) and converts once: its ops do not
    grow with the values (a detach, reshape and copy per value made it 3 more ops each), and the numbers are exact."""
    from isiwatch.measure.readback import read_back

    def counted(n: int) -> tuple[OpCount, dict[str, list[float]]]:
        values = {f"v{i}": torch.full((3,), 0.1 * i) for i in range(n)}
        values["loss"] = torch.tensor(0.25, dtype=torch.bfloat16, requires_grad=True) * 2
        with OpCount() as count:
            read = read_back(values)
        return count, read

    (two, read2), (twenty, read20) = counted(2), counted(20)
    assert two.ops == twenty.ops, (dict(two.by_name), dict(twenty.by_name))
    assert read2["loss"] == read20["loss"] == [0.5]
    assert read20["v7"] == [torch.tensor(0.7).item()] * 3  # the float32 value, widened exactly
    assert dict(twenty.reads) == {"tolist": 1}


def test_a_sample_shows_its_parts_in_the_users_profiler():
    """The Watch's ranges appear in a torch.profiler trace of a training loop's sample."""
    from torch.profiler import ProfilerActivity, profile

    model = vit_tiny()
    x, y = torch.randn(8, 3, 32, 32), torch.arange(8) % 10
    watch = isiwatch.Watch(model, x, y, every_n_steps=1, strict=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        watch.sample(1)
    watch.close(final_sample=False)
    names = {event.key for event in prof.key_averages()}
    assert {"isiwatch.sample", "isiwatch.forward", "isiwatch.metrics", "isiwatch.probes", "isiwatch.host"} <= names


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_probe_dtype_runs_the_forward_in_that_dtype_and_keeps_the_statistics_in_float32(dtype):
    """Under ``probe_dtype`` the model's linear layers compute in that dtype (CPU autocast), the statistics stay
    float32 and every metric is within 0.02 of the float32 pass; the training loop's own autocast state is kept."""
    model = vit_tiny()
    x, y = torch.randn(16, 3, 32, 32), torch.arange(16) % 10
    seen = []
    handle = model.blocks[0].mlp.fc1.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    plain = isiwatch.Watch(model, x, y, every_n_steps=1, strict=True)
    cheap = isiwatch.Watch(model, x, y, every_n_steps=1, strict=True, probe_dtype=dtype)
    plain.sample(1)
    cheap.sample(1)
    handle.remove()
    assert seen == [torch.float32, getattr(torch, dtype)]
    assert not torch.is_autocast_enabled("cpu")
    for metric, values in plain.history[-1].layers.items():
        other = cheap.history[-1].layers[metric]
        assert max(abs(a - b) for a, b in zip(values, other)) < 0.02, metric


def test_docs_show_the_committed_sample_cost_figures():
    """docs/monitor.md's "What a sample costs" carries the figures of the committed benchmark JSON, nothing else."""
    import json

    root = Path(__file__).parent.parent
    data = json.loads((root / "benchmarks" / "results" / "sample_cost" / "sample_cost.json").read_text())
    page = (root / "docs" / "monitor.md").read_text(encoding="utf-8")
    section = page[page.index("### What a sample costs"):page.index("What the Watch costs on the demo model")]
    small, base = data["timed"]["vit_small"], data["timed"]["vit_base"]
    rows = [f"| one sample | {small['sample_s']:.2f} s ({small['sample_over_forward']:.2f}×) | "
            f"{base['sample_s']:.2f} s ({base['sample_over_forward']:.2f}×) |",
            f"| plain no-grad forward of {small['probe_images']} probe images | {small['forward_s']:.2f} s | "
            f"{base['forward_s']:.2f} s |",
            f"{data['ops'][0]['ops_ratio']:.1f}× the aten ops",
            f"reads the host {data['ops'][0]['scalar_reads']} times",
            f"a sample took {data['precision']['sample_s']['bfloat16']:.2f} s instead of "
            f"{data['precision']['sample_s']['float32']:.2f} s",
            f"more than\n{max(data['precision']['max_abs_difference'].values()):.1e}"]
    missing = [row for row in rows if row not in section]
    assert not missing, f"docs/monitor.md differs from benchmarks/results/sample_cost/sample_cost.json: {missing}"
