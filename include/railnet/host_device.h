// RAILNET_HOST_DEVICE: marks the doorbell headers' functions for both host and CUDA device code (nvcc), and is
// empty for the host compiler. Shared by every header a kernel includes (railnet/doorbell_layout.h,
// railnet/doorbell_device.cuh, railnet/mlx5_wqe.h).
#pragma once

#ifndef RAILNET_HOST_DEVICE
#if defined(__CUDACC__)
#define RAILNET_HOST_DEVICE __host__ __device__
#else
#define RAILNET_HOST_DEVICE
#endif
#endif
