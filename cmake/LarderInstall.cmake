# Installation: `cmake --install` lays out the library, its headers, a CMake package
# (find_package(Larder) -> Larder::larder) and a pkg-config file (larder.pc), the binaries with
# systemd units, and the Python package; `make deb` packs them as Debian packages (CPack). The
# components: `library` (liblarder, headers, CMake and pkg-config files),
# `tools` (the binaries, the units and their settings files) and `python`.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# liblarder, for programs outside this tree: every object of the engine, the store client, the
# attach side of larder-client and the ground floor. Everything is compiled with hidden visibility
# (CMakeLists.txt), so the library exports what include/larder declares with LARDER_EXPORT and
# nothing else; targets in this tree link the static libraries themselves. Linking those libraries
# too brings their dependencies (gRPC, OpenSSL, ...) and nothing of theirs: the objects define it.
get_property(engine_objects GLOBAL PROPERTY LARDER_ENGINE_OBJECT_LIBRARIES)
set(larder_objects "")
foreach(library larder_transfer larder_client larder_standalone larder_common ${engine_objects})
  list(APPEND larder_objects $<TARGET_OBJECTS:${library}>)
endforeach()
add_library(larder_shared SHARED src/liblarder.cc ${larder_objects})
larder_target_defaults(larder_shared)
target_link_libraries(larder_shared PRIVATE larder_transfer larder_client larder_standalone larder_common)
# Versioned soname: liblarder.so.MAJOR.MINOR (an ABI may change between 0.x minors).
# The version script keeps the dynamic symbol table to the larder namespace: template code of the
# standard library instantiated inside (a deque's iterators, say) stays local, whichever compiler
# decided its visibility.
target_link_options(larder_shared PRIVATE
  -Wl,--version-script=${PROJECT_SOURCE_DIR}/src/liblarder.map)
set_target_properties(larder_shared PROPERTIES
  LINK_DEPENDS ${PROJECT_SOURCE_DIR}/src/liblarder.map
  OUTPUT_NAME larder
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
  INSTALL_RPATH "$ORIGIN")

install(TARGETS larder_shared
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT library)
install(DIRECTORY include/larder DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT library
  FILES_MATCHING PATTERN "*.h")

set(LARDER_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Larder)
configure_package_config_file(cmake/LarderConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/LarderConfig.cmake
  INSTALL_DESTINATION ${LARDER_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_LIBDIR)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/LarderConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/LarderConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/LarderConfigVersion.cmake
  DESTINATION ${LARDER_CMAKE_DIR} COMPONENT library)

