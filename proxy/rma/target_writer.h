// What a GIN target writes itself, outside the transport, strictly in the order it is queued: small put payloads
// that came inline with their control record, and signals. rma_comm.cc queues a peer's entries in that peer's put
// order, and only once every earlier payload from the peer has landed, so a signal here always follows its data.
//
// Host memory: a memcpy, and one atomic add per signal. GPU memory: the copy engines of railnet's own context. A
// signal word in GPU memory (NCCL's signal array, which the target GPU polls) is read, added to on the host, and
// written back: nothing but this writer modifies a signal between the user's resets (nccl_device/gin.h:
// resetSignal "may not race with concurrent modifications"), so one writer's read-modify-write is as good as an
// atomic. Copy engines, not a kernel: a kernel of ours could sit queued behind the very kernel that spins waiting
// for the signal (docs/decisions.md D64, D69). Consecutive signals on one word are folded into one read and write.
//
// Not thread-safe: its comm calls it under the comm's lock. CUDA runs only on the thread that calls progress().
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "proxy/rma/control_record.h"

namespace railnet::rma {

class TargetWriter {
 public:
  TargetWriter();
  ~TargetWriter();  // each GPU's copy queue waits for its copy in flight
  TargetWriter(const TargetWriter&) = delete;
  TargetWriter& operator=(const TargetWriter&) = delete;

  // Readies the copy engines of the GPU that holds `window` (GPU memory registered as a window), once per GPU, and
  // returns that GPU's index. Throws railnet::Error when CUDA cannot copy it.
  int prepareDevice(const void* window);
  // Queues `bytes` (at most kInlinePutBytes) for `destination`, in host memory (device < 0) or in GPU `device`'s
  // memory (a GPU prepared with prepareDevice).
  void queueCopy(char* destination, int device, std::vector<char> bytes);
  // Queues op/value on the 64-bit word at `word`, host or GPU memory as above.
  void queueSignal(uint64_t* word, int device, SignalOp op, uint64_t value);
  // Applies what it can without blocking. False with *why on a CUDA error (the comm then fails).
  bool progress(std::string* why);
  bool idle() const { return pending_.empty(); }

 private:
  struct Pending {
    char* destination;
    int device;  // < 0: host memory
    bool isSignal;
    uint64_t delta;           // signals
    std::vector<char> bytes;  // copies
  };
  // One GPU's copy engine state: a queue in a context that can read its windows, and pinned staging.
  struct DeviceLane;
  bool start(std::string* why);

  std::deque<Pending> pending_;
  std::map<int, std::unique_ptr<DeviceLane>> lanes_;  // by CUDA device
  enum class Stage { kIdle, kReading, kWriting } stage_ = Stage::kIdle;
  DeviceLane* active_ = nullptr;  // the lane of the head's copy in flight
  size_t covered_ = 0;            // queue entries the write in flight completes
};

}  // namespace railnet::rma
