"""conveyor: the Python client of conveyord.

    import conveyor
    client = conveyor.Client("127.0.0.1:7070")
    for batch in client.subscribe("train", minibatch_size=256, epochs=2):
        x = batch.dense("features")          # numpy view, no copy: [rows, T, dim]
        cursor = batch.cursor                 # give it back to resume after this batch

and for PyTorch, conveyor.torch.ConveyorDataset (an IterableDataset with state_dict()).
"""

from conveyor._version import __version__  # noqa: F401
from conveyor.client import Batch, Client, ConveyorError, Subscription  # noqa: F401

__all__ = ["Batch", "Client", "ConveyorError", "Subscription", "__version__"]
