"""PyTorch integration: an IterableDataset over a conveyord stream.

    ds = ConveyorDataset("127.0.0.1:7070", "train", minibatch_size=256, epochs=1)
    # same host, GPU: ConveyorDataset("unix:/run/conveyor.sock", "train", transport="cuda")
    #   batches are assembled on the daemon's GPU and arrive as CUDA tensors (no copy)
    for batch in torch.utils.data.DataLoader(ds, batch_size=None):
        x = batch["features"]          # dense: torch tensor sharing the batch's buffer
        y = batch["labels"]            # sparse: torch.sparse_csc_tensor (or csr / dense)
    state = ds.state_dict()            # {'cursor': ...}: load_state_dict(state) resumes after it

Each element is a dict: one entry per stream, plus "_lengths" (per stream, sequence mode)
and "_cursor". Use batch_size=None in the DataLoader: minibatches come made.
"""

import warnings

import torch
import torch.utils.data

from conveyor.client import Client

# torch 1.13 calls its (working) CSC support beta on every tensor made; once is enough.
warnings.filterwarnings("once", message="Sparse CSC tensor support is in beta state")
# Shared-memory batches are read-only views of the daemon's slots: tensors over them are
# meant to be read (copy one to keep or modify it past the next batch).
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def _tensor(a):
    """numpy views become tensors sharing their memory; device batches are tensors already."""
    return a if a is None or isinstance(a, torch.Tensor) else torch.from_numpy(a)


def _sparse(batch, name):
    """A sparse stream as the daemon delivered it (it converts to the layout asked for)."""
    layout = batch.layout(name)
    if layout == "dense":
        return _tensor(batch.dense(name))
    if layout == "csr":
        rowptr, colind, values, (dim, columns) = batch.csr(name)
        return torch.sparse_csr_tensor(_tensor(rowptr).long(), _tensor(colind).long(), _tensor(values), size=(dim, columns))
    colptr, rowind, values, (dim, columns) = batch.csc(name)
    return torch.sparse_csc_tensor(_tensor(colptr).long(), _tensor(rowind).long(), _tensor(values), size=(dim, columns))


class ConveyorDataset(torch.utils.data.IterableDataset):
    """Minibatches of one conveyord stream as dicts of torch tensors.

    Dense streams are zero-copy views of the received buffer; sparse streams become
    torch.sparse_csc_tensor (sparse_layout="csc", one column per (row, step)), or
    torch.sparse_csr_tensor / a dense tensor (sparse_layout="csr" / "dense": the daemon
    converts, so the trainer does no conversion work).
    state_dict() carries the cursor of the last batch yielded, so a restarted job continues
    exactly after it (on any daemon serving the dataset).
    """

    def __init__(self, address, dataset, minibatch_size=256, epochs=1, sparse_layout="csc", **subscribe_args):
        super().__init__()
        if sparse_layout not in ("csc", "csr", "dense"):
            raise ValueError(f"sparse_layout must be csc, csr or dense, not {sparse_layout!r}")
        self.address = address
        self.dataset = dataset
        self.minibatch_size = minibatch_size
        self.epochs = epochs
        self.sparse_layout = sparse_layout
        self.subscribe_args = subscribe_args
        self._cursor = None

    def state_dict(self):
        return {"cursor": self._cursor or ""}

    def load_state_dict(self, state):
        self._cursor = state.get("cursor") or None

    def __iter__(self):
        client = Client(self.address)
        args = dict(self.subscribe_args)
        layouts = dict(args.pop("layouts", None) or {})
        if self.sparse_layout != "csc":
            for s in client.describe(self.dataset).streams:
                if s.format == 1:  # FORMAT_SPARSE
                    layouts.setdefault(s.name, self.sparse_layout)
        sub = client.subscribe(self.dataset, minibatch_size=self.minibatch_size, epochs=self.epochs,
                               resume=self._cursor, layouts=layouts, **args)
        try:
            for batch in sub:
                out = {}
                lengths = {}
                for s in batch.descriptor.streams:
                    if s.format == 1:  # FORMAT_SPARSE
                        out[s.name] = _sparse(batch, s.name)
                    elif s.format == 2:  # FORMAT_IDS: int64, what embedding and loss functions index with
                        out[s.name] = _tensor(batch.ids(s.name)).long()
                    else:
                        out[s.name] = _tensor(batch.dense(s.name))
                    l = batch.lengths(s.name)
                    if l is not None:
                        lengths[s.name] = _tensor(l)
                out["_lengths"] = lengths
                out["_cursor"] = batch.cursor
                self._cursor = batch.cursor
                yield out
        finally:
            sub.close()
            client.close()
