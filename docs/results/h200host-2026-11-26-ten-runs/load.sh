#!/usr/bin/env bash
# A parallel build's load on the cores this runs on (taskset): two g++ -O2 loops compiling railnet's own sources
# until killed. Runs in the repository root.
files=$(ls proxy/tcp/*.cc proxy/protocol/*.cc proxy/progress/*.cc proxy/staging/*.cc base/*.cc plugin/tuner/*.cc)
loop() { while :; do for f in $files; do g++ -std=c++20 -O2 -I include -I . -I build -c "$f" -o /dev/null 2>/dev/null; done; done; }
loop & loop & wait
