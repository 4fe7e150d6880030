"""PyTorch integration: ConveyorDataset, an IterableDataset over a conveyord stream.

    ds = ConveyorDataset("127.0.0.1:7070", "train", minibatch_size=256)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    for epoch in range(start, 10):
        ds.set_epoch(epoch)                 # optional: iterating again continues anyway
        for batch in loader:
            x, y = batch["features"], batch["labels"]
            ...
            torch.save(ds.state_dict(), "ckpt")  # resumes exactly after this batch

What a trainer gets, with the DataLoader habits it already has:

- **Each sequence of an epoch exactly once**, with any `num_workers`: the DataLoader's
  workers share the trainer's stream by batches (worker w of W takes batches w, w + W, ...,
  which the daemon assembles for it alone), and the DataLoader hands them out in stream
  order. `persistent_workers=True` is refused at the first batch (its workers could not learn where the main
  process stopped).
- **Ranks** from an initialized `torch.distributed` group, else `RANK`/`WORLD_SIZE`, else
  0 of 1; explicit `rank=`/`world=` win. `device="cuda"` means `cuda:$LOCAL_RANK`.
- **Epochs**: one iteration is one epoch; iterating again continues with the next (the
  daemon reshuffles each sweep with seed + sweep). `set_epoch(e)` as DistributedSampler has
  it. Every batch carries `"_epoch"`, `"_batch"`, `"_end_of_epoch"`, `"_keys"` and
  `"_cursor"`.
- **state_dict()** in the main process, after any batch, resumes exactly after that batch
  (`load_state_dict`), with any `num_workers`, world size (elastic) or daemon.
- **Memory**: tensors own their memory or share it with nothing that is reused: inline
  batches arrive in their own buffer; shared-memory batches are copied out of the daemon's
  slot (one memcpy) before the slot is given back. In-place operations are fine.
- **To the GPU**: `pin_memory=True` yields page-locked host tensors (torch's pinned memory
  where CUDA is available, else mlock'ed pages), ready for `.cuda(non_blocking=True)`;
  `device="cuda:N"` yields CUDA tensors, copied on a side stream while the previous batch is
  in use. `transport="cuda"` (same host) delivers the daemon's device batches instead.
- **Shapes**: dense streams `[rows, dim]` when the dataset's sequences are single samples
  (or in frame mode), else `[rows, T, dim]` padded, with `"_lengths"[name]` (int64) and
  `"_mask"[name]` (bool `[rows, T]`); a row without a sample of a stream (its line lacks
  the input; in frame mode, a frame its sequence gives none, as a label on the first row
  only) is zeros, with `"_mask"[name]` (bool `[rows]`) False there and a warning once;
  ids int64 with padding `id_padding` (default -100,
  what cross_entropy ignores); sparse streams as torch sparse CSC (or CSR/dense:
  `sparse_layout`). `dtypes={"features": "float16"}` (or `"bfloat16"`) has the daemon narrow
  a stream's values (round to nearest even from float32).

Use `batch_size=None` in the DataLoader: minibatches come made.
"""

import atexit
import ctypes
import difflib
import inspect
import mmap
import numbers
import os
import sys
import uuid
import warnings
import weakref

import numpy as np
import torch
import torch.utils.data

import grpc

import conveyor
from conveyor.client import Batch, Client, ConveyorError

# torch 1.13 calls its (working, tested here) CSC support beta on every tensor made.
warnings.filterwarnings("ignore", message="Sparse CSC tensor support is in beta state")

_FORMAT_SPARSE, _FORMAT_IDS = 1, 2
# Datasets whose main-process stream is open between epochs: closed before a fork (gRPC
# forks safely only without calls in flight) and at exit, while gRPC's
# threads still run (closing a stream during interpreter finalization waits forever).
_OPEN = weakref.WeakValueDictionary()


def _close_open_streams():
    for ds in list(_OPEN.values()):
        try:
            ds.close()
        except Exception:
            pass


atexit.register(_close_open_streams)

_EPOCHS_AHEAD = 1 << 20  # epochs the main process's stream covers when `epochs` is unset
_CONNECTION_ARGS = ("token", "root_certificates", "server_name")  # for Client(), not subscribe()
_DTYPE_NAMES = ("float16", "bfloat16")

# Datasets of this process by id: a batch's cursor unpickled in the main process (from a
# DataLoader worker) reports to the dataset there.
_LIVE = weakref.WeakValueDictionary()


