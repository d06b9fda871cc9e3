# Shared build settings for Larder's own targets.

# Warnings as errors and the project include roots, for targets built from our sources.
function(larder_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
  # include/ is the libraries' interface; src/ is every target's own business (each one that
  # includes an internal header gets it here, not from a library it links).
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR}/include
                                       PRIVATE ${PROJECT_SOURCE_DIR}/src)
endfunction()

# larder_add_test(NAME SOURCES a.cc b.cc LIBS lib1 lib2 [LABELS l] [TIMEOUT s] [LOCK resource])
# LOCK: tests that share a machine-wide resource (e.g. "hugepages", the hugetlb pool) never run
# at the same time.
# Builds a GoogleTest binary and registers its tests with ctest.
function(larder_add_test name)
  cmake_parse_arguments(ARG "SERIAL" "TIMEOUT;LOCK" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  larder_target_defaults(${name})
  # GCC 12 at -O3 flags std::string's operator+ ("k" + std::to_string(i)) with -Wrestrict, a
  # false positive inside libstdc++ (GCC bug 105329) that a Release build of the tests hits.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${name} PRIVATE -Wno-restrict)
  endif()
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main Threads::Threads)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  # gtest_discover_tests flattens PROPERTIES into one list, so a property value must be a single
  # element: an empty LABELS would swallow the next property name, and "A=1;B=2" would split.
  # Hence LABELS only when given (one label), and one environment variable per property.
  set(properties TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "LARDER_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
    ENVIRONMENT_MODIFICATION "LARDER_LOG_LEVEL=set:warn")
  if(ARG_LABELS)
    list(APPEND properties LABELS "${ARG_LABELS}")
  endif()
  if(ARG_LOCK)
    list(APPEND properties RESOURCE_LOCK "${ARG_LOCK}")
  endif()
  if(ARG_SERIAL)
    list(APPEND properties RUN_SERIAL TRUE)
  endif()
  # The binary's name prefixes every test ("common_test.StatusTest.Ok"), so that
  # `ctest -R common_test` selects one binary's tests.
  gtest_discover_tests(${name}
    TEST_PREFIX "${name}."
    DISCOVERY_TIMEOUT 60
    PROPERTIES ${properties})
endfunction()

# larder_add_fuzzer(NAME SOURCES a.cc LIBS lib1 ...)
# A fuzz target: sources that define LLVMFuzzerTestOneInput. In a fuzz build (LARDER_FUZZ, clang)
# it becomes the libFuzzer binary bin/fuzz/NAME, which `make fuzz` runs (scripts/fuzz.sh) on a copy
# of its seed corpus, fuzz/corpus/NAME. In a test build it becomes NAME_replay, a test that feeds
# every seed and every input in fuzz/regressions/NAME (crashes found before) through the same
# code, so that the ASan build catches a regression without clang.
function(larder_add_fuzzer name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  if(LARDER_FUZZ)
    add_executable(${name} ${ARG_SOURCES})
    larder_target_defaults(${name})
    target_link_libraries(${name} PRIVATE ${ARG_LIBS})
    target_link_options(${name} PRIVATE -fsanitize=fuzzer)
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin/fuzz)
    if(NOT TARGET larder-fuzzers)
      add_custom_target(larder-fuzzers)
    endif()
    add_dependencies(larder-fuzzers ${name})
  elseif(LARDER_BUILD_TESTS)
    add_executable(${name}_replay ${ARG_SOURCES} ${PROJECT_SOURCE_DIR}/fuzz/replay_main.cc)
    larder_target_defaults(${name}_replay)
    target_link_libraries(${name}_replay PRIVATE ${ARG_LIBS})
    add_test(NAME ${name}_replay
      COMMAND ${name}_replay ${PROJECT_SOURCE_DIR}/fuzz/corpus/${name}
              ${PROJECT_SOURCE_DIR}/fuzz/regressions/${name})
    set_tests_properties(${name}_replay PROPERTIES TIMEOUT 300
      ENVIRONMENT "LARDER_LOG_LEVEL=warn")
  endif()
endfunction()
