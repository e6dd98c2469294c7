"""What the Watch costs the training: nothing between samples but a counter check, and heat-map renders that run
at the lowest priority off the training thread and are charged to the overhead series."""

import gc
import math
import os
import sys
import threading
import time

import pytest
import timm
import torch
from prometheus_client import CollectorRegistry
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from isiwatch import Watch
from isiwatch.watch.exporters import TensorBoardExporter, tensorboard
from isiwatch.watch.sample import Sample


def tiny_vit():
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                             num_classes=10, embed_dim=16, depth=2, num_heads=2)


@pytest.fixture(scope="module")
def probe():
    from isiwatch.io.data import embedded_digits

    x, y = embedded_digits()
    return x[:16], y[:16]


def test_a_step_between_samples_runs_no_python_code_but_step_itself(probe, tmp_path):
    """Every call a non-sampling ``step()`` makes, counted with ``sys.setprofile``: none beyond ``step`` (no exporter,
    no hook, no property)."""
    watch = Watch(tiny_vit(), *probe, every_n_steps=100, log_dir=tmp_path, run_folder=".", registry=CollectorRegistry())
    watch.step(100, 1.0)  # a sample: everything below is between samples
    calls = []
    loss = torch.tensor(1.0)

    def profile(frame, event, arg):
        if event in ("call", "c_call"):
            calls.append(frame.f_code.co_name if event == "call" else arg.__name__)

    sys.setprofile(profile)
    try:
        for step in range(101, 200):
            watch.step(step, loss)
    finally:
        sys.setprofile(None)
    calls.remove("setprofile")
    watch.close(final_sample=False)
    assert set(calls) <= {"step"}, sorted(set(calls))
    assert len(watch.history) == 1


def test_heatmap_renders_leave_no_reference_cycles_for_the_garbage_collector(tmp_path):
    """A render built a new figure whose ~5,000 objects (its Agg pixel buffer among them) sat in reference cycles
    until Python's full collection, so a run with a log_dir grew by megabytes per hundred samples: every render
    after the first now redraws the exporter's one figure and leaves nothing for the collector."""
    board = TensorBoardExporter(tmp_path, heatmap_every=1)
    metrics = ("isi", "probe_cls", "cka")

    def history(samples):
        return [Sample(10 * s, 0.0, {m: [0.1 * s * b for b in range(6)] for m in metrics}, None, 0.0)
                for s in range(samples)]

    board.write_heatmaps(history(5))  # the first render builds the figure
    gc.collect()
    gc.disable()
    try:
        board.write_heatmaps(history(40))
        left = gc.collect()
    finally:
        gc.enable()
        board._drop_writer()
    assert left < 100, left
    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    events.Reload()
    assert [e.step for e in events.Images("isiwatch/heatmap/cka")] == [40, 390]


def test_heatmaps_render_at_the_lowest_priority_and_their_cpu_time_is_charged(probe, tmp_path, monkeypatch):
    renders = []
    real = tensorboard.heatmap_images

    def spy(history, panel, pause=0.0, hurry=None):
        cpu = time.thread_time()
        seen = {"nice": os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), "pause": pause,
                "thread": threading.current_thread() is not threading.main_thread()}
        images = real(history, panel, pause, hurry)
        renders.append({**seen, "cpu_s": time.thread_time() - cpu})
        return images

    monkeypatch.setattr(tensorboard, "heatmap_images", spy)
    watch = Watch(tiny_vit(), *probe, every_n_steps=1, log_dir=tmp_path, run_folder=".", registry=CollectorRegistry(),
                  heatmap_every=1)
    (board,) = [e for e in watch.exporters if isinstance(e, TensorBoardExporter)]
    watch.step(1)  # starts a render of step 1's history on the render thread
    board._render.join()
    watch.step(2)  # charged with that render's CPU time
    second = watch.history[-1]
    board.wait_for_heatmaps()
    watch.close(final_sample=False)
    background = renders[0]
    assert background["thread"] and background["pause"] == tensorboard.RENDER_PAUSE > 0
    if sys.platform == "linux":
        assert background["nice"] == tensorboard.RENDER_NICE == 19
    assert os.getpriority(os.PRIO_PROCESS, 0) < 19  # the training thread keeps its priority
    assert second.overhead_s - second.duration_s >= background["cpu_s"] > 0