def distributed_rank_and_world(rank=None, world=None):
    """(rank, world): explicit values win, else an initialized torch.distributed group, else
    the RANK and WORLD_SIZE environment variables (torchrun's), else 0 of 1."""
    if rank is not None and world is not None:
        return int(rank), int(world)
    r, w = 0, 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        r, w = torch.distributed.get_rank(), torch.distributed.get_world_size()
    elif "WORLD_SIZE" in os.environ:
        r, w = int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"])
    r = r if rank is None else int(rank)
    w = w if world is None else int(world)
    if not 0 <= r < w:
        raise ValueError(f"rank {r} is not in a world of {w}")
    return r, w


class _Cursor(str):
    """A batch's cursor (a str). It also carries the batch's place in its iteration, so that
    when a DataLoader worker's batch is unpickled in the main process, the dataset there
    learns which batch arrived (ConveyorDataset.state_dict)."""

    def __reduce__(self):
        return _received_cursor, (str(self), getattr(self, "_receipt", None))


def _received_cursor(text, receipt):
    cursor = _Cursor(text)
    cursor._receipt = receipt
    if receipt is not None:
        ds = _LIVE.get(receipt[0])
        if ds is not None:
            ds._received(receipt)
    return cursor


def _dataloader_iterator_in_stack():
    """The DataLoader iterator being created on this thread's stack (it forks or pickles its
    workers from its __init__ or _reset), or None."""
    try:
        from torch.utils.data.dataloader import _BaseDataLoaderIter
    except ImportError:
        return None
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, _BaseDataLoaderIter):
            return candidate
        frame = frame.f_back
    return None


def _before_fork():
    # gRPC forks safely only without calls in flight: streams kept open between epochs end
    # (the next iteration opens its own).
    _close_open_streams()
    it = _dataloader_iterator_in_stack()
    ds = getattr(it, "_dataset", None) if it is not None else None
    if isinstance(ds, ConveyorDataset):
        ds._workers_starting(it)


os.register_at_fork(before=_before_fork)

def _warn_if_fork_unsafe(it):
    global _warned_fork
    context = getattr(it, "_multiprocessing_context", None)
    method = context.get_start_method() if context is not None else torch.multiprocessing.get_start_method()
    if method != "fork" or _warned_fork:
        return
    if not conveyor.FORK_SAFE_GRPC:
        message = ("grpc was imported before conveyor without fork support, so DataLoader workers (forked) may hang "
                   "when they connect. Import conveyor first, or set GRPC_ENABLE_FORK_SUPPORT=true and "
                   "GRPC_POLL_STRATEGY=poll in the environment, or use DataLoader(..., "
                   "multiprocessing_context='forkserver')")
    elif not conveyor.client._GRPC_FORK_GUARD.active:
        message = ("a gRPC channel was made before conveyor was imported, so gRPC's fork handler runs Python in each "
                   "forked DataLoader worker, which rarely hangs a worker at start (README, Forking). Import conveyor "
                   "before anything that uses gRPC, or use DataLoader(..., multiprocessing_context='forkserver')")
    else:
        return
    _warned_fork = True
    warnings.warn("conveyor: " + message, RuntimeWarning)


_warned_fork = False
_COUNTING_CLASSES = {}


def _count_yields(it, dataset):
    """Has the DataLoader iterator `it` tell `dataset` how many batches it handed out, after
    each one: the count must outlive the iterator (a `break` out of the loop drops it at
    once), and state_dict() is asked afterwards. Done by giving `it` a subclass of its own
    class whose __next__ reports (the only way to observe a hand-out from outside)."""
    cls = type(it)
    if cls in _COUNTING_CLASSES.values():
        it._conveyor_dataset = weakref.ref(dataset)
        return
    counting = _COUNTING_CLASSES.get(cls)
    if counting is None:
        def __next__(self, _base=cls):
            data = _base.__next__(self)
            ds = self._conveyor_dataset()
            if ds is not None and ds._iterator is not None and ds._iterator() is self:
                ds._yielded = self._num_yielded
            return data
        counting = type(cls.__name__, (cls,), {"__next__": __next__, "__module__": cls.__module__})
        _COUNTING_CLASSES[cls] = counting
    it._conveyor_dataset = weakref.ref(dataset)
    it.__class__ = counting

_libc = ctypes.CDLL(None, use_errno=True)


def _page_locked(nbytes):
    """A writable page-locked host buffer of nbytes: torch's pinned memory when CUDA is
    available (what .cuda(non_blocking=True) needs), else anonymous pages locked with mlock."""
    if torch.cuda.is_available():
        return torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=True).numpy()
    buf = mmap.mmap(-1, max(nbytes, 1))
    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    if _libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(len(buf))) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"pin_memory: mlock of {nbytes} bytes failed ({os.strerror(err)}); raise the "
                           "memlock limit (ulimit -l) or leave pin_memory off")
    return np.frombuffer(buf, dtype=np.uint8)  # the mapping lives as long as the array


