"""L5: per-session limits of the gateway; each refusal is an OpenAI-style error (429 or 400).

Source: docs/gateway.md#limits (turns, prompt and output tokens, body bytes, concurrent requests,
wall time, images).
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
        max_image_bytes: bytes of one image (decoded, as received).
        max_images_per_request: image parts in one request (its whole history counts).
        max_images_per_session: distinct images (by digest) a session's calls bring, all together.
    """
    max_turns: int = 256
    max_prompt_tokens: int = 0
    max_output_tokens: int = 0
    max_body_bytes: int = 8 << 20
    max_concurrent: int = 4
    max_wall_s: float = 0.0
    max_image_bytes: int = 20 << 20
    max_images_per_request: int = 16
    max_images_per_session: int = 256

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

    def check_images(self, sizes: list, new_in_session: int, held: int) -> None:
        """Refuse a request's images over the image limits (docs/gateway.md#images).

        Args:
            sizes: ``[(where, bytes)]`` of each image part of the request (where: its field,
                ``messages[i].content[j]``).
            new_in_session: distinct images of the request the session does not hold yet. held: those it holds.

        Raises:
            GatewayError: 413 ``max_image_bytes`` naming the part; 400 ``max_images_per_request`` or
                ``max_images_per_session`` naming the counts.
        """
        for where, n in sizes:
            if self.max_image_bytes and n > self.max_image_bytes:
                raise GatewayError(413, f'{where} is an image of {n} bytes, over the limit of {self.max_image_bytes} '
                                        '(max_image_bytes); send a smaller image', param=where, code='max_image_bytes')
        if self.max_images_per_request and len(sizes) > self.max_images_per_request:
            raise GatewayError(400, f'the request holds {len(sizes)} images, over the limit of '
                                    f'{self.max_images_per_request} (max_images_per_request); send fewer images',
                               param='messages', code='max_images_per_request')
        if self.max_images_per_session and held + new_in_session > self.max_images_per_session:
            raise GatewayError(400, f'the session would hold {held + new_in_session} images, over the limit of '
                                    f'{self.max_images_per_session} (max_images_per_session); finish it and open a '
                                    'new one', param='messages', code='max_images_per_session')

    def output_budget(self, out_tokens: int) -> int | None:
        """Tokens the session may still sample (None: no cap)."""
        return self.max_output_tokens - out_tokens if self.max_output_tokens else None


def _limit(message: str, code: str) -> GatewayError:
    return GatewayError(429, message, type='rate_limit_error', code=code)