def test_a_render_still_running_is_not_doubled(probe, tmp_path):
    """At most one render at a time: a sample due for heat-maps while one runs starts none."""
    watch = Watch(tiny_vit(), *probe, every_n_steps=1, log_dir=tmp_path, run_folder=".", registry=CollectorRegistry(),
                  heatmap_every=1)
    renders = []
    for step in range(1, 6):
        watch.step(step)
        renders.append(sum(t.name == "isiwatch-heatmaps" for t in threading.enumerate()))
    watch.close(final_sample=False)
    assert max(renders) == 1


@pytest.mark.parametrize("form", ["q_k", "q_k_masked", "logits"])
def test_attention_rows_rebuilt_path_match_the_softmax_reference(form, monkeypatch):
    """The entropy and [CLS] share rebuilt from q/k or the model's logits, in several passes (a memory bound
    smaller than the scores, a −inf mask), equal the plain softmax computation, and the model's own logits are left
    as they were."""
    from isiwatch.measure.metrics import attention_curves, attention_rows
    from isiwatch.taps import AttentionScores, attention

    gen = torch.Generator().manual_seed(0)
    b, h, t, hd, p = 10, 2, 256, 16, 1
    monkeypatch.setattr(attention, "SCORE_BYTES", 3 * 4 * h * t * t)  # three images per pass: four passes
    q, k = torch.randn(b, h, t, hd, generator=gen), 3 * torch.randn(b, h, t, hd, generator=gen)
    scale = hd ** -0.5
    bias = None
    if form == "q_k_masked":
        bias = torch.zeros(t, t).masked_fill_(torch.rand(t, t, generator=gen) < 0.3, -math.inf)
        bias[:, 0] = 0.0  # every query sees [CLS]
    logits = q @ k.transpose(-2, -1) * scale + (0 if bias is None else bias)
    scores = AttentionScores(logits=logits.clone()) if form == "logits" else AttentionScores(q, k, scale, bias)
    entropy, share = attention_curves(*attention_rows(scores), t, p, has_cls=True)

    probs = logits.softmax(-1)
    expected_entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1).mean((1, 2)) / math.log(t)
    expected_share = t * probs[:, :, p:, 0].mean((1, 2))
    assert torch.allclose(entropy, expected_entropy, rtol=1e-5, atol=1e-6)
    assert torch.allclose(share, expected_share, rtol=1e-5, atol=1e-6)
    if form == "logits":
        assert torch.equal(scores.logits, logits)


class _CountAttention(torch.overrides.TorchFunctionMode):
    """Counts the ``scaled_dot_product_attention`` calls that reach the kernel (below the tap's recorder)."""

    def __init__(self):
        super().__init__()
        self.kernel_calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.kernel_calls += 1
        return func(*args, **(kwargs or {}))