class ConveyorDataset(torch.utils.data.IterableDataset):
    """Minibatches of one conveyord stream as dicts of torch tensors (see the module's
    docstring). Arguments:

    address, dataset: the daemon ("host:port", "unix:/path", several separated by commas) and
        the dataset it serves.
    minibatch_size: samples of the global minibatch (all ranks together).
    epochs: None (default: iterate as many epochs as you like) or N: iterations after epoch
        N - 1 yield nothing.
    rank, world: this trainer's share (default: torch.distributed, else RANK/WORLD_SIZE).
    distribution: "balanced" (every rank's batch within one sequence of minibatch/world) or
        "chunks" (CNTK's decimation by chunk: a rank parses only its own chunks); default: the
        dataset's.
    transport: "inline", "shm" (same host; copied out of the daemon's slot) or "cuda"
        (same host; the daemon's device batches, no copy).
    pin_memory: page-locked host tensors. device: "cuda", "cuda:N" or a torch.device: CUDA
        tensors copied on a side stream.
    sparse_layout: "csc" (default), "csr" or "dense" for every sparse stream.
    dtypes: {stream: "float16" | "bfloat16"}: values narrowed by the daemon.
    id_padding: the value of padded steps of ids streams (default -100).
    Other keyword arguments (seed, randomize, frame_mode, truncation, parallel, epoch_size,
    credits, token, root_certificates, layouts, ...) go to the subscription.
    """

    def __init__(self, address, dataset, minibatch_size=256, epochs=None, *, rank=None, world=None,
                 distribution=None, transport="inline", pin_memory=False, device=None, sparse_layout="csc",
                 dtypes=None, id_padding=-100, **subscribe_args):
        super().__init__()
        if sparse_layout not in ("csc", "csr", "dense"):
            raise ValueError(f"sparse_layout must be csc, csr or dense, not {sparse_layout!r}")
        if transport not in ("inline", "shm", "cuda"):
            raise ValueError(f"transport must be inline, shm or cuda, not {transport!r}")
        for name, dt in (dtypes or {}).items():
            if dt not in _DTYPE_NAMES:
                raise ValueError(f"dtypes[{name!r}] must be float16 or bfloat16, not {dt!r}")
        if distribution not in (None, "balanced", "chunks"):
            raise ValueError(f"distribution must be balanced or chunks, not {distribution!r}")
        if epochs is not None and epochs < 1:
            raise ValueError("epochs must be at least 1 (or None: no limit)")
        _check_subscribe_args(minibatch_size, subscribe_args)
        self.address = address
        self.dataset = dataset
        self.minibatch_size = minibatch_size
        self.epochs = epochs
        self.rank, self.world = distributed_rank_and_world(rank, world)
        if self.world > minibatch_size:
            # Each global minibatch has at most minibatch_size units: ranks beyond them get
            # only empty batches (a loss of NaN on an empty batch poisons DDP's gradients).
            warnings.warn(f"conveyor: minibatch_size {minibatch_size} is below the world size {self.world}: every global "
                          f"minibatch has at most {minibatch_size} sequences, so some ranks get only empty batches; "
                          "minibatch_size is the global minibatch (all ranks together), not a rank's", RuntimeWarning)
        self.distribution = distribution
        self.transport = transport
        self.pin_memory = bool(pin_memory)
        self.device = self._resolve_device(device)
        self.sparse_layout = sparse_layout
        self.dtypes = dict(dtypes or {})
        self.id_padding = id_padding
        self.subscribe_args = dict(subscribe_args)
        self._uid = uuid.uuid4().hex
        _LIVE[self._uid] = self
        # Where the next iteration starts: after `cursor`, in `epoch` (no cursor: its start).
        self._position = {"cursor": "", "epoch": 0}
        self._iteration = 0           # iterations begun in this process
        self._iterator = None         # weakref: the DataLoader iterator of a worker iteration
        self._base = dict(self._position)  # where that iteration started
        self._receipts = {}           # its batches received here: index -> (cursor, epoch, end)
        self._yielded = 0             # its batches handed to the user (counted by _count_yields)
        self._worker_iterations = 0   # in a worker: iterations run (persistent workers refused)
        self._persistent = False      # the DataLoader starting the workers keeps them (refused at once)
        # The main process's stream, open after an epoch ended, continued by the next
        # iteration if it starts where that one stopped: one subscription for all epochs,
        # so the daemon's parsed chunks and prefetch carry over (a new subscription per epoch
        # cost 35% of the rate on short epochs).
        self._live = None

    # ------------------------------------------------------------------ position and state

    @staticmethod
    def _resolve_device(device):
        if device is None:
            return None
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"device must be a CUDA device, not {device}; CPU tensors are the default")
        if device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r} needs a CUDA device, and torch sees none "
                             "(torch.cuda.is_available() is False); leave device unset for CPU tensors")
        return device

    @staticmethod
    def _after(cursor, epoch, end_of_epoch):
        return {"cursor": str(cursor), "epoch": epoch + 1 if end_of_epoch else epoch}

    def _current(self):
        """Where the stream stands after the last batch handed to the user."""
        if self._iterator is None:
            return dict(self._position)
        n = self._yielded
        if n == 0:
            return dict(self._base)
        receipt = self._receipts.get(n - 1)
        if receipt is None:
            raise RuntimeError(f"conveyor: batch {n - 1} of this epoch was yielded by the DataLoader but never "
                               "reported to the dataset in the main process; call state_dict() on the dataset "
                               "you gave the DataLoader")
        return self._after(*receipt)

    def _commit(self):
        self._position = self._current()
        self._iterator = None
        self._receipts = {}

    def _workers_starting(self, it):
        """A DataLoader iterator is starting workers for this dataset (called in the main
        process before each fork, or when the dataset is pickled for a spawned worker)."""
        current = self._iterator() if self._iterator is not None else None
        if current is it:
            return
        _warn_if_fork_unsafe(it)
        # Told to the workers (forked or pickled from here): they refuse at their first batch,
        # not after a whole first epoch.
        self._persistent = bool(getattr(it, "_persistent_workers", False))
        self.close()  # the workers subscribe by themselves
        self._commit()
        self._iteration += 1
        self._iterator = weakref.ref(it)
        self._yielded = 0
        self._base = dict(self._position)
        _count_yields(it, self)

    def _received(self, receipt):
        """A worker's batch arrived in this (main) process."""
        _, iteration, index, cursor, epoch, end = receipt
        if iteration != self._iteration:
            return
        self._receipts[index] = (cursor, epoch, end)
        if len(self._receipts) > 64:  # keep the batches not yet handed out
            done = self._yielded - 1
            for k in [k for k in self._receipts if k < done]:
                del self._receipts[k]

    def state_dict(self):
        """Where the stream stands after the last batch the DataLoader (or a plain loop)
        handed out: load_state_dict(state) continues exactly after it."""
        pos = self._current()
        return {"cursor": pos["cursor"], "epoch": pos["epoch"], "dataset": self.dataset}

    def load_state_dict(self, state):
        if state.get("dataset", self.dataset) != self.dataset:
            raise ValueError(f"this state is of dataset {state['dataset']!r}, not {self.dataset!r}")
        self._iterator = None
        self._receipts = {}
        self._position = {"cursor": state.get("cursor") or "", "epoch": int(state.get("epoch", 0))}

    def set_epoch(self, epoch):
        """Start the next iteration at epoch `epoch` (as DistributedSampler.set_epoch), unless
        the stream already stands inside that epoch (a resumed state): then continue there."""
        self._commit()
        if self._position["epoch"] != epoch:
            if self._position["cursor"] and epoch < self._position["epoch"]:
                # A state saved after an epoch's last batch stands in the next epoch: a loop
                # restarted from the epoch it was saved in would read that epoch again.
                warnings.warn(
                    f"set_epoch({epoch}) moves back from where the stream stands (epoch "
                    f"{self._position['epoch']}, e.g. a state saved after the last batch of epoch "
                    f"{self._position['epoch'] - 1}): epoch {epoch} is read again from its start. To "
                    "continue where a checkpoint stopped, start the epoch loop at "
                    "ds.state_dict()['epoch'] after load_state_dict()", stacklevel=2)
            self._position = {"cursor": "", "epoch": int(epoch)}

    def __getstate__(self):
        # A spawned worker: pickled by the DataLoader iterator starting it.
        it = _dataloader_iterator_in_stack()
        if it is not None and getattr(it, "_dataset", None) is self:
            self._workers_starting(it)
        state = dict(self.__dict__)
        state["_iterator"] = None
        state["_live"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        _LIVE[self._uid] = self

    # ------------------------------------------------------------------ iteration

    def _subscription(self, client, start, stride, offset):
        args = {k: v for k, v in self.subscribe_args.items() if k not in _CONNECTION_ARGS}
        layouts = dict(args.pop("layouts", None) or {})
        desc = client.describe(self.dataset)
        if self.sparse_layout != "csc":
            for s in desc.streams:
                if s.format == _FORMAT_SPARSE:
                    layouts.setdefault(s.name, self.sparse_layout)
        frame_mode = args.get("frame_mode")
        frame_mode = desc.frame_mode if frame_mode is None else frame_mode
        # Single-sample sequences (or frames) are delivered [rows, dim], without a time axis.
        self._single = bool(frame_mode) or (desc.samples == desc.sequences and not args.get("truncation"))
        self._frame_mode = bool(frame_mode)
        self._warned_holes = set()  # streams whose missing samples were warned about
        self._warned_dropped = False  # a batch with sequences dropped as bad input
        kwargs = dict(minibatch_size=self.minibatch_size, rank=self.rank, world=self.world,
                      transport=self.transport, layouts=layouts, **args)
        if self.dtypes:
            kwargs["dtypes"] = self.dtypes
        if self.distribution is not None:
            kwargs["distribution"] = self.distribution
        if stride > 1:
            kwargs["batch_stride"], kwargs["batch_offset"] = stride, offset
        if start["cursor"]:
            kwargs["resume"] = start["cursor"]
        else:
            kwargs["first_epoch"] = start["epoch"]
        # The main process keeps its stream open from epoch to epoch (see _live); workers
        # live for one epoch.
        epochs = start["epoch"] + 1
        if torch.utils.data.get_worker_info() is None:
            epochs = self.epochs if self.epochs is not None else start["epoch"] + _EPOCHS_AHEAD
        return client.subscribe(self.dataset, epochs=epochs, **kwargs)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is None:  # the main process: no DataLoader workers
            self._commit()
            self._iteration += 1
            start, stride, offset = dict(self._position), 1, 0
        else:
            if self._worker_iterations > 0 or self._persistent:
                raise RuntimeError(
                    "conveyor: ConveyorDataset cannot run in persistent DataLoader workers: a worker would not "
                    "know where the main process stopped, and could repeat or skip batches. Use "
                    "persistent_workers=False (the default); the daemon keeps the parsed chunks, so new workers "
                    "start at once")
            if self.device is not None or self.pin_memory:
                raise RuntimeError(
                    "conveyor: device= and pin_memory=True act in the process that iterates; with DataLoader workers "
                    "ask the DataLoader instead (DataLoader(..., pin_memory=True)) and move batches with "
                    ".cuda(non_blocking=True) in the loop, or use num_workers=0")
            self._worker_iterations += 1
            _send_sparse_by_parts()
            start, stride, offset = dict(self._position), info.num_workers, info.id
        if self.epochs is not None and start["epoch"] >= self.epochs:
            self.close()
            return
        live, self._live = self._live, None
        if live is not None and live["position"] != start:  # set_epoch, load_state_dict: elsewhere
            live["sub"].close()
            live["client"].close()
            live = None
        if live is not None:
            client, sub, stream = live["client"], live["sub"], live["stream"]
        else:
            client = Client(self.address, **{k: v for k, v in self.subscribe_args.items() if k in _CONNECTION_ARGS})
            sub = stream = None
        keep = False
        try:
            if sub is None:
                sub = self._subscription(client, start, stride, offset)
                stream = iter(sub)
            keep = yield from self._batches(stream, stride, offset, info)
        except grpc.RpcError as e:  # (a raw gRPC error: the client raises ConveyorError for its own calls)
            error = ConveyorError(e.code(), e.details())
            if info is not None:
                error = WorkerError(str(error), e.code())
            raise error from None
        except ConveyorError as e:
            if info is None:
                raise
            raise WorkerError(str(e), e.code, e.cursor) from None
        finally:
            if keep and info is None:
                self._live = {"client": client, "sub": sub, "stream": stream, "position": dict(self._position)}
                _OPEN[id(self)] = self
            else:
                if sub is not None:
                    sub.close()
                client.close()

    def close(self):
        """Ends the stream the main process keeps open between epochs (iterating again
        opens a new one). Called when the dataset is collected; call it to free the
        daemon's share sooner."""
        live, self._live = self._live, None
        if live is not None:
            live["sub"].close()
            live["client"].close()

    def __del__(self):
        if sys.is_finalizing():  # gRPC's threads are gone; atexit closed it
            return
        try:
            self.close()
        except Exception:
            pass

    def _batches(self, stream, stride, offset, info):
        """Yields this iteration's batches; returns True when it stopped at the end of an
        epoch with the stream still open (the main process continues it next iteration)."""
        pending = None  # device: the batch whose copy is in flight
        for k, batch in enumerate(stream):
            index = offset + stride * k
            out = self._tensors(batch)
            cursor = _Cursor(batch.cursor)
            cursor._receipt = (self._uid, self._iteration, index, batch.cursor, batch.epoch, batch.end_of_epoch)
            out["_cursor"] = cursor
            out["_epoch"] = batch.epoch
            out["_batch"] = batch.index
            out["_end_of_epoch"] = batch.end_of_epoch
            out["_keys"] = batch.keys()
            if self.device is not None:
                out = self._to_device(out)
                if pending is not None:
                    yield self._handed_out(pending, info)
                pending = out
                if not batch.end_of_epoch or info is not None:
                    continue
                out, pending = pending, None
            yield self._handed_out(out, info)
            if batch.end_of_epoch and info is None and (self.epochs is None or batch.epoch + 1 < self.epochs):
                return True  # the next epoch follows on this stream
        if pending is not None:
            yield self._handed_out(pending, info)
        return False

    def _handed_out(self, out, info):
        if info is None:  # the main process: the position moves with each batch handed out
            r = out["_cursor"]._receipt
            self._position = self._after(r[3], r[4], r[5])
        ready = out.pop("_ready", None)
        if ready is not None:  # the consumer's work on this batch waits for its copy
            torch.cuda.current_stream(self.device).wait_event(ready)
        return out

    # ------------------------------------------------------------------ conversion

    def _owned(self, batch):
        """A batch whose bytes nothing else will reuse: shared-memory slots are copied out
        (the daemon refills a slot once it is acknowledged); pin_memory copies into
        page-locked memory."""
        if batch.on_device:
            return batch
        if self.transport != "shm" and not self.pin_memory:
            return batch  # inline: the batch's own buffer
        nbytes = batch.descriptor.total_bytes
        buf = _page_locked(nbytes) if self.pin_memory else np.empty(nbytes, dtype=np.uint8)
        buf[:nbytes] = np.frombuffer(batch.buffer, dtype=np.uint8, count=nbytes)
        return Batch(batch.descriptor, memoryview(buf)[:nbytes])

    def _tensors(self, batch):
        batch = self._owned(batch)
        out, lengths, masks = {}, {}, {}
        desc = batch.descriptor
        rows, counts, nstreams = desc.rows, desc.pieces.counts, len(desc.streams)
        if desc.dropped and not self._warned_dropped:
            self._warned_dropped = True
            warnings.warn(f"conveyor: {desc.dropped} piece(s) of a batch (whole sequences; frames in frame mode; "
                          f"fragments in truncated BPTT) were dropped as bad input (the dataset's maxErrors; the "
                          f"daemon's log names them): such batches hold fewer rows, or gaps",
                          RuntimeWarning, stacklevel=2)
        for i, s in enumerate(desc.streams):
            single = self._single and s.sequence_axis and s.max_length <= 1 and not desc.steps
            # One sample a sequence: [rows, dim] (no step axis), unless a row lacks the stream
            # (its line had no such input): that row is zeros (or id_padding), and the stream
            # gets a mask and lengths like a sequence stream's, with a warning the first time.
            # Told by the descriptor on the host (no look at lengths that may lie on a device):
            # compact pieces are one sample of every stream a row; else the per-piece counts.
            holes = single and not desc.pieces.single_sample_rows and (
                len(counts) < rows * nstreams or min(counts[i::nstreams], default=1) < 1)
            # Frame mode, a row a frame (no step axis): a frame without a sample of the stream
            # (a sequence's label on its first row only) is zeros; the pieces' counts say which.
            frame_holes = (self._frame_mode and not desc.pieces.single_sample_rows
                           and len(counts) == rows * nstreams and min(counts[i::nstreams], default=1) < 1)
            lens = batch.lengths(s.name) if s.sequence_axis and (holes or not single) else None
            lens = None if lens is None else _tensor(lens).long()
            if s.format == _FORMAT_SPARSE and batch.layout(s.name) != "dense":
                out[s.name] = _sparse(batch, s.name)
            elif s.format == _FORMAT_IDS:
                ids = _tensor(batch.ids(s.name)).long()
                if single:
                    ids = ids.reshape(rows) if ids.numel() == rows else torch.zeros(rows, dtype=ids.dtype, device=ids.device)
                    if holes:
                        ids = ids.masked_fill(lens.to(ids.device) < 1, self.id_padding)
                elif lens is not None and ids.dim() == 2:
                    pad = torch.arange(ids.shape[1], device=ids.device)[None, :] >= lens.to(ids.device)[:, None]
                    ids = ids.masked_fill(pad, self.id_padding)
                out[s.name] = ids
            else:
                values = _dense_tensor(batch, s)
                if single:
                    dim = values.shape[-1]
                    values = (values.reshape(rows, dim) if values.numel() == rows * dim
                              else torch.zeros((rows, dim), dtype=values.dtype, device=values.device))
                out[s.name] = values
            if frame_holes:
                lens = torch.tensor(counts[i::nstreams], dtype=torch.long)
            if holes or frame_holes:
                lengths[s.name] = lens
                masks[s.name] = lens.cpu() >= 1
                if s.name not in self._warned_holes:
                    self._warned_holes.add(s.name)
                    missing = int((lens < 1).sum())
                    warnings.warn(f"conveyor: {missing} of {rows} rows of a batch have no sample of stream {s.name!r} "
                                  f"(their lines lack that input, or its name or alias matches nothing in the "
                                  f"file): given as zeros; batch['_mask'][{s.name!r}] is False there",
                                  RuntimeWarning, stacklevel=2)
            elif lens is not None and not single:
                lengths[s.name] = lens
                masks[s.name] = torch.arange(max(int(s.max_length), 1))[None, :] < lens.cpu()[:, None]
        out["_lengths"] = lengths
        out["_mask"] = masks
        return out

    def _to_device(self, out):
        """Copies the batch's tensors to self.device on a side stream; the consumer's stream
        waits for the copy when the batch is handed out."""
        if not hasattr(self, "_copy_stream"):
            self._copy_stream = torch.cuda.Stream(self.device)
        moved = {}
        with torch.cuda.stream(self._copy_stream):
            for k, v in out.items():
                moved[k] = _move(v, self.device)
        ready = torch.cuda.Event()
        ready.record(self._copy_stream)
        for v in moved.values():
            _record(v, torch.cuda.current_stream(self.device))
        moved["_ready"] = ready
        return moved


# Subscription options ConveyorDataset sets itself (its arguments, its state, its workers).
_DATASET_MANAGED = ("dataset", "minibatch_size", "epochs", "rank", "world", "transport", "distribution", "dtypes",
                    "resume", "first_epoch", "batch_stride", "batch_offset")
_DATALOADER_ARGS = ("batch_size", "num_workers", "shuffle", "pin_memory_device", "prefetch_factor",
                    "persistent_workers", "collate_fn", "sampler", "drop_last")


def _check_subscribe_args(minibatch_size, args):
    """At construction, not at the first batch (in every DataLoader worker): what would fail there."""
    if isinstance(minibatch_size, bool) or not isinstance(minibatch_size, numbers.Integral) or minibatch_size < 1:
        raise ValueError(f"minibatch_size must be a whole number of samples, at least 1, not {minibatch_size!r}")
    accepted = set(inspect.signature(Client.subscribe).parameters) - {"self"} | set(_CONNECTION_ARGS)
    for name, value in args.items():
        if name == "batch_size":
            raise TypeError(f"ConveyorDataset got batch_size={value!r}: a batch's size here is minibatch_size (samples, "
                            "all ranks together); give the DataLoader batch_size=None")
        if name in _DATALOADER_ARGS:
            raise TypeError(f"ConveyorDataset got {name}={value!r}: that is an argument of torch's DataLoader: "
                            f"DataLoader(dataset, batch_size=None, {name}={value!r})")
        if name in _DATASET_MANAGED:
            raise TypeError(f"ConveyorDataset got {name}={value!r}: it sets {name} itself "
                            "(resume with load_state_dict(), choose the epoch with set_epoch())")
        if name not in accepted:
            close = difflib.get_close_matches(name, sorted(accepted - set(_DATASET_MANAGED)), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"ConveyorDataset got an unexpected keyword argument {name!r}{hint}")
    for name in ("seed", "epoch_size", "truncation", "parallel", "credits"):
        v = args.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0):
            raise ValueError(f"{name} must be a whole number, 0 or more, not {v!r}")
    for name in ("randomize", "frame_mode"):
        v = args.get(name)
        if v is not None and not isinstance(v, bool):
            raise ValueError(f"{name} must be True or False (or None: the dataset's setting), not {v!r}")


