#!/usr/bin/env python3
"""Data-parallel training from a conveyord stream: two (or more) processes, each a rank of
a gloo process group, each reading its share of every global minibatch through a
DataLoader with workers, with DistributedDataParallel keeping the model in step.

    PYTHONPATH=build/python /usr/bin/python3 examples/train_ddp.py ADDRESS [--world 2] [--epochs 3]
    # or under torchrun (it sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):
    torchrun --nproc_per_node 2 examples/train_ddp.py ADDRESS

ConveyorDataset takes the rank and world from the process group by itself; the dataset's
"balanced" distribution gives every rank the same number of batches of (nearly) the same
size, so the collective steps never wait on a rank without data. A checkpoint is the
model, the optimizer and ds.state_dict(): --resume continues exactly after its batch.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conveyor.torch import ConveyorDataset


def train(rank, world, args):
    if world > 1 or "RANK" in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    if dist.is_initialized():
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ds = ConveyorDataset(args.address, args.dataset, minibatch_size=args.minibatch_size, randomize=True, seed=3)
    if args.resume and os.path.exists(args.resume):
        state = torch.load(args.resume)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        ds.load_state_dict(state["data"][ds.rank])
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=args.workers)
    start = ds.state_dict()["epoch"]
    losses = []
    for epoch in range(start, args.epochs):
        ds.set_epoch(epoch)
        total, count = 0.0, 0
        for batch in loader:
            x, y = batch["features"], batch["labels"].argmax(dim=1)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(y)
            count += len(y)
        mean = torch.tensor([total, count], dtype=torch.float64)
        if dist.is_initialized():
            dist.all_reduce(mean)
        losses.append(mean[0].item() / mean[1].item())
        if ds.rank == 0:
            print(f"epoch {epoch}: mean loss {losses[-1]:.4f} over {int(mean[1].item())} samples", flush=True)
    if args.checkpoint:
        states = [None] * ds.world
        if dist.is_initialized():
            dist.all_gather_object(states, ds.state_dict())
        else:
            states = [ds.state_dict()]
        if ds.rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "data": states}, args.checkpoint)
    if dist.is_initialized():
        dist.destroy_process_group()
    if ds.rank == 0 and len(losses) > 1 and not losses[-1] < losses[0]:
        print("the loss did not fall", file=sys.stderr)
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("address", help="conveyord address: host:port or unix:/path")
    ap.add_argument("--dataset", default="simple")
    ap.add_argument("--world", type=int, default=2, help="processes to start (ignored under torchrun)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers per process")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--minibatch-size", type=int, default=64)
    ap.add_argument("--port", type=int, default=29517, help="the process group's rendezvous port")
    ap.add_argument("--checkpoint", help="write model, optimizer and data position here at the end")
    ap.add_argument("--resume", help="continue from this checkpoint")
    args = ap.parse_args()
    if "RANK" in os.environ:  # torchrun started us
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    elif args.world > 1:
        mp.spawn(train, args=(args.world, args), nprocs=args.world)
    else:
        train(0, 1, args)


if __name__ == "__main__":
    main()
