"""L3: the image gate: a record's ``info['images']`` against its ids, owners, mask and its run's stored images.

:func:`image_problems` lists the refusals of one record: a malformed entry, a run whose length is not its
grid's ``t*h*w // merge_size**2``, a run over ids that are not the placeholder id, a placeholder id outside
every run, overlapping runs, placeholder ids owned by anyone but whoever supplied the image, placeholder
ids in the loss (policy-owned or ``action_mask`` 1), and an image missing from ``RUN/images`` or whose bytes
do not hash to its digest. Each names the image (its index and digest) and the numbers. A record without
``'images'`` in its info gets no finding and costs one dict lookup. ``agentrl check`` runs it on every row.

Source: docs/design.md#images.
"""
from __future__ import annotations

import os

import numpy as np

from ..images import ImageEntryError, image_token_id, parse_images, verify_image
from ..record import OWNER, OWNER_NAMES
from .errors import ImageInLossError, ImageRunError, MissingImageError

__all__ = ['image_problems']

_POLICY = OWNER['policy']


def _short(digest: str) -> str:
    return digest[:19]       # 'sha256:' + 12 hex digits: enough to tell images apart in a message


def _array(t) -> np.ndarray:
    return np.asarray(t.detach().cpu() if hasattr(t, 'detach') else t).reshape(-1)


def _runs_problems(refs, ids: np.ndarray, token_ids: list) -> list:
    """Refusals of the placeholder runs against the grids and the ids (lengths, ids in runs, overlaps, strays)."""
    out = []
    T = len(ids)
    for i, ref in enumerate(refs):
        t, h, w = ref.grid
        m = ref.merge_size
        tag = f'image {i} ({_short(ref.digest)})'
        if (t * h * w) % (m * m):
            out.append(ImageRunError(
                f'of {tag} is {list(ref.grid)}: {t}*{h}*{w} = {t * h * w} patches is not a multiple of merge_size**2 '
                f'= {m * m}', field=f'info.images[{i}].grid', fix='record the grid the processor returned'))
        elif ref.length != ref.expected_length:
            out.append(ImageRunError(
                f'of {tag} is {ref.length} but its grid {list(ref.grid)} with merge_size {m} needs {t}*{h}*{w} // '
                f'{m}**2 = {ref.expected_length} placeholder ids', field=f'info.images[{i}].length',
                fix='render one placeholder id per merged patch (t*h*w // merge_size**2)'))
        end = ref.start + ref.length
        if end > T:
            out.append(ImageRunError(
                f'of {tag} runs over ids[{ref.start}:{end}] but the record has {T} ids',
                field=f'info.images[{i}].start', fix='record where the image\'s placeholder ids sit in ids'))
            continue
        run = ids[ref.start:end]
        bad = np.flatnonzero(run != token_ids[i])
        if bad.size:
            p = ref.start + int(bad[0])
            out.append(ImageRunError(
                f'is {int(ids[p])}, not the image placeholder {token_ids[i]}, inside the run of {tag} '
                f'(ids[{ref.start}:{end}], {ref.length} ids)', field='ids', position=p, count=int(bad.size),
                fix='the run must hold exactly the placeholder ids the template rendered for the image'))
    order = sorted(range(len(refs)), key=lambda k: (refs[k].start, k))
    for a, b in zip(order, order[1:]):
        ra, rb = refs[a], refs[b]
        if rb.start < ra.start + ra.length:
            out.append(ImageRunError(
                f'of image {b} ({_short(rb.digest)}) runs over ids[{rb.start}:{rb.start + rb.length}], overlapping '
                f'image {a} ({_short(ra.digest)}) at ids[{ra.start}:{ra.start + ra.length}]',
                field=f'info.images[{b}].start', fix='each image has its own run of placeholder ids'))
    covered = np.zeros(T, dtype=bool)
    for ref in refs:
        covered[ref.start:min(T, ref.start + ref.length)] = True
    stray = np.flatnonzero(np.isin(ids, np.asarray(sorted(set(token_ids)), dtype=ids.dtype)) & ~covered)
    if stray.size:
        p = int(stray[0])
        runs = ', '.join(f'[{r.start}:{r.start + r.length}]' for r in refs)
        out.append(ImageRunError(
            f'is the image placeholder {int(ids[p])} but lies in no image\'s run (runs {runs})', field='ids',
            position=p, count=int(stray.size),
            fix='list every image in info.images with the start and length of its placeholder run'))
    return out


