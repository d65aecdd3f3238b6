"""rekindle: the Python side of rekindle's supervision (docs/python.md).

Standard library only (plus Debian's python3-xxhash for the checkpoint store); torch is
imported only by rekindle.torch.

    import rekindle
    w = rekindle.Worker()          # a no-op worker when not under `rk run`
    w.hello(step)
    ...
    w.step(step, loss, dt)
    if "stop" in w.poll(): ...

Modules: rekindle.worker (the heartbeat protocol, docs/protocol.md), rekindle.ckpt (the
checkpoint store, docs/checkpoint.md), rekindle.inject (RK_INJECT, docs/inject.md),
rekindle.stacks (stack dumps on SIGUSR1).
"""

__version__ = "0.1.0"  # as `rk --version` (CMakeLists.txt's project version)

from .worker import (  # noqa: E402
    EXIT_COMM,
    EXIT_FAIL,
    EXIT_GUARD,
    EXIT_OK,
    EXIT_STOPPED,
    EXIT_STORAGE,
    EXIT_USAGE,
    STORAGE_ERRNOS,
    Worker,
    rank_world,
)

__all__ = [
    "__version__",
    "Worker",
    "rank_world",
    "EXIT_OK",
    "EXIT_FAIL",
    "EXIT_USAGE",
    "EXIT_COMM",
    "EXIT_STOPPED",
    "EXIT_GUARD",
    "EXIT_STORAGE",
    "STORAGE_ERRNOS",
]
