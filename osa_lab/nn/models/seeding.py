"""Seeded initialisation without torch's global generator: a build's random draws from a local one.

``torch.nn`` layers initialise themselves in their constructors (``nn.Linear`` through
``nn.init.kaiming_uniform_``) and take no generator, and neither do the attention layers'
``init_*`` methods. :func:`random_draws_from` therefore routes every random draw of torch made
*in this thread* while it is active to one :class:`torch.Generator`, by a
:class:`torch.overrides.TorchFunctionMode` that passes ``generator=`` to each random function
called without one. torch's function-mode stack is thread-local, so builds in other threads (and
their draws from the global generator) neither see nor disturb it, and no lock is needed. A
generator seeded with ``s`` yields the same numbers as the global generator after
``torch.manual_seed(s)``, so the weights are those of a build under ``torch.manual_seed``.

:func:`block_seed` derives the seed of block ``i`` of a model seeded with ``seed`` (depth
consistency: the first ``l`` blocks of a depth-L model are the depth-l model).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

__all__ = ["RANDOM_FUNCTIONS", "block_seed", "part_generator", "random_draws_from", "seeded_generator"]

#: torch's random functions and in-place samplers: each takes ``generator=``.
RANDOM_FUNCTIONS: frozenset[Callable] = frozenset(
    {
        torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.random_, torch.Tensor.bernoulli_,
        torch.Tensor.exponential_, torch.Tensor.cauchy_, torch.Tensor.log_normal_, torch.Tensor.geometric_,
        torch.randn, torch.rand, torch.randint, torch.randperm, torch.normal, torch.bernoulli,
        torch.multinomial, torch.poisson, torch.randn_like, torch.rand_like, torch.randint_like,
    }
)  # fmt: skip


def _takes_generator(func: Callable) -> bool:
    """True for a function of ``torch.nn.init`` (or another Python function) with a ``generator`` parameter."""
    if func in RANDOM_FUNCTIONS:
        return True
    try:
        return "generator" in inspect.signature(func).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False


class _GeneratorMode(TorchFunctionMode):
    """Passes ``generator`` to every random torch function called without one (this thread only)."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.generator = generator
        self._takes: dict[Callable, bool] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = dict(kwargs or {})
        takes = self._takes.get(func)
        if takes is None:
            takes = self._takes[func] = _takes_generator(func)
        if takes and kwargs.get("generator") is None:
            kwargs["generator"] = self.generator
        return func(*args, **kwargs)


@contextlib.contextmanager
def random_draws_from(generator: torch.Generator | None) -> Iterator[torch.Generator | None]:
    """Inside the block, torch's random draws in this thread come from ``generator`` (a CPU
    generator; ``None``: from torch's global generator, unchanged). The global generator is
    neither read nor advanced by the draws inside."""
    if generator is None:
        yield None
        return
    with _GeneratorMode(generator):
        yield generator


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU :class:`torch.Generator` seeded with ``seed``: the stream of ``torch.manual_seed(seed)``."""
    return torch.Generator().manual_seed(int(seed))


def block_seed(seed: int, index: int | str) -> int:
    """The seed of part ``index`` (a block number, or ``"embed"``, ``"head"``, …) of a model seeded with ``seed``."""
    key = [seed, index] if isinstance(index, int) else [seed, 2**31 - 1, *map(ord, index)]
    return int(np.random.SeedSequence(key).generate_state(1)[0])


def part_generator(seed: int | None, index: int | str) -> torch.Generator | None:
    """The local generator that builds part ``index`` of a model seeded with ``seed`` (``None``
    for an unseeded model: its parts draw from torch's global generator)."""
    return None if seed is None else seeded_generator(block_seed(seed, index))
