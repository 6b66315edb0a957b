# Every dependency comes from a Debian 12 package (tools/setup installs
# them). Nothing is downloaded at build time.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd>=1.5)
find_package(ZLIB REQUIRED)
find_package(yaml-cpp REQUIRED)
# The S3 object store (src/objstore): libcurl signs requests with AWS
# SigV4, correctly for S3 from 7.87 (libcurl4-openssl-dev: 7.88); pugixml
# reads S3's XML answers.
find_package(CURL 7.87 REQUIRED)
find_package(pugixml REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash>=0.8)
# htscodecs (libhtscodecs-dev): the rANS coder of context-coded chunks'
# value planes. It ships no pkg-config file.
find_path(DCR_HTSCODECS_INCLUDE_DIR htscodecs/rANS_static4x16.h)
find_library(DCR_HTSCODECS_LIBRARY htscodecs)
if(NOT DCR_HTSCODECS_INCLUDE_DIR OR NOT DCR_HTSCODECS_LIBRARY)
  message(FATAL_ERROR "dcr: htscodecs not found; install libhtscodecs-dev (tools/setup)")
endif()
add_library(dcr_htscodecs INTERFACE IMPORTED)
target_include_directories(dcr_htscodecs INTERFACE ${DCR_HTSCODECS_INCLUDE_DIR})
target_link_libraries(dcr_htscodecs INTERFACE ${DCR_HTSCODECS_LIBRARY})
# Standalone, header-only Asio (libasio-dev) for the TCP transport.
find_path(DCR_ASIO_INCLUDE_DIR asio.hpp)
if(NOT DCR_ASIO_INCLUDE_DIR)
  message(FATAL_ERROR "dcr: asio.hpp not found; install libasio-dev (tools/setup)")
endif()
if(DCR_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(DCR_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()

# Optional backends: ON with the dependency missing fails here; AUTO says
# what it skipped.
set(DCR_HAVE_UCX OFF)
if(NOT DCR_UCX STREQUAL "OFF")
  pkg_check_modules(UCX IMPORTED_TARGET ucx)
  if(UCX_FOUND)
    set(DCR_HAVE_UCX ON)
    message(STATUS "dcr: UCX ${UCX_VERSION} found")
  elseif(DCR_UCX STREQUAL "ON")
    message(FATAL_ERROR "dcr: DCR_UCX=ON but UCX was not found; install "
                        "libucx-dev (tools/setup) or configure with -DDCR_UCX=AUTO")
  else()
    message(STATUS "dcr: UCX not found (libucx-dev); UCX transport skipped")
  endif()
endif()

set(DCR_HAVE_CUDA OFF)
if(NOT DCR_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(DCR_HAVE_CUDA ON)
    message(STATUS "dcr: CUDA compiler ${CMAKE_CUDA_COMPILER} found")
  elseif(DCR_CUDA STREQUAL "ON")
    message(FATAL_ERROR "dcr: DCR_CUDA=ON but no CUDA compiler (nvcc) was "
                        "found; put nvcc on PATH or configure with -DDCR_CUDA=AUTO")
  else()
    message(STATUS "dcr: no CUDA compiler found; CUDA kernels and store skipped")
  endif()
endif()
