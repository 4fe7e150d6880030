#!/usr/bin/env python3
"""Trains a logistic regression on the bundled sparse dataset, streamed from conveyord.

    PYTHONPATH=build/python /usr/bin/python3 examples/train_logreg.py ADDRESS [--epochs 5]

Each minibatch arrives as CSC (one column per document): its arrays feed an embedding bag
directly (rowind = word ids, colptr = offsets, values = weights), i.e. a sparse linear
layer, with no densification and no copy.
"""

import argparse
import time

import torch

import conveyor


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("address", help="conveyord address: host:port or unix:/path")
    ap.add_argument("--dataset", default="sparse")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--minibatch-size", type=int, default=128)
    args = ap.parse_args()

    client = conveyor.Client(args.address)
    info = client.describe(args.dataset)
    dim = info.streams[0].dim
    print(f"training on {args.dataset!r} from {args.address}: {info.sequences} documents, vocabulary {dim}")
    torch.manual_seed(0)
    weights = torch.nn.EmbeddingBag(dim, 1, mode="sum")
    torch.nn.init.zeros_(weights.weight)
    bias = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adagrad(list(weights.parameters()) + [bias], lr=0.2)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    start = time.time()
    samples = 0
    epoch_loss, epoch_batches, epoch = 0.0, 0, 0
    for batch in client.subscribe(args.dataset, minibatch_size=args.minibatch_size, epochs=args.epochs,
                                  randomize=True, seed=1):
        colptr, rowind, values, (_, columns) = batch.csc("words")
        y = torch.from_numpy(batch.dense("label")).reshape(-1)
        logits = weights(torch.from_numpy(rowind).long(), torch.from_numpy(colptr[:-1]).long(),
                         per_sample_weights=torch.from_numpy(values)).reshape(-1) + bias
        loss = loss_fn(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        samples += columns
        epoch_loss += loss.item()
        epoch_batches += 1
        if batch.end_of_epoch:
            rate = samples / (time.time() - start)
            print(f"epoch {epoch}: mean loss {epoch_loss / epoch_batches:.4f}  ({samples} samples, {rate:,.0f} samples/s)")
            epoch_loss, epoch_batches, epoch = 0.0, 0, epoch + 1
    client.close()
    print("done")


if __name__ == "__main__":
    main()