def _owner_problems(refs, ids: np.ndarray, token_ids: list, owner: np.ndarray | None, mask: np.ndarray | None) -> list:
    """Refusals of placeholder ids (the ids of each run that are the placeholder) in the loss or owned by someone
    other than whoever supplied the image."""
    out = []
    T = len(ids)
    for i, ref in enumerate(refs):
        s, e = ref.start, min(T, ref.start + ref.length)
        pos = s + np.flatnonzero(ids[s:e] == token_ids[i]) if e > s else np.zeros(0, dtype=np.int64)
        tag = f'image {i} ({_short(ref.digest)}, owner {ref.owner!r})'
        if owner is not None and pos.size:
            own = owner[pos]
            pol = pos[own == _POLICY]
            if pol.size:
                out.append(ImageInLossError(
                    f'is policy on a placeholder id of {tag}: the policy never samples an image',
                    field='owner', position=int(pol[0]), count=int(pol.size),
                    fix=f'record the placeholder ids with owner {ref.owner!r}, outside the action mask'))
            other = pos[(own != OWNER[ref.owner]) & (own != _POLICY)]
            if other.size:
                p = int(other[0])
                name = OWNER_NAMES[int(owner[p])] if 0 <= int(owner[p]) < len(OWNER_NAMES) else str(int(owner[p]))
                out.append(ImageRunError(
                    f'is {name!r} on a placeholder id of {tag}; placeholder ids belong to whoever supplied the image',
                    field='owner', position=p, count=int(other.size),
                    fix=f'record the placeholder ids with owner {ref.owner!r} (vision delimiters stay template)'))
        if mask is not None:
            rows = pos[pos >= 1] - 1                        # action_mask[j] is about ids[j + 1]
            on = rows[mask[rows] != 0]
            if on.size:
                out.append(ImageInLossError(
                    f'is {mask[on[0]]:g} on ids[{int(on[0]) + 1}], a placeholder id of {tag}: image tokens are '
                    'never trained', field='action_mask', position=int(on[0]), count=int(on.size),
                    fix='derive the mask from the owners (Trajectory.from_tokens): placeholder ids are not policy'))
    return out


def image_problems(record, run: str | os.PathLike | None, token_id: int | None = None,
                   verified: dict | None = None) -> list:
    """The refusals of one record's images (empty for a record without ``info['images']``).

    Args:
        record: a :class:`~agentrl.record.Trajectory` (``ids [T]``, ``owner [T]`` or None, ``action_mask [T-1]``).
        run: its run folder (:func:`agentrl.images.run_folder` of the file it was read from), or None to skip
            the stored-bytes checks.
        token_id: the image placeholder id; None: each image's processor class's
            (:data:`agentrl.images.IMAGE_TOKEN_IDS`).
        verified: a cache ``(run, digest) -> finding or None`` shared across records, so each stored image is
            hashed once per check (its file is read in 1 MiB blocks, never held).

    Returns:
        list of :class:`~agentrl.checks.errors.ImageRunError`, :class:`~agentrl.checks.errors.MissingImageError`
        and :class:`~agentrl.checks.errors.ImageInLossError`: the runs' faults first, then owners and mask,
        then the stored bytes.

    Raises nothing for a bad record (every fault is a returned refusal).
    """
    info = record.info or {}
    if 'images' not in info:
        return []
    try:
        refs = parse_images(info['images'])
    except ImageEntryError as e:
        field = 'info.images' + ('' if e.index is None else f'[{e.index}]') + (f'.{e.key}' if e.key else '')
        return [ImageRunError(e.what, field=field, fix='write each image entry as {digest, start, length, grid, '
                              'owner, processor} (agentrl.images.ImageRef.to_dict)')]
    out = []
    token_ids = []
    for i, ref in enumerate(refs):
        try:
            token_ids.append(image_token_id(ref, token_id))
        except ValueError as e:
            return [ImageRunError(str(e).split(' ', 1)[1], field=f'info.images[{i}].processor.class',
                                  fix='pass the model\'s image placeholder id: agentrl check --image-token-id ID')]
    ids = _array(record.ids)
    owner = None if record.owner is None else _array(record.owner)
    mask = None if record.action_mask is None else _array(record.action_mask)
    out += _runs_problems(refs, ids, token_ids)
    out += _owner_problems(refs, ids, token_ids, owner, mask)
    if run is not None:
        cache = {} if verified is None else verified
        for i, ref in enumerate(refs):
            key = (str(run), ref.digest)
            if key not in cache:
                cache[key] = verify_image(run, ref.digest)
            if cache[key] is not None:
                out.append(MissingImageError(f'{ref.digest} of image {i} {cache[key]}',
                                             field=f'info.images[{i}].digest',
                                             fix='store the image with its records (ShardWriter.write(records, '
                                                 'images={digest: bytes})) or restore RUN/images from the run'))
    return out
