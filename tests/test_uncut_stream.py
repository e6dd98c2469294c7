"""The uncut stream kept between cuts (`isiwatch.truncation.uncut_stream`): a cut run from it computes what the cut
computes from the images, in every family the project covers, while its skipped blocks cost nothing; so a search
bridges and judges each further cut for a few blocks, not for passes through both models."""

import copy

import torch
from test_bridge import output
from test_families import HF, TIMM, make_hf, make_timm

from isiwatch.measure.flops import count_flops
from isiwatch.taps import vit_parts
from isiwatch.truncation.bridge import resume_position
from isiwatch.truncation.classifier_layout import block_list
from isiwatch.truncation.confidence import AcceptanceRule
from isiwatch.truncation.healing import make_digits_vit, predict
from isiwatch.truncation.surgery import CutRepair, cut_vit
from isiwatch.truncation.uncut_stream import BATCH, UncutStream, capture, resumed


def test_resume_position_is_the_kept_block_before_the_first_dropped_one():
    assert resume_position([0, 1, 2, 5]) == 2
    assert resume_position([0, 3]) == 0
    assert resume_position([1, 2]) == 0  # block 0 dropped: the cut runs from its own start
    assert resume_position([0, 1, 2]) == 2  # a tail: from its last block


def test_a_cut_run_from_the_stream_outputs_what_it_outputs_from_the_images_in_every_family():
    images = torch.randn(BATCH + 6, 1, 28, 28)  # two slices
    for family in [*TIMM, *HF]:
        uncut = (make_timm(family) if family in TIMM else make_hf(family)).eval()
        block_list(uncut).append(copy.deepcopy(block_list(uncut)[2]))  # depth 4
        kept = [0, 1, 2] if vit_parts(uncut).fixed_block_positions else [0, 1, 3]  # those cut only at the tail
        cut = cut_vit(uncut, kept).eval()
        stream = UncutStream(uncut, images)
        position = resume_position(kept)
        calls: list[int] = []
        skipped = block_list(cut)[0]
        for part in skipped.modules():
            if part is not skipped:
                part.register_forward_pre_hook(lambda *_, calls=calls: calls.append(0))
        with torch.no_grad():
            want = output(cut, images[BATCH:])
            calls.clear()
            with resumed(cut, position, stream.entering(position)[1], stream):
                got = output(cut, images[BATCH:])
        assert not calls, family  # nothing inside the skipped block ran
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max())), family


def test_the_stream_entering_each_block_is_what_the_uncut_model_feeds_it_within_its_memory():
    uncut = make_timm("deit_distilled").eval()
    images = torch.randn(BATCH + 6, 1, 28, 28)
    seen: list[list[torch.Tensor]] = [[] for _ in range(4)]
    hooks = [block.register_forward_pre_hook(lambda _m, args, i=i: seen[i].append(args[0].clone()))
             for i, block in enumerate(uncut.blocks)]
    with torch.no_grad(), capture(uncut.blocks[2], seen[3]):
        for start in (0, BATCH):
            uncut(images[start:start + BATCH])
    for hook in hooks:
        hook.remove()
    slice_bytes = sum(t.numel() * t.element_size() for t in seen[0])  # one block's stream, both slices
    stream = UncutStream(uncut, images, store_bytes=2 * slice_bytes)
    for index in (3, 1, 0, 2):  # 3: leaving the last block
        assert all(torch.equal(a, b) for a, b in zip(stream.entering(index), seen[index], strict=True)), index
        assert len(stream._stored) <= 2  # the least recently used ones went
    assert list(stream._stored) == [0, 2]


def test_after_the_first_cut_a_search_fits_and_judges_a_bridge_for_less_than_one_uncut_forward_pass():
    """Before the uncut stream was kept, each cut cost a pass of the uncut model to its last dropped block, one of
    the cut to the bridged block and two of the cut (bridged and not) to judge: over 2.5 forward passes for a
    12-block model cut to 6. Now the second cut costs its last block and head, three times."""
    uncut, _ = make_digits_vit(0, depth=12)
    images = torch.randn(256, 1, 28, 28)
    forward = count_flops(lambda: predict(uncut, images))
    repair = CutRepair(uncut.eval(), images, torch.randint(0, 10, (256,)), "lstsq")
    never = AcceptanceRule(0.0, 0.05)  # nothing qualifies at a max drop of 0: each cut is judged, fitted, judged
    count_flops(lambda: repair.choose(list(range(8)), never, 500))  # the first cut stores the stream
    second = count_flops(lambda: repair.choose(list(range(6)), never, 500))
    assert 0 < second < 0.5 * forward
    assert repair.models[tuple(range(6))]["bridged"][1] is not None  # it was bridged (fitted and judged)
    assert set(repair.calibration[tuple(range(6))]) == {"cut", "bridged"}


def test_a_heal_that_comes_no_closer_on_the_healing_images_is_not_tested():
    """A heal is kept only when the healed cut's bound on the calibration images (which it trained on) comes closer
    than the unhealed cut's; one that falls short even there is recorded as rejected (its steps), and the cut is
    tested as it is."""
    uncut, _ = make_digits_vit(0, depth=6)
    images = torch.randn(128, 1, 28, 28)
    labels = predict(uncut.eval(), images)  # the uncut model right on every image: a cut can only lose
    repair = CutRepair(uncut, images, labels, "none")
    never = AcceptanceRule(0.0, 0.05)

    def ruin(model):  # a "heal" that makes every prediction the same class
        with torch.no_grad():
            for p in model.head.parameters():
                p.zero_()
        return 7
    choice = repair.choose([0, 1, 2, 3], never, 500, ruin)
    assert choice.steps == 0 and choice.repair == "none" and choice.record["heal_rejected"] == 7
    bounds = choice.record["predicted_bound_points"]
    assert bounds["healed"] >= bounds["cut"] and not choice.record["heal"]
    assert choice.model is not repair.models[(0, 1, 2, 3)]["cut"][0]  # a fresh copy, never the stored cut
    assert torch.equal(predict(choice.model, images), predict(repair.models[(0, 1, 2, 3)]["cut"][0], images))
