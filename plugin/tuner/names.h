// Names of collectives, algorithms and protocols as NCCL's example tuner CSV spells them, and back.
#pragma once

#include <string_view>

namespace railnet::tuner {

// The collectives a tuner sees (ncclFunc_t 0..4).
inline constexpr int kNumColls = 5;

// "broadcast", "reduce", "allgather", "reducescatter", "allreduce"; nullptr outside 0..4.
const char* collName(int coll) noexcept;
// "tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"; nullptr outside 0..6.
const char* algoName(int algo) noexcept;
// "ll", "ll128", "simple"; nullptr outside 0..2.
const char* protoName(int proto) noexcept;

// Case-insensitive; collectives also accept nccl-tests spellings (all_reduce, reduce_scatter, ...).
// -1 when unknown.
int parseColl(std::string_view text) noexcept;
int parseAlgo(std::string_view text) noexcept;
int parseProto(std::string_view text) noexcept;

}  // namespace railnet::tuner
