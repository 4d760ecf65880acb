"""A harness nobody here wrote would look like this: BugFix episodes through the openai SDK and ``agentrl serve``.

The script knows nothing of tokens: it opens a session, hands the session's base URL to the
``openai`` client, calls the gym's tools (``agentrl.gym.TOOL_SCHEMAS``) as OpenAI function calls,
sends each tool result back as a ``tool`` message, and finishes the session with the episode's
reward. The gateway records every call token-exactly; at the end the script runs ``agentrl check
RUN --model DIR`` on the records.

Run it against a gateway you started::

    agentrl make-test-model /tmp/m
    agentrl serve --out /tmp/run --model /tmp/m &        # prints: serving on http://127.0.0.1:PORT ...
    python examples/gateway_bugfix.py --url http://127.0.0.1:PORT --run /tmp/run --model /tmp/m --tasks 3

With a random test model almost every call is malformed (the gym answers ``error : malformed
call``); the records are still exact, which is what the check verifies.
"""
from __future__ import annotations

import argparse
import json
import sys


def gym_text(message) -> str:
    """The gym's call text for an assistant message with tool calls ('' when it is not one valid call)."""
    calls = message.tool_calls or []
    if len(calls) != 1:
        return ''
    name = calls[0].function.name
    try:
        args = json.loads(calls[0].function.arguments or '{}')
    except ValueError:
        return ''
    if name in ('read', 'test', 'submit') and not args:
        return f'<call> {name} </call>'
    if name == 'edit' and set(args) == {'op'} and isinstance(args['op'], str) and args['op'].strip():
        return f'<call> edit {args["op"].strip()} </call>'
    return ''


def episode(url: str, task, *, seed: int, max_turns: int, max_tokens: int) -> float:
    """One BugFix episode through the gateway; returns its reward."""
    try:                                  # openai >= 3 ships httpx2, older versions httpx
        import httpx2 as httpx
    except ImportError:
        import httpx
    from openai import OpenAI

    from agentrl.gym import TOOL_SCHEMAS, BugFixEnv
    from agentrl.templates.chat import function_tools
    sess = httpx.post(f'{url}/sessions', json={'group_id': task.name, 'rollout_id': f'{task.name}/{seed}',
                                               'task': task.name}, timeout=60).json()
    client = OpenAI(api_key='unused', base_url=sess['base_url'])
    env = BugFixEnv(max_turns=max_turns)
    messages = [{'role': 'user', 'content': env.reset(task)}]
    reward, done, info = 0.0, False, {}
    for turn in range(max_turns):
        r = client.chat.completions.create(model='policy', messages=messages, tools=function_tools(TOOL_SCHEMAS),
                                           seed=seed * 1000 + turn, max_tokens=max_tokens)
        msg = r.choices[0].message
        obs, reward, done, info = env.step(gym_text(msg) if r.choices[0].finish_reason != 'length' else '')
        messages.append(msg.model_dump(exclude_none=True))       # the harness echoes the reply back
        call_id = msg.tool_calls[0].id if msg.tool_calls else None
        messages.append({'role': 'tool', 'content': obs, **({'tool_call_id': call_id} if call_id else {})})
        if done:
            break
    httpx.post(f'{url}/sessions/{sess["token"]}/finish', json={'reward': reward, 'info': {'done': done}}, timeout=60)
    return reward


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--url', required=True, help='the gateway, http://127.0.0.1:PORT')
    p.add_argument('--run', help='the gateway\'s --out folder (to check the records)')
    p.add_argument('--model', help='the gateway\'s --model folder (to replay the records)')
    p.add_argument('--tasks', type=int, default=3)
    p.add_argument('--max-turns', type=int, default=4)
    p.add_argument('--max-tokens', type=int, default=48)
    args = p.parse_args(argv)
    from agentrl.gym import make_tasks
    rewards = [episode(args.url, t, seed=k, max_turns=args.max_turns, max_tokens=args.max_tokens)
               for k, t in enumerate(make_tasks('all')[:args.tasks])]
    print(f'{len(rewards)} episodes, mean reward {sum(rewards) / len(rewards):.3f}')
    if args.run:
        from agentrl.cli.main import main as agentrl
        return agentrl(['check', args.run] + (['--model', args.model] if args.model else []))
    return 0


if __name__ == '__main__':
    sys.exit(main())
