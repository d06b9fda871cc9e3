# Shared build settings for Larder's own targets.

# Warnings as errors and the project include roots, for targets built from our sources.
function(larder_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
endfunction()

# larder_add_test(NAME SOURCES a.cc b.cc LIBS lib1 lib2 [LABELS l] [TIMEOUT s])
# Builds a GoogleTest binary and registers its tests with ctest.
function(larder_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  larder_target_defaults(${name})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main Threads::Threads)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}"
    ENVIRONMENT "LARDER_BIN_DIR=${CMAKE_BINARY_DIR}/bin;LARDER_LOG_LEVEL=warn")
endfunction()
