// printf-style formatting into a std::string, for messages built in parts (reports, dumps).
#pragma once

#include <string>

namespace railnet {

std::string textf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace railnet
