#!/usr/bin/env python3
"""A torch.distributed job through whatever NCCL net transport the environment selects: checked collectives,
then a small DDP training loop whose per-step losses rank 0 writes to --out (JSON).

Launch one process per GPU, each as its own fake host, e.g.
  python3 -m torch.distributed.run --nproc_per_node=2 scripts/gpu/torch_check.py --out losses.json
with NCCL_NET_PLUGIN/NCCL_NET set for the transport under test (scripts/gpu/run-torch.sh does this)."""
import argparse
import json
import os
import sys

# Each rank is its own "node", so all traffic crosses the net transport (must precede NCCL init).
os.environ.setdefault("NCCL_HOSTID", f"torchhost{os.environ.get('LOCAL_RANK', '0')}")
os.environ["NCCL_NVLS_ENABLE"] = "0"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402


def check(name, condition):
    if not condition:
        raise SystemExit(f"rank {dist.get_rank()}: {name} FAILED")


def check_collectives(device, rank, world):
    for count in (1, 1000, 1 << 20, 1 << 24):
        x = torch.full((count,), float(rank + 1), device=device)
        dist.all_reduce(x)
        check(f"all_reduce {count}", torch.all(x == world * (world + 1) / 2).item())
        gathered = [torch.empty(count, device=device) for _ in range(world)]
        dist.all_gather(gathered, torch.full((count,), float(rank), device=device))
        check(f"all_gather {count}", all(torch.all(g == r).item() for r, g in enumerate(gathered)))
        b = torch.full((count,), float(rank + 7), device=device)
        dist.broadcast(b, src=world - 1)
        check(f"broadcast {count}", torch.all(b == world - 1 + 7).item())
        send = torch.arange(count * world, device=device, dtype=torch.float32) + rank * 1e6
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        expected = torch.cat([torch.arange(count, device=device, dtype=torch.float32) + rank * count + r * 1e6
                              for r in range(world)])
        check(f"all_to_all {count}", torch.equal(recv, expected))
        peer = (rank + 1) % world
        source = (rank - 1) % world
        out = torch.full((count,), float(rank * 3), device=device)
        into = torch.empty(count, device=device)
        requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, into, source)])
        for request in requests:
            request.wait()
        check(f"send/recv {count}", torch.all(into == source * 3).item())
    torch.cuda.synchronize()


def train(device, steps):
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index], bucket_cap_mb=1)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator(device="cpu").manual_seed(42 + dist.get_rank())
    inputs = torch.randn(steps, 64, 256, generator=generator)
    # A learnable task: labels from a fixed random linear "teacher", the same on every rank.
    teacher = torch.randn(256, 10, generator=torch.Generator(device="cpu").manual_seed(7))
    targets = (inputs @ teacher).argmax(dim=-1).to(device)
    inputs = inputs.to(device)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(ddp(inputs[step]), targets[step])
        loss.backward()
        optimizer.step()
        averaged = loss.detach().clone()
        dist.all_reduce(averaged)
        losses.append(averaged.item() / dist.get_world_size())
    return losses


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    # One GPU per rank when there are enough; on a one-GPU machine both ranks share it (correctness only).
    gpu = int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count()
    torch.cuda.set_device(gpu)
    device = torch.device("cuda", gpu)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    check_collectives(device, rank, world)
    losses = train(device, args.steps)
    if rank == 0:
        with open(args.out, "w") as out:
            json.dump({"transport": os.environ.get("NCCL_NET", "default"), "losses": losses}, out)
        print(f"collectives OK; {len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