# pkg-config: relocatable (the prefix is found from the .pc file's own place).
file(RELATIVE_PATH LARDER_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(cmake/larder.pc.in ${CMAKE_CURRENT_BINARY_DIR}/larder.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/larder.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT library)

# The binaries link Larder's code statically: they need no liblarder.
set(LARDER_INSTALLED_BINARIES larder-master larder-client larder-ctl larder-bench)
install(TARGETS ${LARDER_INSTALLED_BINARIES}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)

# systemd units and the settings files their EnvironmentFile= reads (/etc/default under /usr).
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(LARDER_DEFAULTS_DIR /etc/default)
else()
  set(LARDER_DEFAULTS_DIR ${CMAKE_INSTALL_SYSCONFDIR}/default)
endif()
foreach(unit larder-master larder-client)
  configure_file(packaging/systemd/${unit}.service.in
    ${CMAKE_CURRENT_BINARY_DIR}/packaging/${unit}.service @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/packaging/${unit}.service
    DESTINATION lib/systemd/system COMPONENT tools)
  install(FILES packaging/default/${unit} DESTINATION ${LARDER_DEFAULTS_DIR} COMPONENT tools)
endforeach()
# The Grafana dashboard and Prometheus alert rules for larder-master's /metrics.
install(FILES packaging/monitoring/larder-dashboard.json packaging/monitoring/larder-alerts.yml
  DESTINATION ${CMAKE_INSTALL_DATADIR}/larder/monitoring COMPONENT tools)

# The Python package, where Debian's python3 looks (/usr/lib/python3/dist-packages under /usr).
# The Mooncake shim (python/shim) is not installed: it would shadow a real Mooncake.
if(TARGET larder_python)
  set(LARDER_PYTHON_INSTALL_DIR lib/python3/dist-packages)
  install(TARGETS larder_python LIBRARY DESTINATION ${LARDER_PYTHON_INSTALL_DIR}/larder
    COMPONENT python)
  set_target_properties(larder_python PROPERTIES
    INSTALL_RPATH "$ORIGIN/../../../../${CMAKE_INSTALL_LIBDIR}")
  install(DIRECTORY python/larder DESTINATION ${LARDER_PYTHON_INSTALL_DIR} COMPONENT python
    FILES_MATCHING PATTERN "*.py" PATTERN "*.pyi" PATTERN "py.typed"
    PATTERN "__pycache__" EXCLUDE)
endif()

if(LARDER_BUILD_TESTS)
  # The installed tree used from outside this source tree: a CMake project (find_package) and a
  # pkg-config build of one small program, run against an installed larder-master.
  add_test(NAME install_test
    COMMAND ${PROJECT_SOURCE_DIR}/tests/install/install_test.sh ${CMAKE_BINARY_DIR}
            ${PROJECT_SOURCE_DIR}/tests/install/consumer)
  set_tests_properties(install_test PROPERTIES TIMEOUT 900 LABELS install)
  if(LARDER_SANITIZE)
    larder_sanitizer_runtimes(runtimes)
    set_tests_properties(install_test PROPERTIES ENVIRONMENT "LARDER_SANITIZER_RUNTIMES=${runtimes}")
  endif()
  if(TARGET larder_python)
    add_test(NAME pip_install_test
      COMMAND ${PROJECT_SOURCE_DIR}/tests/install/pip_test.sh ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR})
    # pip builds in the source tree (setup.cfg): never two at once.
    set_tests_properties(pip_install_test PROPERTIES TIMEOUT 900 LABELS install
      RESOURCE_LOCK pip_build)
    if(LARDER_SANITIZE)
      set_tests_properties(pip_install_test PROPERTIES
        ENVIRONMENT "LARDER_SANITIZER_RUNTIMES=${runtimes}")
    endif()
  endif()
endif()

# `make deb`: one Debian package per component (cpack -G DEB in a build configured with
# -DCMAKE_INSTALL_PREFIX=/usr).
set(CPACK_PACKAGE_NAME larder)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "Larder authors")
set(CPACK_PACKAGE_CONTACT "Larder maintainers <maintainers@larder.example>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Larder: a distributed KV-cache store for LLM serving")
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/packages)
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL library tools)
if(TARGET larder_python)
  list(APPEND CPACK_COMPONENTS_ALL python)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
# Dependencies on Debian's libraries (gRPC, protobuf, OpenSSL, ...) from the binaries' needs.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_LIBRARY_PACKAGE_NAME liblarder)
set(CPACK_DEBIAN_LIBRARY_PACKAGE_SECTION libs)
set(CPACK_COMPONENT_LIBRARY_DESCRIPTION
  "Larder's store client and transfer engine: shared library, headers, CMake package and pkg-config file")
set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME larder-tools)
set(CPACK_COMPONENT_TOOLS_DESCRIPTION
  "larder-master, larder-client, larder-ctl and larder-bench, with systemd units")
set(CPACK_DEBIAN_TOOLS_PACKAGE_CONTROL_EXTRA
  ${PROJECT_SOURCE_DIR}/packaging/debian/postinst ${PROJECT_SOURCE_DIR}/packaging/debian/postrm
  ${PROJECT_SOURCE_DIR}/packaging/debian/conffiles)
set(CPACK_DEBIAN_TOOLS_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-larder)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3, python3-numpy")
set(CPACK_COMPONENT_PYTHON_DESCRIPTION "The larder Python package (import larder)")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
