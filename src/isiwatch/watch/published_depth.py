"""The depth recommendation the Watch publishes with each sample (``recommended_depth``): the rule's depth
([`recommend_depth`][isiwatch.recommend_depth]), changed only when the change is beyond the probes' own noise.

A depth of d blocks is judged by the probe at its last kept block, d − 1 (the [CLS] probe when the model has one,
else the mean-patch probe; the probe `Sample.last_layer_accuracy` reports). When the rule proposes a depth other
than the published one, the probes at the two depths' last blocks are compared on the same held-out images with
the exact paired test and its hysteresis (`isiwatch.watch.probe_evidence`), the state being "the deeper depth is
better":

- a deeper depth is published only when its probe is more accurate at ``probe_confidence``: blocks are added only
  for accuracy the probes can tell from noise;
- a shallower depth is published once the deeper (published) depth's probe is no longer observed more accurate at
  all (as many held-out images right only at the shallower block as only at the deeper one, or more): blocks are
  removed only when no accuracy is seen to go with them.

So a depth that the rule proposes on noise (2, 1, 3, 2 blocks from one sample to the next with the probes at those
blocks alike) does not move the published one back and forth. The first sample publishes the rule's depth; a
sample without held-out predictions (``probe_every``) keeps the published depth; a Watch without probe labels has
no evidence to weigh and publishes the rule's depth as it is. Each sample whose proposal differed from the
published depth carries the test in ``Sample.depth_evidence`` (``metrics.jsonl``'s ``depth_evidence``).
"""

from __future__ import annotations

from ..measure.depth import DepthRecommendation
from .probe_evidence import PairedProbes, holds
from .sample import Sample


class PublishedDepth:
    """The published depth recommendation (`current`), updated sample by sample at ``confidence``; ``labelled``:
    the Watch has probe labels (without them every proposal is published as it is)."""

    def __init__(self, confidence: float, labelled: bool):
        self.confidence, self.labelled = confidence, labelled
        self.current: DepthRecommendation | None = None

    def publish(self, sample: Sample) -> Sample:
        """``sample`` with its rule's recommendation replaced by the published one and the evidence that decided it
        in ``depth_evidence`` (None when the proposal was the published depth or nothing could be weighed)."""
        proposed, current = sample.recommendation, self.current
        if proposed is None or current is None or proposed.depth == current.depth or not self.labelled:
            self.current = proposed or current
            sample.recommendation, sample.depth_evidence = self.current, None
            return sample
        probe = "probe_cls" if "probe_cls" in sample.held_out else "probe_patch_mean"
        shallow, deep = sorted((proposed, current), key=lambda r: r.depth)
        rows = sample.held_out.get(probe) or []
        shallow_right = rows[shallow.depth - 1] if rows else None
        deep_right = rows[deep.depth - 1] if rows else None
        evidence: dict[str, object] = {"proposed": proposed.depth, "previous": current.depth, "probe": probe}
        chosen = current  # kept without held-out predictions at this sample
        if shallow_right is not None and deep_right is not None:
            pair = PairedProbes.of(shallow_right, deep_right)
            chosen = deep if holds(current is deep, pair, self.confidence) else shallow
            evidence.update(pair.to_dict("shallow", "deep", self.confidence))
        self.current = sample.recommendation = chosen
        sample.depth_evidence = {**evidence, "published": chosen.depth}
        return sample
