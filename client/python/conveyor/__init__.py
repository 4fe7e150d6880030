"""conveyor: the Python client of conveyord.

    import conveyor
    client = conveyor.Client("127.0.0.1:7070")
    for batch in client.subscribe("train", minibatch_size=256, epochs=2):
        x = batch.dense("features")          # numpy view, no copy: [rows, T, dim]
        cursor = batch.cursor                 # give it back to resume after this batch

and for PyTorch, conveyor.torch.ConveyorDataset (an IterableDataset with state_dict()).
"""

import os as _os
import sys as _sys

# gRPC in a process that forks (DataLoader workers fork the trainer): a child that uses
# gRPC after the parent did hangs unless gRPC's fork support is on (measured: 4 of 25
# DataLoader starts hung without it, and 5 of about 60 forks of a stress test even with
# every channel closed before the fork), which also needs the "poll" polling strategy.
# Both are read when grpc is first imported, so they are set here, before it, unless the
# user chose otherwise. What fork support itself risks, conveyor.client._before_fork avoids.
_GRPC_IMPORTED_FIRST = "grpc" in _sys.modules
_ON = ("1", "true", "yes")
# What gRPC read when it was imported, if it was: the environment as it is now, before the
# defaults below (too late for it), or, for fork support, what grpc itself says it read.
_fork_support = _os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "").lower() in _ON
_poll = _os.environ.get("GRPC_POLL_STRATEGY") == "poll"
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "true")
_os.environ.setdefault("GRPC_POLL_STRATEGY", "poll")
if _GRPC_IMPORTED_FIRST:
    try:
        from grpc._cython import cygrpc as _cygrpc  # noqa: E402
        _fork_support = bool(getattr(_cygrpc, "_GRPC_ENABLE_FORK_SUPPORT", _fork_support))
    except Exception:  # pragma: no cover - another grpc build: the environment's word stands
        pass
# Whether forked children may use gRPC: grpc imported after the settings above, or before
# them with both of them on.
FORK_SAFE_GRPC = not _GRPC_IMPORTED_FIRST or (_fork_support and _poll)

from conveyor._version import __version__  # noqa: E402,F401
from conveyor.client import Batch, Client, ConveyorError, Subscription  # noqa: E402,F401

__all__ = ["Batch", "Client", "ConveyorError", "Subscription", "__version__"]
