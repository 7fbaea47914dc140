// railnet's doorbell C API (include/railnet/doorbell.h) looked up in railnet's .so with dlopen, as an application
// that does not link the plugin would: the GPU test programs (doorbell_device_test.cu, doorbell_allreduce.cu)
// share it. RAILNET_PLUGIN names the .so (default libnccl-net-railnet.so from the library path).
#pragma once

#include <dlfcn.h>
#include <stdlib.h>

#include <string>

#include "railnet/doorbell.h"

struct DoorbellApi {
  int (*getUniqueId)(railnet_doorbell_unique_id_t*) = nullptr;
  int (*init)(const railnet_doorbell_unique_id_t*, int, int, int, railnet_doorbell_ctx_t**) = nullptr;
  int (*registerWindow)(railnet_doorbell_ctx_t*, void*, size_t, uint32_t*) = nullptr;
  int (*device)(railnet_doorbell_ctx_t*, railnet_doorbell_device_t*) = nullptr;
  int (*error)(railnet_doorbell_ctx_t*, uint32_t*) = nullptr;
  int (*finalize)(railnet_doorbell_ctx_t*) = nullptr;
};

// False with *why (dlopen's or the missing symbol's name) when the .so or a function is not there.
inline bool loadDoorbellApi(DoorbellApi* api, std::string* why) {
  const char* path = getenv("RAILNET_PLUGIN");
  void* library = dlopen(path != nullptr && *path ? path : "libnccl-net-railnet.so", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    *why = std::string("dlopen: ") + (error != nullptr ? error : "failed");
    return false;
  }
  bool found = true;
  auto symbol = [&](auto* slot, const char* name) {
    void* address = dlsym(library, name);
    if (address == nullptr && found) {
      *why = std::string("dlsym: ") + name;
      found = false;
    }
    *slot = reinterpret_cast<std::remove_pointer_t<decltype(slot)>>(address);
  };
  symbol(&api->getUniqueId, "railnet_doorbell_get_unique_id");
  symbol(&api->init, "railnet_doorbell_init");
  symbol(&api->registerWindow, "railnet_doorbell_register");
  symbol(&api->device, "railnet_doorbell_device");
  symbol(&api->error, "railnet_doorbell_error");
  symbol(&api->finalize, "railnet_doorbell_finalize");
  return found;
}