def _tensor(a):
    """numpy views become tensors sharing their memory; device batches are tensors already."""
    if a is None or isinstance(a, torch.Tensor):
        return a
    if not a.flags.writeable:
        a = a.copy()  # never hand out a tensor over memory the client may not own
    return torch.from_numpy(a)


def _dense_tensor(batch, s):
    a = batch.dense(s.name)
    if isinstance(a, np.ndarray) and a.dtype == np.uint16:  # bfloat16 bits (numpy has no bfloat16)
        return _tensor(a.view(np.int16)).view(torch.bfloat16)
    return _tensor(a)


def _sparse(batch, name):
    """A sparse stream as the daemon delivered it (it converts to the layout asked for), its
    indices sorted and repeated ones summed within each column (row), as torch requires."""
    layout = batch.layout(name)
    if layout == "csr":
        rowptr, colind, values, (dim, columns) = batch.csr(name)
        parts = _canonical(_tensor(rowptr).long(), _tensor(colind).long(), _values(values))
        return torch.sparse_csr_tensor(*parts, size=(dim, columns))
    colptr, rowind, values, (dim, columns) = batch.csc(name)
    parts = _canonical(_tensor(colptr).long(), _tensor(rowind).long(), _values(values))
    return torch.sparse_csc_tensor(*parts, size=(dim, columns))


