"""Shared by the gateway tests: an ``HFEngine`` whose next turns can be forced (teacher-forced, real log-probs)."""
import dataclasses

from agentrl.engines.hf.engine import HFEngine


class ForcingHF(HFEngine):
    """HFEngine whose next turns can be forced: the given text's ids, scored by the real model.

    ``force`` is a list of texts; each ``sample`` call pops the first one (when the list is empty it
    samples as usual). The forced ids go through the same ``HFSampler`` (``teacher=``), so the turn's
    log-probs are the model's and the records replay with ratio 1; streamed token by token, as a
    sampled turn is.
    """

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.force = []

    def sample(self, request, teacher=None):
        if not self.force:
            return super().sample(request)
        ids = self.tokenizer(self.force.pop(0), add_special_tokens=False)['input_ids']
        return super().sample(dataclasses.replace(request, max_new_tokens=len(ids)), teacher=ids)
