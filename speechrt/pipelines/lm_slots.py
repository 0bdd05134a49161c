"""The slots of the language model's KV cache: which slot a request takes, and the positions a free slot keeps
for its conversation's next request (prefix caching)."""

from __future__ import annotations


class SlotPool:
    """Slots 0..max_batch-1 of one KV cache. A free slot keeps the positions of the request that last used it, so
    that the same conversation's next turn (whose prompt starts with the previous prompt and answer) only
    prefills what is new: `retained` maps slot -> (key, token ids in its cache); the least recently freed is
    taken first by requests without a slot of their own."""

    def __init__(self, runner, cache, max_batch: int):
        self.runner, self.cache, self.max_batch = runner, cache, max_batch
        self.free = list(range(max_batch))
        self.retained: dict[int, tuple[object, list[int]]] = {}

    def take(self, key: object, prompt: list[int]) -> tuple[int, int]:
        """A free slot for a request of conversation `key` (None: none) with token ids `prompt` -> (the slot,
        how many of the prompt's positions that slot already holds)."""
        for slot in reversed(self.free):
            kept, ids = self.retained.get(slot, (None, None))
            if kept is not None and kept == key:
                self.free.remove(slot)
                del self.retained[slot]
                n = 0
                for a, b in zip(ids, prompt[:-1]):  # the last prompt token is always run: its logits
                    if a != b:
                        break
                    n += 1
                return slot, n
        slot = self.free.pop(0)
        self.retained.pop(slot, None)
        return slot, 0

    def put_back(self, slot: int, key: object = None, ids: list[int] | None = None) -> None:
        """`slot` is free again: with a `key`, keeping `ids` (the positions written in it) for the key's next
        request; without one, released to the runner."""
        if key is not None:
            self.retained[slot] = (key, ids)
        else:
            self.runner.release(self.cache, slot)
        self.free.append(slot)

    def reset(self) -> None:
        """Every slot free and released; what the cache held is forgotten."""
        self.retained.clear()
        for slot in range(self.max_batch):
            self.runner.release(self.cache, slot)
        self.free = list(range(self.max_batch))
