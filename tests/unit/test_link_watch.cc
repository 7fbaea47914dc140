// Link state from the OS (proxy/progress/link_watch.h): the netlink link messages the watch reads, byte for byte as
// the kernel lays them out (<linux/rtnetlink.h>), and the NIC names it matches against interfaces.
#include <catch2/catch.hpp>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>

#include <cstring>
#include <string>
#include <vector>

#include "proxy/progress/link_watch.h"

using railnet::progress::interfaceOfNic;
using railnet::progress::LinkEvent;
using railnet::progress::parseLinkMessages;

namespace {

// One RTM_NEWLINK (or `type`) message for interface `index` named `name` with `flags`, padded as the kernel pads it.
void appendLinkMessage(std::vector<char>* out, uint16_t type, int index, unsigned flags, const std::string& name) {
  const size_t nameAttr = RTA_LENGTH(name.size() + 1);
  const size_t length = NLMSG_LENGTH(NLMSG_ALIGN(sizeof(ifinfomsg)) + RTA_ALIGN(nameAttr));
  std::vector<char> message(NLMSG_ALIGN(length), 0);
  nlmsghdr header{};
  header.nlmsg_len = static_cast<uint32_t>(length);
  header.nlmsg_type = type;
  memcpy(message.data(), &header, sizeof(header));
  ifinfomsg info{};
  info.ifi_family = AF_UNSPEC;
  info.ifi_index = index;
  info.ifi_flags = flags;
  memcpy(message.data() + NLMSG_HDRLEN, &info, sizeof(info));
  rtattr attribute{};
  attribute.rta_len = static_cast<unsigned short>(nameAttr);
  attribute.rta_type = IFLA_IFNAME;
  char* at = message.data() + NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(ifinfomsg));
  memcpy(at, &attribute, sizeof(attribute));
  memcpy(at + RTA_LENGTH(0), name.c_str(), name.size() + 1);
  out->insert(out->end(), message.begin(), message.end());
}

}  // namespace

TEST_CASE("link messages give each interface's name and whether it carries traffic", "[link_watch]") {
  std::vector<char> datagram;
  appendLinkMessage(&datagram, RTM_NEWLINK, 7, IFF_UP | IFF_RUNNING | IFF_BROADCAST, "rnA1");
  appendLinkMessage(&datagram, RTM_NEWLINK, 8, IFF_UP, "rnA2");  // up, but no carrier
  appendLinkMessage(&datagram, RTM_NEWLINK, 9, IFF_RUNNING, "rnA3");  // set down by the administrator
  appendLinkMessage(&datagram, RTM_DELLINK, 10, IFF_UP | IFF_RUNNING, "rnA4");  // removed
  const std::vector<LinkEvent> events = parseLinkMessages(datagram.data(), datagram.size());
  REQUIRE(events.size() == 4);
  CHECK((events[0].index == 7 && events[0].name == "rnA1" && events[0].up));
  CHECK((events[1].name == "rnA2" && !events[1].up));
  CHECK((events[2].name == "rnA3" && !events[2].up));
  CHECK((events[3].name == "rnA4" && !events[3].up));
}

TEST_CASE("other messages and messages cut short are skipped, never read past the datagram", "[link_watch]") {
  std::vector<char> datagram;
  appendLinkMessage(&datagram, RTM_NEWADDR, 3, IFF_UP | IFF_RUNNING, "eth0");  // not a link message
  appendLinkMessage(&datagram, RTM_NEWLINK, 4, IFF_UP | IFF_RUNNING, "eth1");
  const size_t whole = datagram.size();
  appendLinkMessage(&datagram, RTM_NEWLINK, 5, 0, "eth2");
  const std::vector<LinkEvent> events = parseLinkMessages(datagram.data(), datagram.size());
  REQUIRE(events.size() == 2);
  CHECK(events[0].name == "eth1");
  CHECK(events[1].name == "eth2");
  // Every cut of the last message: the ones before it come out, nothing else.
  for (size_t cut = whole; cut < datagram.size(); ++cut) {
    const std::vector<LinkEvent> some = parseLinkMessages(datagram.data(), cut);
    REQUIRE(some.size() >= 1);
    CHECK(some[0].name == "eth1");
    if (some.size() == 2) CHECK(some[1].name.size() <= 4);
  }
  // A header whose length lies beyond the datagram.
  nlmsghdr lying{};
  lying.nlmsg_len = 4096;
  lying.nlmsg_type = RTM_NEWLINK;
  CHECK(parseLinkMessages(&lying, sizeof(lying)).empty());
}

TEST_CASE("a NIC's interface is its name up to the address", "[link_watch]") {
  CHECK(interfaceOfNic("eth0") == "eth0");
  CHECK(interfaceOfNic("lo@127.0.1.1") == "lo");
  CHECK(interfaceOfNic("rnA2@10.77.2.1") == "rnA2");
}
