# The build variants scripts/test.sh and scripts/soak.sh share (sourced, not run).
# build_variant [--asan|--tsan|""] sets build_dir and options (meson setup options for scripts/build.sh) and exports
# the sanitizer's run-time options.
build_variant() {
  case "$1" in
    --asan)
      build_dir=build-asan
      # The sanitizer builds test the plugin: the tools (railnet-bench, -info, -tune) and their tests stay out
      # (-Dtools=false); the conformance harness stops at 64 MiB (ASan) and 16 MiB (TSan) messages.
      # Line tables only (-g1): sanitizer reports still name file and line, and the stage compiles faster.
      options=(-Db_sanitize=address,undefined -Db_lundef=false -Dstatic_cxx_runtime=false -Doptimization=0
               -Ddebug=false -Dcpp_args=-g1 -Dtools=false)
      export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
      ;;
    --tsan)
      build_dir=build-tsan
      # -O1 -g1, as TSan's own docs suggest: a third less compile time than -O2 -g on the 2-core machine.
      options=(-Db_sanitize=thread -Db_lundef=false -Dstatic_cxx_runtime=false -Doptimization=1 -Ddebug=false
               -Dcpp_args=-g1 -Dtools=false)
      export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
      ;;
    *)
      build_dir=build
      options=()
      ;;
  esac
}
