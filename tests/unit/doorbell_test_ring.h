// A doorbell ring in plain memory for the unit tests (in real use the slots are pinned and mapped into the GPU).
#pragma once

#include <cstdint>
#include <memory>

#include "proxy/doorbell/ring.h"

struct TestRing {
  explicit TestRing(uint64_t slotCount) : slots(new railnet::doorbell::Descriptor[slotCount]()), capacity(slotCount) {}
  railnet::doorbell::RingConsumer consumer() { return railnet::doorbell::RingConsumer(slots.get(), &control, capacity); }
  // A host producer's post; gives up (false) after about a million waits for room.
  bool post(const railnet::doorbell::Descriptor& d) {
    return railnet::doorbell::postFromHost(slots.get(), &control, capacity, d, 1u << 20);
  }
  std::unique_ptr<railnet::doorbell::Descriptor[]> slots;
  railnet::doorbell::RingControl control{};
  uint64_t capacity;
};
