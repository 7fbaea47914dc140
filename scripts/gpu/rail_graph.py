#!/usr/bin/env python3
"""Writes the alternating (rail-aligned) ring as an NCCL graph file for one node of a homogeneous cluster
where NIC r sits next to GPU r: even nodes enter on NIC 0 at GPU 0 and leave from GPU k-1 on NIC k-1, odd nodes
walk the same GPUs in reverse (enter on NIC k-1, leave on NIC 0). Every inter-node hop then joins two NICs of
the same rail. Used through NCCL_GRAPH_FILE (read by ncclTopoCompute, src/graph/search.cc) per node parity.
NCCL names a GPU in graph files by its NVML index, which CUDA_VISIBLE_DEVICES does not renumber: a node whose
GPUs are the machine's 2 and 3 (a fake node given its own block) needs --first-gpu 2.
  rail_graph.py --gpus K --parity even|odd [--first-gpu F] [--channels N] -o FILE"""
import argparse


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--parity", choices=["even", "odd"], required=True)
    parser.add_argument("--channels", type=int, default=2)
    parser.add_argument("--first-gpu", type=int, default=0)
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    order = list(range(args.gpus))
    if args.parity == "odd":
        order.reverse()
    channel = [f'      <net dev="{order[0]}"/>'] + [f'      <gpu dev="{g + args.first_gpu}"/>' for g in order] + \
              [f'      <net dev="{order[-1]}"/>']
    body = "\n".join("    <channel>\n" + "\n".join(channel) + "\n    </channel>" for _ in range(args.channels))
    # crossnic=1: a ring may enter and leave a node on different NICs; typeinter PIX: each NIC is local to
    # the GPU that uses it.
    with open(args.output, "w") as out:
        out.write('<graphs version="1">\n'
                  f'  <graph id="0" pattern="4" crossnic="1" nchannels="{args.channels}" speedintra="12" '
                  'speedinter="12" latencyinter="0" typeintra="NVL" typeinter="PIX" samechannels="1">\n'
                  f"{body}\n  </graph>\n</graphs>\n")


if __name__ == "__main__":
    main()