def test_the_probe_pass_runs_the_models_own_attention_and_forms_no_score_matrix(probe):
    """The model's attention call runs as it would without the Watch (its output is bit-identical), once per block,
    and the statistics come from fused rows: no (B,H,T,T) tensor is allocated in the whole pass."""
    from torch.profiler import ProfilerActivity, profile

    from isiwatch.taps import Tap
    from isiwatch.taps.registry import vit_parts

    model = tiny_vit().eval()
    images = probe[0]
    with torch.no_grad():
        expected = model(images)
    blocks = []
    with _CountAttention() as counter, profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        output = Tap(vit_parts(model)).capture(model, images, lambda e, x: None, blocks.append)
    assert counter.kernel_calls == 2
    assert len(blocks) == 2 and all(b.attention.rows is not None for b in blocks)
    assert torch.equal(output, expected)
    heads, tokens = model.blocks[0].attn.num_heads, blocks[0].x.shape[1]
    per_image = 4 * heads * tokens * tokens  # one image's (H,T,T) fp32 scores
    allocated = {event.cpu_memory_usage for event in prof.events() if event.cpu_memory_usage > 0}
    assert not allocated & {per_image * n for n in range(1, len(images) + 1)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rows_match_the_softmax(dtype):
    """Entropy from the log-sum-exp and the keys' softmax mean, and the weight on key 0, equal the softmax's (the
    statistics are computed in fp32 from q and k in the model's dtype), for sharp and flat attention."""
    from isiwatch.taps.attention import fused_rows

    gen = torch.Generator().manual_seed(0)
    b, h, t, hd = 4, 2, 197, 16
    for sharpness in (0.3, 3.0):
        q = (sharpness * torch.randn(b, h, t, hd, generator=gen)).to(dtype)
        k = torch.randn(b, h, t, hd, generator=gen).to(dtype)
        rows = fused_rows(q.transpose(1, 2).contiguous().transpose(1, 2), k, hd ** -0.5)  # a strided q, as timm's
        probs = (q.double() @ k.double().transpose(-2, -1) * hd ** -0.5).softmax(-1)
        entropy = -(probs * probs.clamp_min(1e-300).log()).sum(-1)
        assert torch.allclose(rows.entropy.double(), entropy, rtol=1e-4, atol=2e-5)
        assert torch.allclose(rows.first.double(), probs[..., 0], rtol=1e-4, atol=1e-6)


def test_a_masked_attention_still_runs_the_models_kernel():
    """A call with a mask goes to the kernel, and its scores are rebuilt from q and k."""
    from isiwatch.taps.attention import AttentionRecorder

    q = k = v = torch.randn(2, 2, 5, 4)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    recorder = AttentionRecorder()
    with _CountAttention() as counter, recorder:
        recorder.active = True
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert counter.kernel_calls == 1
    assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert recorder.records[0].q is not None and recorder.records[0].rows is None


def test_block_metrics_add_one_token_tensor_and_equal_the_per_metric_formulas():
    """A block is reduced with no allocation above one (B,T,D) tensor, the centred tokens (a stacked copy of five
    token tensors was its peak before), and the curves equal the metrics written one by one."""
    from torch.profiler import ProfilerActivity, profile

    from isiwatch.measure.metrics import block_curves, cls_patch_cos, reduce_block, token_similarity
    from isiwatch.taps import AttentionScores, BlockTensors
    from isiwatch.taps.attention import AttentionRows

    gen = torch.Generator().manual_seed(0)
    b, t, d, h = 32, 197, 384, 2
    token_tensor = 4 * b * t * d
    x, x_normed, branch, z = (torch.randn(b, t, d, generator=gen) for _ in range(4))
    rows = AttentionRows(torch.rand(b, h, t, generator=gen), torch.rand(b, h, t, generator=gen), t)
    bt = BlockTensors(0, x, x_normed, branch, z, AttentionScores(rows=rows), 1, True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        sums, patch_mean = reduce_block(bt)
    assert max(event.cpu_memory_usage for event in prof.events()) <= token_tensor
    curves = block_curves([sums])
    cos = torch.nn.functional.cosine_similarity
    y = x + branch
    assert torch.allclose(patch_mean, z[:, 1:].mean(1), atol=1e-6)
    assert torch.allclose(curves["token_similarity"], token_similarity(z, 1).mean(), atol=1e-6)
    assert torch.allclose(curves["norm_friction"], (cls_patch_cos(x, 1) - cls_patch_cos(x_normed, 1)).mean(),
                          atol=1e-6)
    assert torch.allclose(curves["cls_patch_cos"], cls_patch_cos(z, 1).mean(), atol=1e-6)
    assert torch.allclose(curves["attn_token_change"], 1 - cos(x, y, dim=-1).mean(), atol=1e-5)
    assert torch.allclose(curves["block_influence"], 1 - cos(x, z, dim=-1).mean(), atol=1e-5)
