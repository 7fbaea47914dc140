// With libstdc++ linked into the plugin, each dlopen gets a private copy of its exception emergency pool
// (about 71 KiB). NCCL dlcloses and reopens the plugin whenever its last communicator goes, so without this
// every cycle would leak one pool. At unload no exception can be in flight in our code, so freeing it is safe.
#ifdef RAILNET_STATIC_CXX_RUNTIME
namespace __gnu_cxx {
void __freeres();
}

namespace {
__attribute__((destructor)) void releasePrivateCxxRuntime() { __gnu_cxx::__freeres(); }
}  // namespace
#endif
