// railnet-gin-device-test's command line (gin_device_test.cu): the options, their parsing and the usage text.
// Host code only; included once, by gin_device_test.cu, inside its anonymous namespace after the constants.
#pragma once

struct Options {
  bool check = false, bench = false;
  size_t maxBytes = 256 * kMiB;
  int iters = 1000;      // round trips (warm-up: iters / 10)
  int bwIters = 5;       // timed rounds per bandwidth size (plus one warm-up)
  double timeoutS = 30;  // bound of every device-side wait
  int watchdogS = 1800;  // whole run (parent kills both ranks after this)
};

size_t parseBytes(const char* s) {
  char* end = nullptr;
  double v = strtod(s, &end);
  switch (end && *end ? *end : 0) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= kMiB; break;
    case 'g': case 'G': v *= 1024.0 * kMiB; break;
    case 0: break;
    default: fprintf(stderr, "bad size %s\n", s); exit(2);
  }
  return (size_t)v;
}

void usage(FILE* f, const char* argv0) {
  fprintf(f,
          "usage: %s [--check] [--bench] [--max-bytes N[K|M|G]] [--iters N] [--bw-iters N] [--timeout-s S] "
          "[--watchdog-s S]\n"
          "  --check        put/signal/flush/counter checks (the default when neither --check nor --bench)\n"
          "  --bench        GIN signal round trip and put bandwidth, and ncclSend/ncclRecv for comparison\n"
          "  --max-bytes    largest put (default 256M; the window is 2 x this + 1 MiB per rank)\n"
          "  --iters        round trips timed in --bench (default 1000, plus 1/10 warm-up)\n"
          "  --bw-iters     timed rounds per bandwidth size (default 5, plus 1 warm-up)\n"
          "  --timeout-s    limit of every device-side wait (default 30)\n"
          "  --watchdog-s   limit of the whole run (default 1800)\n"
          "  --version      print the version and git revision\n"
          "Forks two ranks (parent rank 0, child rank 1), each its own NCCL_HOSTID unless "
          "RAILNET_GIN_TEST_SAME_HOST=1.\n"
          "Exit: 0 pass, 1 check failed, 2 NCCL/CUDA error or hang, 3 GIN unavailable (ncclDevCommCreate failed).\n",
          argv0);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "%s needs a value\n", a.c_str());
        usage(stderr, argv[0]);
        exit(2);
      }
      return argv[++i];
    };
    if (a == "--check") o.check = true;
    else if (a == "--bench") o.bench = true;
    else if (a == "--max-bytes") o.maxBytes = parseBytes(next());
    else if (a == "--iters") o.iters = atoi(next());
    else if (a == "--bw-iters") o.bwIters = atoi(next());
    else if (a == "--timeout-s") o.timeoutS = atof(next());
    else if (a == "--watchdog-s") o.watchdogS = atoi(next());
    else if (a == "-h" || a == "--help") {
      usage(stdout, argv[0]);
      exit(0);
    } else if (a == "--version") {
      printf("railnet-gin-device-test %s (revision %s)\n", RAILNET_VERSION, RAILNET_REVISION);
      exit(0);
    } else {
      fprintf(stderr, "unknown option %s\n", a.c_str());
      usage(stderr, argv[0]);
      exit(2);
    }
  }
  if (!o.check && !o.bench) o.check = true;
  if (o.maxBytes < 64 * 1024 || o.iters < 1 || o.bwIters < 1 || o.timeoutS <= 0 || o.watchdogS < 1) {
    fprintf(stderr, "need --max-bytes >= 64K, --iters >= 1, --bw-iters >= 1, positive timeouts\n");
    exit(2);
  }
  return o;
}
