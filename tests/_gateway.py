"""Shared by the gateway tests: an ``HFUpstream`` whose next turns can be forced (teacher-forced, real log-probs)."""
from agentrl.gateway import HFUpstream
from agentrl.gateway.engine import Sample


class ForcingHF(HFUpstream):
    """HFUpstream whose next turns can be forced: the given text's ids, scored by the real model.

    ``force`` is a list of texts; each ``sample`` call pops the first one (when the list is empty it
    samples as usual). The forced ids go through the same ``HFSampler`` (``teacher=``), so the turn's
    log-probs are the model's and the records replay with ratio 1.
    """

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.force = []

    def sample(self, prompt_ids, spec, max_new_tokens, seed, stop_ids, on_token=None):
        if not self.force:
            return super().sample(prompt_ids, spec, max_new_tokens, seed, stop_ids, on_token=on_token)
        import torch

        from agentrl.gateway.engine import _sampler_class
        ids = self.tokenizer(self.force.pop(0), add_special_tokens=False)['input_ids']
        s = _sampler_class()(self.model, stop_ids, spec, max_new_tokens=len(ids))
        s.on_token = on_token                     # streamed token by token, as a sampled turn is
        t = s.sample([list(prompt_ids)], [torch.Generator().manual_seed(seed)], teacher=[ids])[0]
        return Sample(ids=t.ids, logp=t.logp, truncated=t.truncated, seed=seed)