def _canonical(ptr, idx, values):
    """Compressed sparse parts with each segment's (column's, or row's) indices ascending and
    distinct, as torch's sparse CSC and CSR tensors must have them. The daemon keeps a
    sample's entries in file order (docs/design.md, section 5), and a CTF sample may list
    them in any order and name an index twice: such a segment is sorted (stably) and
    repeated indices summed in file order, the values the dense layout gives. Parts already
    so, the common case, come back as they are after one pass."""
    n = idx.numel()
    if n < 2:
        return ptr, idx, values
    rising = idx[1:] > idx[:-1]
    starts = ptr[1:-1]
    rising[starts[(starts > 0) & (starts < n)] - 1] = True  # a segment may start lower
    if bool(rising.all()):
        return ptr, idx, values
    segments = ptr.numel() - 1
    dev = idx.device  # (a device batch's parts are on its device)
    seg = torch.repeat_interleave(torch.arange(segments, device=dev), ptr[1:] - ptr[:-1])
    key = seg * (int(idx.max()) + 1) + idx
    key, order = torch.sort(key, stable=True)
    idx, seg, values = idx[order], seg[order], values[order]
    first = torch.ones(n, dtype=torch.bool, device=dev)
    first[1:] = key[1:] != key[:-1]
    if not bool(first.all()):
        group = torch.cumsum(first.long(), 0) - 1  # each entry's place among the distinct ones
        summed = torch.zeros(int(group[-1]) + 1, dtype=values.dtype, device=dev)
        summed.index_add_(0, group, values)  # in order: file order within each index
        idx, seg, values = idx[first], seg[first], summed
    counts = torch.bincount(seg, minlength=segments)
    ptr = torch.zeros(segments + 1, dtype=torch.long, device=dev)
    ptr[1:] = torch.cumsum(counts, 0)
    return ptr, idx, values


