// Precompiled for the Catch2 test executables: catch.hpp is about 17,000 lines, and every test file includes it, so
// parsing it once per executable instead of once per file takes minutes off each CI build stage.
#include <catch2/catch.hpp>
