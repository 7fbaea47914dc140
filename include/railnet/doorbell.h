/* railnet's own GPU doorbells (issue 15): host C API. A context joins `nranks` processes (each its own rank) over
 * railnet's transports; kernels post one-sided operations into the context's ring, which railnet's engine thread
 * carries out (railnet/doorbell_device.cuh gives kernels put / put_signal / signal / wait_signal / quiet). Link nothing: the functions live in libnccl-net-railnet.so (dlopen it, or link it).
 *
 * Bootstrap by unique id, as NVSHMEM's UID mode: rank 0 calls railnet_doorbell_get_unique_id, the application
 * hands the 128 bytes to every rank by its own means, and every rank (rank 0 included) calls
 * railnet_doorbell_init with them. Registration is collective: every rank registers its buffers in the same order
 * and gets the same window index. Signal words live in railnet's memory (pinned, mapped into the GPU), so the
 * engine applies a signal with a CPU atomic and kernels poll it without any copy into GPU memory.
 *
 * Every function returns 0 or an ncclResult_t code; the reason goes to NCCL's logger when NCCL loaded railnet,
 * else to stderr (warnings only). Thread safety: calls on one context from one thread at a time. */
#ifndef RAILNET_DOORBELL_H_
#define RAILNET_DOORBELL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What railnet_doorbell_error reports and every device call (railnet/doorbell_device.cuh) returns. */
#define RAILNET_DOORBELL_OK 0
#define RAILNET_DOORBELL_PEER_FAILED 1    /* a transport to a peer failed (the log names the peer) */
#define RAILNET_DOORBELL_BAD_DESCRIPTOR 2 /* an unknown peer, window or signal, or a range outside a window */
#define RAILNET_DOORBELL_STALLED 3        /* a producer reserved a ring slot and never published it */
#define RAILNET_DOORBELL_TIMEOUT 4        /* device calls only: the call's own wait ran past its limit */

typedef struct {
  char internal[128];
} railnet_doorbell_unique_id_t;

typedef struct railnet_doorbell_ctx railnet_doorbell_ctx_t;

/* What kernels need, passed by value to them. Field for field railnet::doorbell::DeviceView. */
typedef struct {
  void* slots;              /* the ring's descriptors (railnet::doorbell::Descriptor) */
  void* control;            /* its counters and error word (railnet::doorbell::RingControl) */
  uint64_t capacity;        /* slots, a power of two */
  uint64_t* signals;        /* this rank's signal words: peers' signals land here */
  uint32_t signal_count;
  int32_t rank;
  int32_t nranks;
  void* direct;             /* the mlx5 direct path (railnet::doorbell::DirectView), NULL: the ring carries them */
} railnet_doorbell_device_t;

/* Rank 0 only, before handing the id to the others. */
int railnet_doorbell_get_unique_id(railnet_doorbell_unique_id_t* id);
/* Collective. cuda_device: the GPU whose kernels use the context (-1: host only). */
int railnet_doorbell_init(const railnet_doorbell_unique_id_t* id, int rank, int nranks, int cuda_device,
                          railnet_doorbell_ctx_t** ctx);
/* Collective, same order on every rank: a symmetric buffer (GPU or host memory); *window is its index. */
int railnet_doorbell_register(railnet_doorbell_ctx_t* ctx, void* buffer, size_t bytes, uint32_t* window);
int railnet_doorbell_device(railnet_doorbell_ctx_t* ctx, railnet_doorbell_device_t* device);
/* The ring's first error: RAILNET_DOORBELL_OK, _PEER_FAILED, _BAD_DESCRIPTOR or _STALLED. */
int railnet_doorbell_error(railnet_doorbell_ctx_t* ctx, uint32_t* error);
int railnet_doorbell_finalize(railnet_doorbell_ctx_t* ctx);

#ifdef __cplusplus
}
#endif

#endif /* RAILNET_DOORBELL_H_ */