class WorkerError(ConveyorError):
    """A ConveyorError raised in a DataLoader worker. The DataLoader re-raises a worker's
    exception in the main process by calling its type with one argument, the message (with
    the worker's traceback): this type takes that and finds the status code in it again."""

    def __init__(self, message, code=None, cursor=""):
        if code is None:
            last = message.rstrip().splitlines()[-1] if message.strip() else ""
            code = next((c for c in grpc.StatusCode if f" {c.name}: " in f" {last}"), grpc.StatusCode.UNKNOWN)
        RuntimeError.__init__(self, message)
        self.code = code
        self.cursor = cursor


_SPARSE_COMPRESSED = {torch.sparse_csr: "csr", torch.sparse_csc: "csc"}


def _rebuild_sparse(layout, compressed, plain, values, size):
    """The inverse of _reduce_tensor for a sparse CSR/CSC tensor (runs in the main process)."""
    make = torch.sparse_csr_tensor if layout == "csr" else torch.sparse_csc_tensor
    return make(compressed, plain, values, size=size)


def _reduce_tensor(t):
    layout = _SPARSE_COMPRESSED.get(t.layout)
    if layout is None:
        return _torch_reduce_tensor(t)
    if layout == "csr":
        parts = (t.crow_indices(), t.col_indices())
    else:
        parts = (t.ccol_indices(), t.row_indices())
    # The parts are strided tensors: the queue sends them through shared memory as usual.
    return _rebuild_sparse, (layout, parts[0], parts[1], t.values(), tuple(t.shape))


