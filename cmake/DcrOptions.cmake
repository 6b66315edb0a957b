# Compiler flags shared by every dcr target (through the dcr_flags
# interface library), sanitizer and warning switches.
add_library(dcr_flags INTERFACE)
# C++ only: nvcc (cuda/) takes its own warning flags.
target_compile_options(dcr_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra;-Wpedantic;-Wshadow;-Wnon-virtual-dtor;-Wimplicit-fallthrough>)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # GCC 12 reports false -Wrestrict positives inside std::string
  # (GCC bug 105329).
  target_compile_options(dcr_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
endif()
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  target_compile_options(dcr_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety>)
endif()
if(DCR_WERROR)
  target_compile_options(dcr_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
if(DCR_SANITIZE)
  target_compile_options(dcr_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined;-fno-sanitize-recover=undefined;-fno-omit-frame-pointer>)
  target_link_options(dcr_flags INTERFACE -fsanitize=address,undefined)
  # Code that calls glibc's allocator directly (malloc_trim) skips it.
  target_compile_definitions(dcr_flags INTERFACE DCR_SANITIZED)
endif()
if(DCR_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "dcr: DCR_FUZZ=ON needs clang (-DCMAKE_CXX_COMPILER=clang++ on a new build directory)")
  endif()
  # Instrument every library for coverage; the fuzz targets link libFuzzer.
  target_compile_options(dcr_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined;-fno-omit-frame-pointer>)
  target_link_options(dcr_flags INTERFACE -fsanitize=address,undefined)
  target_compile_definitions(dcr_flags INTERFACE DCR_SANITIZED)
endif()
