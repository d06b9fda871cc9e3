# Shared build settings for Larder's own targets.

# Warnings as errors and the project include roots, for targets built from our sources.
# Under clang, the lock annotations (src/common/mutex.h) are checked as the code compiles.
function(larder_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    target_compile_options(${target} PRIVATE -Wthread-safety)
  endif()
  # include/ is the libraries' interface; src/ is every target's own business (each one that
  # includes an internal header gets it here, not from a library it links).
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR}/include
                                       PRIVATE ${PROJECT_SOURCE_DIR}/src)
endfunction()

# larder_sanitizer_runtimes(VAR): the shared sanitizer runtimes, ":"-separated, that a program
# built without the sanitizers (python3) must preload to load code built with them: gcc's libasan
# and libubsan, or clang's ASan runtime (which holds UBSan's and the coverage callbacks too).
function(larder_sanitizer_runtimes var)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    set(names libclang_rt.asan-${CMAKE_SYSTEM_PROCESSOR}.so)
  else()
    set(names libasan.so libubsan.so)
  endif()
  set(paths "")
  foreach(name IN LISTS names)
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${name}
                    OUTPUT_VARIABLE path OUTPUT_STRIP_TRAILING_WHITESPACE)
    list(APPEND paths ${path})
  endforeach()
  string(JOIN ":" joined ${paths})
  set(${var} ${joined} PARENT_SCOPE)
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
# A fuzz target: sources that define LLVMFuzzerTestOneInput.
# - In a fuzz build (LARDER_FUZZ, clang) it becomes the libFuzzer binary bin/fuzz/NAME, which
#   `make fuzz` runs (scripts/fuzz.sh) on a copy of its seed corpus, fuzz/corpus/NAME. With tests,
#   two tests come with it: NAME_replay runs that binary over every seed and every input in
#   fuzz/regressions/NAME (crashes found before), and NAME_run fuzzes for
#   LARDER_TEST_FUZZ_SECONDS.
# - In a test build without LARDER_FUZZ (gcc, say) it becomes NAME_replay, a test that feeds the
#   same inputs through the same code with fuzz/replay_main.cc, so that a fixed crash stays fixed
#   without clang.
function(larder_add_fuzzer name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  set(inputs ${PROJECT_SOURCE_DIR}/fuzz/corpus/${name} ${PROJECT_SOURCE_DIR}/fuzz/regressions/${name})
  if(LARDER_FUZZ)
    add_executable(${name} ${ARG_SOURCES})
    larder_target_defaults(${name})
    target_link_libraries(${name} PRIVATE ${ARG_LIBS})
    # The static ASan runtime: libFuzzer's runtime would come before the shared one.
    target_link_options(${name} PRIVATE -fsanitize=fuzzer -static-libsan)
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin/fuzz)
    if(NOT TARGET larder-fuzzers)
      add_custom_target(larder-fuzzers)
    endif()
    add_dependencies(larder-fuzzers ${name})
    if(LARDER_BUILD_TESTS)
      add_test(NAME ${name}_replay
        COMMAND ${PROJECT_SOURCE_DIR}/scripts/fuzz.sh --replay $<TARGET_FILE:${name}> ${inputs})
      add_test(NAME ${name}_run
        COMMAND ${PROJECT_SOURCE_DIR}/scripts/fuzz.sh ${CMAKE_BINARY_DIR}
                ${LARDER_TEST_FUZZ_SECONDS} 0 ${name})
      set_tests_properties(${name}_replay ${name}_run PROPERTIES TIMEOUT 300 LABELS fuzz
        ENVIRONMENT "LARDER_LOG_LEVEL=warn")
    endif()
  elseif(LARDER_BUILD_TESTS)
    add_executable(${name}_replay ${ARG_SOURCES} ${PROJECT_SOURCE_DIR}/fuzz/replay_main.cc)
    larder_target_defaults(${name}_replay)
    target_link_libraries(${name}_replay PRIVATE ${ARG_LIBS})
    add_test(NAME ${name}_replay COMMAND ${name}_replay ${inputs})
    set_tests_properties(${name}_replay PROPERTIES TIMEOUT 300 LABELS fuzz
      ENVIRONMENT "LARDER_LOG_LEVEL=warn")
  endif()
endfunction()
