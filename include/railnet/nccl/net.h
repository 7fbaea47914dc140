// All net ABI versions railnet exports (v8..v12).
#pragma once
#include "railnet/nccl/net_v8.h"
#include "railnet/nccl/net_v9.h"
#include "railnet/nccl/net_v10.h"
#include "railnet/nccl/net_v11.h"
#include "railnet/nccl/net_v12.h"