def _send_sparse_by_parts():
    """In a DataLoader worker: lets sparse CSR/CSC batches cross the worker queue.

    torch (1.13 at least) cannot send a sparse compressed tensor between processes ("Cannot
    access storage of SparseCsrTensorImpl"); sent as its three strided parts and rebuilt on
    arrival it can. Registered in the worker process only (a fork of the main one)."""
    global _torch_reduce_tensor
    from multiprocessing.reduction import ForkingPickler
    import torch.multiprocessing.reductions as reductions
    if _torch_reduce_tensor is None:
        _torch_reduce_tensor = reductions.reduce_tensor
        ForkingPickler.register(torch.Tensor, _reduce_tensor)


_torch_reduce_tensor = None


def _values(a):
    if isinstance(a, np.ndarray) and a.dtype == np.uint16:
        return _tensor(a.view(np.int16)).view(torch.bfloat16)
    return _tensor(a)


def _move(v, device):
    if isinstance(v, torch.Tensor):
        return v.to(device, non_blocking=True)
    if isinstance(v, dict):
        return {k: _move(x, device) for k, x in v.items()}
    return v


def _record(v, stream):
    if isinstance(v, torch.Tensor) and v.is_cuda:
        v.record_stream(stream)
    elif isinstance(v, dict):
        for x in v.values():
            _record(x, stream)
