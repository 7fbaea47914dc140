// A path that goes dark without its link going down (a bad cable or optic that loses frames): iptables rules that
// drop every segment to or from one local address, in the test's own network namespace (tests/conformance/in-netns.sh).
#pragma once

#include <atomic>
#include <cstdlib>
#include <string>

#include "harness.h"

namespace conformance {

class SilencedAddress {
 public:
  explicit SilencedAddress(std::string address) : address_(std::move(address)) {}
  ~SilencedAddress() { lift(); }
  SilencedAddress(const SilencedAddress&) = delete;
  SilencedAddress& operator=(const SilencedAddress&) = delete;

  // The rules go in (from any thread); false when iptables refused.
  bool drop() {
    const bool ok = rules("-I");
    active_ = ok;
    return ok;
  }
  // The rules come out, if in (from any thread; once).
  void lift() {
    if (active_.exchange(false)) rules("-D");
  }
  bool active() const { return active_; }

 private:
  bool rules(const char* action) const {
    bool ok = true;
    for (const char* side : {"-s", "-d"}) {
      ok = std::system(strf("iptables -w %s INPUT %s %s -j DROP", action, side, address_.c_str()).c_str()) == 0 && ok;
    }
    return ok;
  }
  std::string address_;
  std::atomic<bool> active_{false};
};

}  // namespace conformance
