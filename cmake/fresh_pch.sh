#!/bin/sh
# Runs a compiler command (the launcher cmake/ccache.cmake sets), first
# removing the precompiled header it is about to write, if there is one.
#
# CMake's rule for the precompiled header includes that header itself
# (-include cmake_pch.hxx), so GCC finds the old cmake_pch.hxx.gch beside it
# and ccache hashes the old one's bytes into the new one's key. GCC's .gch is
# not byte-reproducible, so every rebuild of the header (any re-run of the
# configure rewrites flags.make, on which it depends: adding a source file
# does) missed the cache, wrote other bytes, and every object compiled
# against them missed too: a full rebuild. Without the old file the key is
# the one a fresh build directory has, and the cache gives the same bytes.
prev=
for arg in "$@"; do
  if [ "$prev" = "-o" ]; then
    case "$arg" in
      *.gch) rm -f "$arg" ;;
    esac
  fi
  prev=$arg
done
exec "$@"
