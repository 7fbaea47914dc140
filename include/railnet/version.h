// railnet's version (meson's project version) and the git revision it was built from, for the first INFO line
// and every tool's --version.
#pragma once

namespace railnet {

// "0.1.0"
inline constexpr const char* kVersion = RAILNET_VERSION;
// `git describe --always --dirty` at build time ("3297294-dirty"), or "unknown" outside a git checkout.
const char* revision() noexcept;

}  // namespace railnet
