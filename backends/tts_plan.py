"""The TTS window plan: the vocoder windows a sentence's latent is cut into for first audio (windows()), which a
TTS runner declares (TTSRunner.plan_windows), the pipeline streams, and a runner that computes the flow in the
background follows with its pieces. Frame arithmetic only."""

from __future__ import annotations

# each TTS window is this many times the one before it (windows; TTSRunner.head_frames)
WINDOW_GROWTH = 3


def windows(
    frames: int, first: int, largest: int, parallel: int = 1, flow_cost: float = 0.0, context: int = 0
) -> list[tuple[int, int]]:
    """[start, end) frame windows covering `frames`: sizes first, WINDOW_GROWTH * first, ... up to `largest`
    (the first audio comes early, and each window has the time the ones before it play to get decoded).
    From the third window on, once the rest fits in `parallel` windows of at most `largest` frames — or a
    multiple of that — it is split evenly, so parallel workers finish together: few windows, since each
    border costs the generator 2 * context frames of extra work. A short tail (under `first` frames) joins
    the window before it, and the rest is split only into windows of at least 4 * first frames. (30 words
    on two one-thread workers, AMD EPYC: 16, 48, 363, 363 frames synthesize in 0.91x the time of doubling
    windows up to 256 frames, 16 ... 128, 4 x 138; 5 words, Zen 4: 16, 48, 69 in 0.94x the time of 16, 48,
    34, 35, 60 rounds in one process, the order reversed every round.)

    flow_cost > 0: the runner computes these windows' flow in the background, one piece per window in order
    (flow_pieces), at `flow_cost` times the generator's work per frame. Where the rest is one window per
    worker, window i then starts flow_cost x (the frames before it) later than the first, so the sizes
    fall by a factor (1 + flow_cost) each (none over `largest`) and the workers still finish together (30
    words: 400, 327 frames instead of 364, 363: the worker that computes the flow vocodes the smaller one).

    context > 0: the whole latent is ready (no background flow) and each window is vocoded with `context`
    frames on each side that is not the sentence's edge. The windows after the first are then sized so that
    the workers, taking them in order, end together (makespan()): the rest split one window per worker is
    sized by when each worker is free, or, if that ends sooner, the windows after the first are one per
    worker, those beside the first at most 4 * first frames (its audio is their deadline); no window under
    `first` frames, though the rest's may fall under 4 * first. 5 words (133 frames, 11 frames of context),
    two workers: 16, 64, 53 instead of 16, 48, 69; 200 frames: 16, 48, 84, 52 instead of 16, 48, 68, 68."""
    out, a, size = [], 0, first
    while a < frames:
        rest = frames - a
        if size >= largest or (len(out) >= 2 and rest <= parallel * largest):
            n = even_count(rest, largest, parallel, 4 * first)  # windows of at least 4*first frames (see above)
            share = [1.0] * n
            if flow_cost > 0 and n == parallel > 1:
                share = [(1 + flow_cost) ** -i for i in range(n)]
            sizes, left = [], rest
            for i in range(n):  # in proportion to the shares, none over `largest`
                sizes.append(min(largest, left * share[i] / sum(share[i:])))
                left -= sizes[-1]
            if sizes[-1] < 4 * first:
                sizes = [rest / n] * n
            if context and n == parallel > 1 and not flow_cost:
                sizes = _end_together(out, frames, rest, largest, parallel, context) or sizes
            bounds = [a + round(sum(sizes[:i])) for i in range(n + 1)]
            out += list(zip(bounds[:-1], bounds[1:]))
            break
        b = a + size
        if frames - b < first:
            b = frames
        out.append((a, b))
        a, size = b, min(size * WINDOW_GROWTH, largest)
    if context and parallel > 1 and not flow_cost and len(out) > 1:
        # the windows after the first, one per worker: those beside the first start with it
        rest = frames - out[0][1]
        beside = min((rest + out[0][1]) / parallel, 4 * first, largest)
        last = rest - (parallel - 1) * beside
        if first <= min(beside, last) and last <= largest:
            b = [out[0][1] + round(i * beside) for i in range(parallel)] + [frames]
            alt = [out[0]] + list(zip(b[:-1], b[1:]))
            if makespan(alt, frames, context, parallel) < makespan(out, frames, context, parallel):
                return alt
    return out


def even_count(frames: int, largest: int, parallel: int, least: int) -> int:
    """How many even windows `frames` are split into: one per worker, or a multiple of the workers so that none
    is over `largest` frames, but fewer where a window would be under `least` frames (at least one)."""
    n = max(parallel, -(-frames // largest))
    n = -(-n // parallel) * parallel if parallel > 1 else n
    return max(1, min(n, frames // max(1, least)))


def _worker_ends(wins: list[tuple[int, int]], frames: int, context: int, parallel: int) -> list[float]:
    """When each of `parallel` workers that take `wins` in order, each window the next free worker, is done, in
    frames of generator work: a window costs its frames plus `context` on each side not at the edge of the
    `frames` of its sentence."""
    free = [0.0] * parallel
    for a, b in wins:
        free[free.index(min(free))] += b - a + context * ((a > 0) + (b < frames))
    return free


def makespan(wins: list[tuple[int, int]], frames: int, context: int, parallel: int) -> float:
    """Frames of generator work until the workers have vocoded all of `wins` (_worker_ends)."""
    return max(_worker_ends(wins, frames, context, parallel))


def _end_together(head, frames, rest, largest, parallel, context):
    """Sizes of the `parallel` windows that cover the `rest` after windows `head` so that the workers end
    together (each taking the next window when free, as makespan() models), or None where one would be
    under `first` frames (the head's first window) or over `largest`."""
    free = sorted(_worker_ends(head, frames, context, parallel))  # the rest's windows go to them in this order
    cost = [2 * context] * (parallel - 1) + [context]  # the last window has no right context
    end = (rest + sum(free) + sum(cost)) / parallel
    sizes = [end - f - c for f, c in zip(free, cost)]
    return sizes if min(sizes) >= head[0][1] and max(sizes) <= largest else None
