#include "topo/name_filter.h"

#include <charconv>

#include "railnet/log.h"

namespace railnet::topo {
namespace {

// "" -> fallback; a malformed number is reported and also gives the fallback.
template <typename Int>
Int parseField(std::string_view text, Int fallback, std::string_view what, std::string_view entry,
               std::string_view setting) {
  if (text.empty()) return fallback;
  Int value{};
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0) {
    RN_WARN("NET/railnet: %.*s entry \"%.*s\": %.*s \"%.*s\" is not a number; ignored",
            static_cast<int>(setting.size()), setting.data(), static_cast<int>(entry.size()), entry.data(),
            static_cast<int>(what.size()), what.data(), static_cast<int>(text.size()), text.data());
    return fallback;
  }
  return value;
}

// Splits off the text before `separator` (all of it when absent).
std::string_view nextToken(std::string_view* rest, char separator) {
  size_t at = rest->find(separator);
  std::string_view token = rest->substr(0, at);
  rest->remove_prefix(at == std::string_view::npos ? rest->size() : at + 1);
  return token;
}

}  // namespace

NameFilter::NameFilter(std::string_view spec, Syntax syntax, std::string_view setting) {
  if (!spec.empty() && spec.front() == '^') {
    exclude_ = true;
    spec.remove_prefix(1);
  }
  if (!spec.empty() && spec.front() == '=') {
    exact_ = true;
    spec.remove_prefix(1);
  }
  while (!spec.empty()) {
    std::string_view item = nextToken(&spec, ',');
    if (syntax == Syntax::kNames) {
      if (!item.empty()) entries_.push_back(Entry{std::string(item)});
      continue;
    }
    std::string_view fields = item;
    std::string_view name = nextToken(&fields, ':');
    if (name.empty()) continue;
    if (name.front() == '^' || name.front() == '=') {
      RN_WARN("NET/railnet: %.*s entry \"%.*s\": '%c' is only allowed at the start; entry ignored",
              static_cast<int>(setting.size()), setting.data(), static_cast<int>(item.size()), item.data(),
              name.front());
      continue;
    }
    Entry entry{std::string(name)};
    entry.port = parseField<int>(nextToken(&fields, ':'), -1, "port", item, setting);
    entry.rail = parseField<int16_t>(nextToken(&fields, ':'), kNoId, "rail", item, setting);
    entry.plane = parseField<int16_t>(nextToken(&fields, ':'), kNoId, "plane", item, setting);
    entries_.push_back(std::move(entry));
  }
}

bool NameFilter::names(const Entry& entry, std::string_view name) const {
  return exact_ ? name == entry.name : name.starts_with(entry.name);
}

const NameFilter::Entry* NameFilter::find(std::string_view name, int port) const {
  for (const Entry& entry : entries_) {
    if (names(entry, name) && (entry.port < 0 || port < 0 || entry.port == port)) return &entry;
  }
  return nullptr;
}

bool NameFilter::matches(std::string_view name, int port) const {
  if (entries_.empty()) return true;
  return (find(name, port) != nullptr) != exclude_;
}

bool NameFilter::selectsDevice(std::string_view name) const {
  if (entries_.empty()) return true;
  if (!exclude_) return find(name, -1) != nullptr;
  // Excluded outright only by an entry that names it without a port.
  for (const Entry& entry : entries_) {
    if (entry.port < 0 && names(entry, name)) return false;
  }
  return true;
}

int16_t NameFilter::railId(std::string_view name, int port) const {
  const Entry* entry = exclude_ ? nullptr : find(name, port);
  return entry != nullptr ? entry->rail : kNoId;
}

int16_t NameFilter::planeId(std::string_view name, int port) const {
  const Entry* entry = exclude_ ? nullptr : find(name, port);
  return entry != nullptr ? entry->plane : kNoId;
}

}  // namespace railnet::topo
