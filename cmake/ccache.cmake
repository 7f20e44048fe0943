# A compiler cache for every build directory the project makes (build/,
# build-sanitize/, build-fuzz/ and the bench build): Debian's ccache, which
# `make deps` installs, becomes the compiler launcher. Without it, or with
# -DPATHKERNEL_CCACHE=OFF, every object is compiled as before.
#
# Settings that make it hit, passed to ccache by the launcher for this
# project's compilations only (the cache itself, its location and its size
# limit are the user's: ccache's defaults are ~/.cache/ccache and 5 GB):
# - base_dir = this source tree: paths inside it reach the compiler relative to
#   the build directory, so a clone elsewhere hashes the same command lines and
#   sees the same __FILE__ strings;
# - hash_dir off: the sanitizer and fuzz builds' -g does not put the build
#   directory into every object's hash;
# - sloppiness pch_defines,time_macros and the headers' times: the precompiled
#   header is hashed by its contents (ccache caches its creation too, so a
#   second clone gets the same bytes), not by when it was written;
# - -fpch-preprocess (GCC) and -fno-pch-timestamp (clang): what ccache needs
#   to see a precompiled header that is included with -include;
# - inode_cache: the 600 MB precompiled header is hashed once, not once per
#   file (a hit took ~1 s, nearly all of it reading that header; 0.05 s so);
# - the old precompiled header removed before its rule runs
#   (cmake/fresh_pch.sh): the rule includes the header it writes, so the old
#   .gch's bytes entered the new one's key and a re-run of the configure
#   (adding a source file) rebuilt every object.
# A launcher given on the command line (-DCMAKE_CXX_COMPILER_LAUNCHER=...) is
# kept as it is.
option(PATHKERNEL_CCACHE "Compile through ccache when it is installed" ON)
if(NOT PATHKERNEL_CCACHE OR CMAKE_CXX_COMPILER_LAUNCHER)
  return()
endif()
find_program(PATHKERNEL_CCACHE_PROGRAM ccache)
if(NOT PATHKERNEL_CCACHE_PROGRAM)
  message(STATUS "pathkernel: ccache not found, compiling without a cache (make deps installs it)")
  return()
endif()
set(CMAKE_CXX_COMPILER_LAUNCHER
    ${CMAKE_COMMAND} -E env
    CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}
    CCACHE_NOHASHDIR=1
    CCACHE_INODECACHE=1
    CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
    sh ${PROJECT_SOURCE_DIR}/cmake/fresh_pch.sh
    ${PATHKERNEL_CCACHE_PROGRAM})
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  add_compile_options(-fpch-preprocess)
elseif(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  add_compile_options(-Xclang -fno-pch-timestamp)
endif()
message(STATUS "pathkernel: compiling through ${PATHKERNEL_CCACHE_PROGRAM}")
