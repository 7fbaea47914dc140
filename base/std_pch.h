// Precompiled for the plugin's libraries in the sanitizer builds: the standard headers most of its files include,
// parsed once per library instead of once per file (a fifth of the libraries' compile time there; decisions D81).
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>
