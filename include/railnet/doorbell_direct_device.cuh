// The device policy of railnet's direct-path producer (railnet/doorbell_direct_producer.h): how a kernel reserves,
// waits, publishes and rings a ConnectX doorbell. Included by railnet/doorbell_device.cuh, which uses it whenever a
// context has a direct view (railnet_doorbell_device_t.direct).
//
// Scopes: `reserved` is counted by one GPU's threads only, so a device-scope atomic on mapped host memory is enough
// (D72, as the ring's tickets); everything the NIC or the host's poller reads or writes is at system scope. The
// doorbell register is the UAR page mapped as I/O memory: one st.mmio (PTX ISA 8.2, sm_70+), which is never merged
// with or split from other stores, as NVSHMEM's IBGDA rings it.
//
// NOT RUN ON HARDWARE (see railnet/doorbell_direct.h).
#pragma once

#include <cuda/atomic>
#include <stdint.h>

#include "railnet/doorbell_direct_producer.h"

namespace railnet::doorbell::direct {

struct DeviceMemory {
  __device__ static uint64_t fetchAddDevice(uint64_t* word, uint64_t add) {
    return cuda::atomic_ref<uint64_t, cuda::thread_scope_device>(*word).fetch_add(add, cuda::memory_order_relaxed);
  }
  template <typename T>
  __device__ static T loadAcquireSystem(const T* word) {
    return cuda::atomic_ref<T, cuda::thread_scope_system>(*const_cast<T*>(word)).load(cuda::memory_order_acquire);
  }
  template <typename T>
  __device__ static void storeReleaseSystem(T* word, T value) {
    cuda::atomic_ref<T, cuda::thread_scope_system>(*word).store(value, cuda::memory_order_release);
  }
  __device__ static void fenceSystem() { __threadfence_system(); }
  __device__ static void storeMmio64(uint64_t* reg, uint64_t value) {
    asm volatile("st.mmio.relaxed.sys.global.u64 [%0], %1;" ::"l"(__cvta_generic_to_global(reg)), "l"(value)
                 : "memory");
  }
  __device__ static void pause() { __nanosleep(200); }
  __device__ static uint64_t nowNs() {
    uint64_t ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
  }
};

}  // namespace railnet::doorbell::direct
