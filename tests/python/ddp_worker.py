"""A two-process torch.distributed (gloo) job for test_torch.py: each process initializes
the group, builds a ConveyorDataset without naming its rank, reads one epoch through a
DataLoader with a worker, and writes what it got to OUT/rank{R}.json.

    ddp_worker.py ADDRESS OUT WORLD
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.utils.data

from conveyor.torch import ConveyorDataset


def run(rank, address, out, world, init):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    ds = ConveyorDataset(address, "sparse", minibatch_size=100, seed=5)
    batches = []
    for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1):
        batches.append([k.decode() if isinstance(k, bytes) else str(k) for k in b["_keys"]])
        dist.barrier()  # data-parallel steps: every rank has a batch each step
    with open(os.path.join(out, f"rank{ds.rank}.json"), "w") as f:
        json.dump({"rank": ds.rank, "world": ds.world, "batches": batches}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    address, out, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
    init = "file://" + os.path.join(out, "rendezvous")
    mp.spawn(run, args=(address, out, world, init), nprocs=world)
