"""L5: per-session limits of the gateway; each refusal is an OpenAI-style error (429 or 400).

Source: docs/gateway.md#limits (turns, prompt and output tokens, body bytes, concurrent requests,
wall time).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .protocol import GatewayError

__all__ = ['Limits']


@dataclass
class Limits:
    """Caps per session (0 or None: none for that field).

    Attributes:
        max_turns: sampled calls per session.
        max_prompt_tokens: prompt length of one call, in tokens.
        max_output_tokens: tokens sampled per session, all calls together.
        max_body_bytes: size of one request body.
        max_concurrent: requests of one session in flight at once.
        max_wall_s: seconds from the session's creation to its last call.
    """
    max_turns: int = 256
    max_prompt_tokens: int = 0
    max_output_tokens: int = 0
    max_body_bytes: int = 8 << 20
    max_concurrent: int = 4
    max_wall_s: float = 0.0

    def to_dict(self) -> dict:
        """Plain-dict form (serve.json)."""
        return asdict(self)

    def check_call(self, n_calls: int, out_tokens: int, age_s: float) -> None:
        """Refuse a new call of a session that has spent its turns, output tokens or wall time.

        Raises:
            GatewayError: 429 naming the limit.
        """
        if self.max_turns and n_calls >= self.max_turns:
            raise _limit(f'the session has used its {self.max_turns} turns (--max-turns); finish it', 'max_turns')
        if self.max_output_tokens and out_tokens >= self.max_output_tokens:
            raise _limit(f'the session has sampled {out_tokens} tokens, its limit is {self.max_output_tokens} '
                         '(--max-output-tokens); finish it', 'max_output_tokens')
        if self.max_wall_s and age_s > self.max_wall_s:
            raise _limit(f'the session is {age_s:.0f} s old, over its wall time of {self.max_wall_s:g} s '
                         '(--max-wall-s); finish it', 'max_wall_s')

    def check_prompt(self, n_prompt: int) -> None:
        """Refuse a prompt over ``max_prompt_tokens`` (429 naming the limit)."""
        if self.max_prompt_tokens and n_prompt > self.max_prompt_tokens:
            raise _limit(f'the prompt is {n_prompt} tokens, over the limit of {self.max_prompt_tokens} '
                         '(--max-prompt-tokens); shorten the history', 'max_prompt_tokens')

    def output_budget(self, out_tokens: int) -> int | None:
        """Tokens the session may still sample (None: no cap)."""
        return self.max_output_tokens - out_tokens if self.max_output_tokens else None


def _limit(message: str, code: str) -> GatewayError:
    return GatewayError(429, message, type='rate_limit_error', code=code)
